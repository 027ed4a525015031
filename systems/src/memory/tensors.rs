//! The tensors of one chunk, derived from the model's operators, and the KV cache.
//!
//! A chunk's stages form a chain. Each operator's output is *exported* when an operator
//! of a later stage reads it (the hand-off to the next stage, and the residual stream,
//! which skips stages); it is then an activation tensor live from its producer's start
//! to its last consumer's end. Outputs read only inside their own stage are the stage's
//! *workspace*, one buffer per operator as QNN allocates them (seed 000, section 4.5),
//! live while the stage runs.
//!
//! Regions: every processor has one. A tensor that an NPU produces or reads lives in
//! that NPU's region ([`crate::ProcessorKind::hosts_tensors_it_touches`]): the NPU can
//! only address its window (4 GiB on the Hexagon), and the CPU maps the same buffer,
//! zero-copy, as the peer does with shared (rpcmem) buffers. Every other tensor lives in
//! its producer's region. The KV cache is read and written only by the float processor
//! (attention), so it lives there.

use serde::Serialize;

use crate::model::{ExecClass, ModelConfig, OpDecl, OpKind};
use crate::plan::{InstanceKey, PlanLayout};

/// What a tensor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorKind {
    /// Output of a stage read by later stages of the same chunk.
    Activation,
    /// Buffers a stage uses only while it runs (outputs read inside the stage only).
    Workspace,
}

/// One tensor of a chunk's chain, the same for every chunk (its graphs have one length).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorTemplate {
    /// Producing stage.
    pub producer: u32,
    /// Stages that read it, ascending, all after `producer` (empty for a workspace).
    pub consumers: Vec<u32>,
    /// Size in bytes.
    pub bytes: u64,
    /// Region (processor lane) it is allocated in.
    pub region: usize,
    /// Activation or workspace.
    pub kind: TensorKind,
}

impl TensorTemplate {
    /// The last stage that reads this tensor in chunk `chunk`, or `None` when no reader
    /// exists for that chunk (the model head runs for the last chunk only): the tensor
    /// then dies with its producer.
    pub fn last_consumer(&self, layout: &PlanLayout, chunk: u32) -> Option<u32> {
        self.consumers
            .iter()
            .rev()
            .copied()
            .find(|&stage| layout.exists(InstanceKey { chunk, stage }))
    }

    /// The stage after whose completion the tensor is freed in chunk `chunk`.
    pub fn last_use(&self, layout: &PlanLayout, chunk: u32) -> u32 {
        self.last_consumer(layout, chunk).unwrap_or(self.producer)
    }
}

/// Bytes per token of an operator's output, and whether the output has one row only
/// (the LM head's logits). Saturating: absurd shapes give `u64::MAX`, which no budget
/// holds, so the plan is refused instead of overflowing.
pub(super) fn output_row(op: &OpDecl, model: &ModelConfig) -> (u64, bool) {
    let float = model.float_precision.bytes();
    let act = model.activation_precision.bytes();
    let hidden = u64::from(model.hidden);
    let hd = u64::from(model.head_dim());
    let width = |default: u64| op.out_features.map_or(default, u64::from);
    let (count, bytes, single) = match op.kind {
        OpKind::Embed | OpKind::ResidualAdd => (hidden, float, false),
        // A norm of the residual stream or a block's output is hidden wide, one of the
        // query and key heads (QK-norm) says its width.
        OpKind::RmsNorm | OpKind::Elementwise => (width(hidden), float, false),
        OpKind::Quantize => (width(hidden), act, false),
        OpKind::Dequantize => (width(hidden), float, false),
        // INT32 accumulators (or FP32), as the cost model counts them.
        OpKind::Linear => (width(hidden), 4, false),
        // Queries and keys rotated; values pass through.
        OpKind::Rope => (
            (u64::from(model.heads) + u64::from(model.kv_heads)).saturating_mul(hd),
            float,
            false,
        ),
        // Every query head's output, or a part's heads (split attention).
        OpKind::Attention => (
            u64::from(op.heads.map_or(model.heads, |r| r.count)).saturating_mul(hd),
            float,
            false,
        ),
        OpKind::SiluMul => {
            let bytes = if op.class() == ExecClass::Int8 {
                act
            } else {
                float
            };
            (u64::from(model.ffn), bytes, false)
        }
        OpKind::LmHead => (u64::from(model.vocab), 4, true),
        // The shadow's dense float result, added at the merge.
        OpKind::Shadow => (width(hidden), 4, false),
    };
    (count.saturating_mul(bytes), single)
}

/// Bytes of an operator's output for chunks of `tokens` tokens.
pub(super) fn output_bytes(op: &OpDecl, model: &ModelConfig, tokens: u64) -> u64 {
    let (row, single) = output_row(op, model);
    row.saturating_mul(if single { 1 } else { tokens })
}

