//! Chunk-sharing accounting (seed 000, section 3.2): the memory of pre-built graphs when
//! every chunk owns its own copy of every subgraph, against chunk-sharing graphs where a
//! static subgraph is built once and only dynamic ones (attention) are per chunk.
//!
//! A subgraph's memory is its weights plus one activation buffer per operator (QNN
//! allocates them so; seed 000, section 4.5), sized as the scheduler's tensors are. The model head runs for the last chunk
//! only, so both ways hold one copy of it.

use serde::Serialize;

use super::tensors::output_bytes;
use crate::graph::Sharing;
use crate::model::OpDecl;
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
    let tokens = u64::from(plan.workload.chunk_len);
    let (mut weights, mut activations) = (0u64, 0u64);
    let (mut statics, mut dynamics, mut head) = (0u64, 0u64, 0u64);
    for stage in &plan.stages {
        // Saturating throughout: absurd shapes give u64::MAX, never an overflow.
        let sum =
            |f: &dyn Fn(&OpDecl) -> u64| stage.ops.iter().map(f).fold(0u64, u64::saturating_add);
        let w = sum(&|op| op.weight_bytes(&plan.model));
        let b = sum(&|op| output_bytes(op, &plan.model, tokens));
        weights = weights.saturating_add(w);
        activations = activations.saturating_add(b);
        let part = match (stage.last_chunk_only, stage.sharing) {
            (true, _) => &mut head,
            (false, Sharing::Static) => &mut statics,
            (false, Sharing::Dynamic) => &mut dynamics,
        };
        *part = part.saturating_add(w.saturating_add(b));
    }
    let per_chunk = chunks
        .saturating_mul(statics.saturating_add(dynamics))
        .saturating_add(head);
    let sharing = statics
        .saturating_add(chunks.saturating_mul(dynamics))
        .saturating_add(head);
    let saved = per_chunk.saturating_sub(sharing);
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
