//! A resident prefill's device state: each chunk's activation buffers (in an arena where
//! the memory planner found a layout) with the checks that every read follows its write,
//! and the per-layer KV caches.

use std::sync::Arc;

use hetsched_gpu::{Elem, GpuContext, GpuMatrix};
use hetsched_import::LlamaConfig;
use hetsched_systems::op::{NormSite, Projection};

use super::family::{FamilyScratch, local_angles};
use super::gpu_err;
use crate::ActivationBytes;
use crate::error::ExecError;
use crate::gpu_layout::{Field, plan_chunk_layout};
use crate::steps::Step;

/// A chunk's value in device memory, for the checks that every read follows its write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value {
    Normed,
    Q,
    O,
    Gate,
    Up,
    Down,
    Attn,
    Hidden,
}

impl Value {
    pub(super) fn name(self) -> &'static str {
        match self {
            Value::Normed => "normed",
            Value::Q => Projection::Q.label(),
            Value::O => Projection::O.label(),
            Value::Gate => Projection::Gate.label(),
            Value::Up => Projection::Up.label(),
            Value::Down => Projection::Down.label(),
            Value::Attn => "attention",
            Value::Hidden => "silu_mul",
        }
    }

    pub(super) fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// One chunk's resident activations (allocated once per prefill, reused by every layer).
/// With the fused GEMMs only the residual stream, q, the attention output and the SiLU
/// output live in chunk buffers; keys and values go straight into the cache.
pub(super) struct ChunkTensors {
    pub(super) pos0: usize,
    pub(super) rows: usize,
    pub(super) x: GpuMatrix,
    pub(super) q: GpuMatrix,
    pub(super) attn: GpuMatrix,
    pub(super) hidden: GpuMatrix,
    /// The last token's residual (the head of a prefill reads one token).
    pub(super) last: GpuMatrix,
    /// RoPE rotations of the chunk's positions, `[rows, head_dim]`.
    pub(super) angles: GpuMatrix,
    /// Their local layers' twin, where the family's local base differs (Gemma 3).
    pub(super) angles_local: Option<GpuMatrix>,
    /// The buffers of the family's steps (none for llama).
    pub(super) family: FamilyScratch,
    /// A block's output sits in the family's delta buffer, not yet normalized and added
    /// into the stream (its post-norm step does both).
    pub(super) unnormed: bool,
    /// Values written and not yet consumed.
    pub(super) ready: u16,
    /// Input of the next projections.
    pub(super) act: Option<Value>,
    /// The projection whose output the next residual step accounts for (its GEMM already
    /// added it into the stream).
    pub(super) delta: Option<Value>,
    /// The norm the next projections fold in (their weights carry its scale).
    pub(super) norm: Option<NormSite>,
    /// Projections of the current fused group seen so far (bits by [`Projection::index`]).
    pub(super) pending: u8,
    /// The attention dispatch already added the output projection into the stream
    /// ([`hetsched_gpu::GpuBatch::attention_into_residual`]): the o step records nothing.
    pub(super) o_fused: bool,
}

impl ChunkTensors {
    /// `v` was written and not yet consumed, or the error naming `step`'s broken dependency.
    pub(super) fn require(&self, v: Value, step: Step, chunk: usize) -> Result<(), ExecError> {
        if self.ready & v.bit() == 0 {
            return Err(ExecError::missing(step, chunk, v.name()));
        }
        Ok(())
    }

    /// The RoPE table of layer `layer` of a model with `c`'s family.
    pub(super) fn angles_of(&self, c: &LlamaConfig, layer: usize) -> &GpuMatrix {
        match &self.angles_local {
            Some(local) if c.family.is_local(layer) => local,
            _ => &self.angles,
        }
    }

    /// Consumes `v`: it must have been written (see [`Self::require`]) and is then spent.
    pub(super) fn take(&mut self, v: Value, step: Step, chunk: usize) -> Result<(), ExecError> {
        self.require(v, step, chunk)?;
        self.ready &= !v.bit();
        Ok(())
    }
}

/// A chunk's rows of one layer's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) enum KvRows {
    #[default]
    Missing,
    /// Rotated and written by the chunk's fused q/k/v GEMM.
    Written,
}