/// The operators of a chunk's chain with the ops each reads (indexes into the chain).
///
/// Named inputs resolve to the nearest earlier operator of that name in the same layer;
/// an operator without inputs reads the one before it in the chain, and when that is an
/// outlier shadow, also the linear the shadow sits beside (the one before it: the next
/// layer's carry merges down's shadow); a residual add also reads the residual stream
/// (the latest embed or residual add).
fn chain_inputs<'a>(layout: &PlanLayout<'a>) -> Vec<(u32, &'a OpDecl, Vec<usize>)> {
    let mut chain: Vec<(u32, Option<u32>, &OpDecl, Vec<usize>)> = Vec::new();
    let mut stream: Option<usize> = None;
    for (stage, template) in layout.stages.iter().enumerate() {
        for op in &template.ops {
            let i = chain.len();
            let mut inputs: Vec<usize> = Vec::new();
            if op.kind != OpKind::Embed {
                if op.inputs.is_empty() {
                    inputs.extend(i.checked_sub(1));
                    if let Some(before) = i.checked_sub(1)
                        && chain[before].2.kind == OpKind::Shadow
                    {
                        inputs.extend(before.checked_sub(1));
                    }
                } else {
                    for name in &op.inputs {
                        let found = chain.iter().rposition(|(_, layer, other, _)| {
                            *layer == template.layer && other.name == *name
                        });
                        inputs.extend(found);
                    }
                }
                if op.kind == OpKind::ResidualAdd
                    && let Some(s) = stream
                    && !inputs.contains(&s)
                {
                    inputs.push(s);
                }
            }
            if matches!(op.kind, OpKind::Embed | OpKind::ResidualAdd) {
                stream = Some(i);
            }
            chain.push((stage as u32, template.layer, op, inputs));
        }
    }
    chain
        .into_iter()
        .map(|(stage, _, op, inputs)| (stage, op, inputs))
        .collect()
}

/// The tensors of one chunk's chain: exported activations and one workspace per stage
/// (only where the stage has internal outputs), for graphs of the `layout`'s chunk length.
pub fn chunk_tensors(layout: &PlanLayout) -> Vec<TensorTemplate> {
    let chain = chain_inputs(layout);
    let mut readers: Vec<Vec<u32>> = vec![Vec::new(); chain.len()];
    for (stage, _, inputs) in &chain {
        for &i in inputs {
            readers[i].push(*stage);
        }
    }
    let tokens = u64::from(layout.workload.chunk_len);
    let lane = |stage: u32| layout.processor(InstanceKey { chunk: 0, stage });
    let hosts = |lane: usize| {
        layout.device.processors[lane]
            .kind
            .hosts_tensors_it_touches()
    };
    let mut workspace = vec![0u64; layout.stages.len()];
    let mut tensors = Vec::new();
    for (i, (stage, op, _)) in chain.iter().enumerate() {
        let bytes = output_bytes(op, layout.model, tokens);
        let mut consumers: Vec<u32> = readers[i].iter().copied().filter(|s| s != stage).collect();
        consumers.sort_unstable();
        consumers.dedup();
        if consumers.is_empty() {
            let w = &mut workspace[*stage as usize];
            *w = w.saturating_add(bytes);
            continue;
        }
        let producer_lane = lane(*stage);
        let region = std::iter::once(producer_lane)
            .chain(consumers.iter().map(|&s| lane(s)))
            .find(|&l| hosts(l))
            .unwrap_or(producer_lane);
        tensors.push(TensorTemplate {
            producer: *stage,
            consumers,
            bytes,
            region,
            kind: TensorKind::Activation,
        });
    }
    for (stage, bytes) in workspace.into_iter().enumerate() {
        if bytes > 0 {
            tensors.push(TensorTemplate {
                producer: stage as u32,
                consumers: Vec::new(),
                bytes,
                region: lane(stage as u32),
                kind: TensorKind::Workspace,
            });
        }
    }
    tensors.sort_by_key(|t| (t.producer, t.kind == TensorKind::Workspace));
    tensors
}

/// The KV cache, preallocated for the whole prompt (seed 003, section 2.3): one buffer
/// per layer holding K then V, each `kv_heads x head_dim x prompt_len` elements of the
/// float precision. Chunk `i` writes its rows in place at [`KvCache::write_offset`]; no
/// K or V tensor is ever copied between stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KvCache {
    /// Layers (one buffer each).
    pub layers: u32,
    /// Bytes of one layer's buffer (K and V).
    pub bytes_per_layer: u64,
    /// Bytes one token adds to K (and as many to V) in one layer.
    pub bytes_per_token: u64,
    /// Region (the float processor's lane).
    pub region: usize,
}

impl KvCache {
    /// The KV cache of a plan's `layout`.
    pub fn of(layout: &PlanLayout) -> KvCache {
        let m = layout.model;
        let bytes_per_token = u64::from(m.kv_heads)
            .saturating_mul(u64::from(m.head_dim()))
            .saturating_mul(m.float_precision.bytes());
        let attention_stage = layout
            .stages
            .iter()
            .position(|s| s.ops.iter().any(|op| op.kind == OpKind::Attention));
        let layers = if attention_stage.is_some() {
            m.layers
        } else {
            0
        };
        let region = attention_stage.map_or(0, |s| layout.stage_processor[s]);
        KvCache {
            layers,
            bytes_per_layer: bytes_per_token
                .saturating_mul(2)
                .saturating_mul(u64::from(layout.workload.prompt_len)),
            bytes_per_token,
            region,
        }
    }

    /// Total bytes (every layer).
    pub fn bytes(&self) -> u64 {
        u64::from(self.layers).saturating_mul(self.bytes_per_layer)
    }

    /// Offsets of chunk `chunk`'s K and V rows inside a layer's buffer, for chunks of
    /// `chunk_len` tokens: K at `chunk * chunk_len` rows, V in the second half.
    pub fn write_offset(&self, chunk: u32, chunk_len: u32) -> (u64, u64) {
        let k = u64::from(chunk)
            .saturating_mul(u64::from(chunk_len))
            .saturating_mul(self.bytes_per_token);
        (k, self.bytes_per_layer / 2 + k)
    }
}
