//! Chunk-sharing accounting (seed 000, section 3.2): the memory of pre-built graphs when
//! every chunk owns its own copy of every subgraph, against chunk-sharing graphs where a
//! static subgraph is built once and only dynamic ones (attention) are per chunk.
//!
//! A subgraph's memory is its weights plus one activation buffer per operator (QNN
//! allocates them so; seed 000, section 4.5). The model head runs for the last chunk
//! only, so both ways hold one copy of it.

use serde::Serialize;

use crate::graph::Sharing;
use crate::model::{OpDecl, OpKind};
use crate::plan::PrefillPlan;

/// Graph memory of one prefill, per-chunk graphs against chunk-sharing graphs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ChunkSharing {
    /// Chunks (graph copies a naive system builds).
    pub chunks: u32,
    /// Weights of one copy of the model's subgraphs, bytes.
    pub weights_bytes: u64,
    /// Activation buffers of one copy of the model's subgraphs, bytes.
    pub activation_bytes: u64,
    /// One copy of the static (shareable) per-chunk subgraphs: weights and buffers, bytes.
    pub static_bytes: u64,
    /// One copy of the dynamic (per-chunk) subgraphs: weights and buffers, bytes.
    pub dynamic_bytes: u64,
    /// The model head (last chunk only), bytes.
    pub head_bytes: u64,
    /// Every chunk owns each subgraph: weights and buffers, bytes.
    pub per_chunk_graphs_bytes: u64,
    /// Static subgraphs once, dynamic ones per chunk, bytes.
    pub chunk_sharing_bytes: u64,
    /// `per_chunk_graphs_bytes - chunk_sharing_bytes`.
    pub saved_bytes: u64,
    /// `saved_bytes / per_chunk_graphs_bytes`; at most `(chunks - 1) / chunks`.
    pub saving: f64,
}

fn weight_bytes(op: &OpDecl, plan: &PrefillPlan) -> u64 {
    let m = &plan.model;
    let w = m.weight_precision.bytes();
    let hidden = u64::from(m.hidden);
    match op.kind {
        OpKind::Linear => {
            u64::from(op.in_features.unwrap_or(m.hidden))
                * u64::from(op.out_features.unwrap_or(m.hidden))
                * w
        }
        OpKind::Embed | OpKind::LmHead => u64::from(m.vocab) * hidden * w,
        _ => 0,
    }
}

/// Per-operator activation buffer bytes of one stage of `plan`'s chunk length.
fn buffer_bytes(ops: &[OpDecl], plan: &PrefillPlan) -> u64 {
    let m = &plan.model;
    let c = u64::from(plan.workload.chunk_len);
    let (f, a) = (m.float_precision.bytes(), m.activation_precision.bytes());
    let hd = u64::from(m.head_dim());
    let width = |op: &OpDecl| u64::from(op.out_features.unwrap_or(m.hidden));
    ops.iter()
        .map(|op| match op.kind {
            OpKind::Embed | OpKind::ResidualAdd | OpKind::RmsNorm => c * u64::from(m.hidden) * f,
            OpKind::Quantize => c * width(op) * a,
            OpKind::Dequantize => c * width(op) * f,
            OpKind::Linear => c * width(op) * 4,
            OpKind::Rope => c * u64::from(m.heads + m.kv_heads) * hd * f,
            OpKind::Attention => c * u64::from(m.heads) * hd * f,
            OpKind::SiluMul => c * u64::from(m.ffn) * a,
            OpKind::LmHead => u64::from(m.vocab) * 4,
        })
        .sum()
}

/// The chunk-sharing accounting of `plan`.
///
/// # Examples
/// ```
/// use hetsched_systems::memory::chunk_sharing;
/// let plan = hetsched_systems::testing::tiny_plan(2, 256, 64);
/// let s = chunk_sharing(&plan);
/// assert_eq!(s.chunks, 4);
/// assert!(s.saving > 0.0 && s.saving <= 0.75);
/// assert_eq!(s.saved_bytes, s.per_chunk_graphs_bytes - s.chunk_sharing_bytes);
/// ```
pub fn chunk_sharing(plan: &PrefillPlan) -> ChunkSharing {
    let chunks = u64::from(plan.chunks);
    let (mut weights, mut activations) = (0u64, 0u64);
    let (mut statics, mut dynamics, mut head) = (0u64, 0u64, 0u64);
    for stage in &plan.stages {
        let w: u64 = stage.ops.iter().map(|op| weight_bytes(op, plan)).sum();
        let b = buffer_bytes(&stage.ops, plan);
        weights += w;
        activations += b;
        match (stage.last_chunk_only, stage.sharing) {
            (true, _) => head += w + b,
            (false, Sharing::Static) => statics += w + b,
            (false, Sharing::Dynamic) => dynamics += w + b,
        }
    }
    let per_chunk = chunks * (statics + dynamics) + head;
    let sharing = statics + chunks * dynamics + head;
    let saved = per_chunk - sharing;
    ChunkSharing {
        chunks: plan.chunks,
        weights_bytes: weights,
        activation_bytes: activations,
        static_bytes: statics,
        dynamic_bytes: dynamics,
        head_bytes: head,
        per_chunk_graphs_bytes: per_chunk,
        chunk_sharing_bytes: sharing,
        saved_bytes: saved,
        saving: if per_chunk == 0 {
            0.0
        } else {
            saved as f64 / per_chunk as f64
        },
    }
}