/// Everything a resident prefill writes on the device.
pub(super) struct RunState {
    pub(super) chunks: Vec<ChunkTensors>,
    /// Per layer: `[prompt, kv_dim]` keys (rotated) and values.
    pub(super) caches: Vec<(GpuMatrix, GpuMatrix)>,
    /// Per layer, per chunk.
    pub(super) kv: Vec<Vec<KvRows>>,
    /// `[rows, vocab]` logits of the head.
    pub(super) logits: GpuMatrix,
    /// One flag per (chunk, layer, block), raised by the checked residual add when the
    /// block's output made the stream non-finite ([`NonFiniteFlags`]).
    pub(super) nonfinite: GpuMatrix,
    /// The lane thread that records (see [`OPEN`]).
    pub(super) recorder: Option<std::thread::ThreadId>,
}

/// Columns of a chunk value of a model with `c`'s shapes.
fn field_cols(c: &LlamaConfig, f: Field) -> usize {
    match f {
        Field::X | Field::Normed | Field::O | Field::Down => c.hidden,
        Field::Q | Field::Attn => c.n_heads * c.head_dim,
        Field::K | Field::V => c.kv_dim(),
        Field::Gate | Field::Up | Field::Hidden => c.ffn,
    }
}

/// A chunk's value buffers: in one arena at the offsets the memory planner chose
/// ([`plan_chunk_layout`]), or, where no safe plan exists or the arena would pass one
/// binding's range, one zero-filled buffer each.
fn chunk_fields(
    ctx: &Arc<GpuContext>,
    c: &LlamaConfig,
    rows: usize,
    steps: &[Vec<Step>],
    layers: &[Option<u32>],
    bytes: &mut ActivationBytes,
) -> Result<Vec<Option<GpuMatrix>>, ExecError> {
    let mut sizes = [0u64; Field::ALL.len()];
    for f in Field::ALL.into_iter().filter(|f| f.used()) {
        sizes[f.index()] = (rows * Elem::F32.ld(field_cols(c, f)) * 4) as u64;
    }
    let unpadded = Field::ALL
        .iter()
        .filter(|f| f.used())
        .all(|&f| Elem::F32.ld(field_cols(c, f)) == field_cols(c, f));
    let alignment = ctx.info().storage_offset_alignment.max(4);
    let layout = unpadded
        .then(|| plan_chunk_layout(steps, layers, &sizes, alignment))
        .flatten();
    let arena = layout
        .as_ref()
        .and_then(|l| ctx.alloc_arena(l.arena_bytes).ok().map(|a| (l, a)));
    bytes.separate += sizes.iter().sum::<u64>();
    bytes.chunks += 1;
    let fields = match arena {
        Some((layout, arena)) => {
            bytes.allocated += arena.bytes();
            bytes.chunks_in_arena += 1;
            Field::ALL
                .iter()
                .map(|&f| {
                    let at = layout.offsets[f.index()];
                    f.used()
                        .then(|| arena.matrix(at, rows, field_cols(c, f), Elem::F32))
                        .transpose()
                })
                .collect::<Result<_, _>>()
        }
        None => {
            bytes.allocated += sizes.iter().sum::<u64>();
            Field::ALL
                .iter()
                .map(|&f| {
                    f.used()
                        .then(|| ctx.alloc_matrix(rows, field_cols(c, f), Elem::F32))
                        .transpose()
                })
                .collect::<Result<_, _>>()
        }
    };
    fields.map_err(gpu_err)
}

/// A zero-filled `[rows, cols]` f32 matrix.
fn alloc(ctx: &GpuContext, rows: usize, cols: usize) -> Result<GpuMatrix, ExecError> {
    ctx.alloc_matrix(rows, cols, Elem::F32).map_err(gpu_err)
}

impl ChunkTensors {
    /// Allocates the buffers of the chunk of `rows` tokens from `pos0` (see
    /// [`chunk_fields`]) and uploads its RoPE angles; nothing is written yet.
    pub(super) fn alloc(
        ctx: &Arc<GpuContext>,
        c: &LlamaConfig,
        (pos0, rows): (usize, usize),
        (steps, layers): (&[Vec<Step>], &[Option<u32>]),
        bytes: &mut ActivationBytes,
    ) -> Result<Self, ExecError> {
        let positions: Vec<usize> = (pos0..pos0 + rows).collect();
        let mut fields = chunk_fields(ctx, c, rows, steps, layers, bytes)?;
        let mut take = |f: Field| {
            fields[f.index()]
                .take()
                .ok_or_else(|| ExecError::Kernel(format!("no buffer for {f:?}")))
        };
        Ok(ChunkTensors {
            pos0,
            rows,
            x: take(Field::X)?,
            q: take(Field::Q)?,
            attn: take(Field::Attn)?,
            hidden: take(Field::Hidden)?,
            last: alloc(ctx, 1, c.hidden)?,
            angles: ctx
                .rope_angles(&positions, c.head_dim, c.rope_base)
                .map_err(gpu_err)?,
            angles_local: local_angles(ctx, c, &positions)?,
            family: FamilyScratch::alloc(ctx, c, rows)?,
            unnormed: false,
            ready: 0,
            act: None,
            delta: None,
            norm: None,
            pending: 0,
            o_fused: false,
        })
    }
}

/// Per layer: a `[positions, kv_dim]` key cache (rotated) and value cache, zero-filled.
pub(super) fn alloc_caches(
    ctx: &GpuContext,
    c: &LlamaConfig,
    n_layers: usize,
    positions: usize,
) -> Result<Vec<(GpuMatrix, GpuMatrix)>, ExecError> {
    (0..n_layers)
        .map(|_| {
            Ok((
                alloc(ctx, positions, c.kv_dim())?,
                alloc(ctx, positions, c.kv_dim())?,
            ))
        })
        .collect()
}

impl RunState {
    /// Around `chunks` and `caches` (one key and value cache per layer, with a row for
    /// every position the run writes): the logits (every row of the last chunk with
    /// `all_logits`, else the last token's) and the non-finite flags.
    pub(super) fn alloc(
        ctx: &GpuContext,
        n_layers: usize,
        chunks: Vec<ChunkTensors>,
        caches: Vec<(GpuMatrix, GpuMatrix)>,
        (vocab, all_logits): (usize, bool),
    ) -> Result<Self, ExecError> {
        let head_rows = match (all_logits, chunks.last()) {
            (true, Some(last)) => last.rows,
            _ => 1,
        };
        Ok(RunState {
            kv: vec![vec![KvRows::Missing; chunks.len()]; n_layers],
            logits: alloc(ctx, head_rows, vocab)?,
            nonfinite: alloc(
                ctx,
                NonFiniteFlags::rows(chunks.len(), n_layers),
                NonFiniteFlags::COLS,
            )?,
            chunks,
            caches,
            recorder: None,
        })
    }
}

/// Where the checked residual adds of a run raise their flags: one f32 per (chunk, layer,
/// block), in that order, so the first raised flag names where the numbers first broke.
#[derive(Clone, Copy, Debug)]
pub(super) struct NonFiniteFlags {
    pub(super) layers: usize,
}

impl NonFiniteFlags {
    /// Columns of the flags matrix (a dense f32 matrix needs a multiple of 4).
    pub(super) const COLS: usize = 4;
    /// The blocks whose outputs join the residual stream, in layer order.
    pub(super) const BLOCKS: [&'static str; 2] = ["attention", "feed-forward"];

    /// Rows of the flags matrix for `chunks` x `layers` x 2 flags.
    pub(super) fn rows(chunks: usize, layers: usize) -> usize {
        (chunks * layers * Self::BLOCKS.len())
            .div_ceil(Self::COLS)
            .max(1)
    }

    /// The flag of `block` (0: attention, 1: feed-forward) of `layer` in `chunk`.
    pub(super) fn slot(self, chunk: usize, layer: usize, block: usize) -> usize {
        (chunk * self.layers + layer) * Self::BLOCKS.len() + block
    }

    /// The first raised flag, as (chunk, layer, block name).
    pub(super) fn first_raised(self, flags: &[f32]) -> Option<(usize, usize, &'static str)> {
        Some(self.locate(flags.iter().position(|&f| f != 0.0)?))
    }

    /// Flag `slot`'s (chunk, layer, block name): [`Self::slot`] undone.
    pub(super) fn locate(self, slot: usize) -> (usize, usize, &'static str) {
        let blocks = Self::BLOCKS.len();
        let (cell, block) = (slot / blocks, slot % blocks);
        (
            cell / self.layers.max(1),
            cell % self.layers.max(1),
            Self::BLOCKS[block],
        )
    }
}
