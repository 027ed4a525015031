//! Where a resident GPU prefill keeps a chunk's activations: one device arena per chunk,
//! each value at the offset the memory planner
//! ([`hetsched_systems::memory::plan_offsets`]) gives it from the value's lifetime inside
//! a decoder layer, so values that are never live together share bytes (the FFN's gate, up
//! and SiLU output reuse the attention block's q, k, v and output).
//!
//! Lifetimes come from the compiled steps themselves: within each layer's run of stages a
//! value lives from its first to its last access. A value read before it is written in
//! some layer (the residual stream, the down projection the next layer's carry adds) lives
//! across layers and never shares. The plan is then checked against every layer and the
//! head: two values may overlap in bytes only if no window uses them at the same time; if
//! the check fails the caller gives every value its own buffer.

use std::convert::Infallible;

use hetsched_systems::memory::{Buffer, plan_offsets};
use hetsched_systems::op::{Block, NormSite, Projection};
use hetsched_systems::shadow::ShadowSite;

use super::steps::Step;
use super::walk::{self, StepBackend};
use Field::{Attn, Hidden, Q, X};

/// A per-chunk activation of the resident runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Field {
    /// The residual stream.
    X,
    /// RMSNorm output (input of q/k/v and of gate/up).
    Normed,
    Q,
    K,
    V,
    /// Attention output.
    Attn,
    /// Output projection.
    O,
    Gate,
    Up,
    /// SiLU(gate) * up.
    Hidden,
    /// Down projection.
    Down,
}

impl Field {
    pub(super) const ALL: [Field; 11] = [
        Field::X,
        Field::Normed,
        Field::Q,
        Field::K,
        Field::V,
        Field::Attn,
        Field::O,
        Field::Gate,
        Field::Up,
        Field::Hidden,
        Field::Down,
    ];

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// Whether the fused runner keeps this field (see [`Window`]'s [`StepBackend`]).
    pub(super) fn used(self) -> bool {
        matches!(self, Field::X | Field::Q | Field::Attn | Field::Hidden)
    }
}

/// How fields are used in one window (a layer's stages, or the head's).
struct Window {
    /// Per field: `[first, last + 1)` step positions, if accessed.
    hull: [Option<(u64, u64)>; Field::ALL.len()],
    /// Per field: its first access is a read (its value comes from an earlier window).
    carried: [bool; Field::ALL.len()],
    steps: u64,
}

impl Window {
    /// Counts the accesses of the window's `steps`, in order: while a step runs,
    /// `steps` is its position.
    fn of(steps: &[Step]) -> Window {
        let mut w = Window {
            hull: [None; Field::ALL.len()],
            carried: [false; Field::ALL.len()],
            steps: 0,
        };
        for &step in steps {
            let Ok(()) = walk::step(step, &mut w);
            w.steps += 1;
        }
        w
    }

    /// The step at position `self.steps` reads `reads` and writes `writes`.
    fn access(&mut self, reads: &[Field], writes: &[Field]) -> Result<(), Infallible> {
        let i = self.steps;
        for (f, read) in reads
            .iter()
            .map(|f| (f, true))
            .chain(writes.iter().map(|f| (f, false)))
        {
            let hull = &mut self.hull[f.index()];
            if hull.is_none() {
                self.carried[f.index()] = read;
            }
            *hull = Some(hull.map_or((i, i + 1), |(a, b)| (a.min(i), b.max(i + 1))));
        }
        Ok(())
    }
}

/// What each step reads and writes among the fields, as the resident runner's recorder
/// (`gpu_resident/record.rs`) runs it with the fused GEMMs: the norms are folded into the
/// projections that read the residual stream, q/k/v (one dispatch at the last of them)
/// write q and the KV cache, gate/up (one dispatch) the SiLU output, and the output and
/// down projections add into the stream. The fields the fusion leaves unused (the norm's
/// output, k, v, o, gate, up, down) are never accessed. A fused dispatch's write is
/// counted from the first of its steps.
impl StepBackend for Window {
    type Error = Infallible;

    fn embed(&mut self) -> Result<(), Infallible> {
        self.access(&[], &[X])
    }
    /// Reads the stream its projections normalise.
    fn norm(&mut self, _: NormSite) -> Result<(), Infallible> {
        self.access(&[X], &[])
    }
    /// Touches nothing: f32 linears read the stream as it is.
    fn quantize_normed(&mut self, _: ShadowSite) -> Result<(), Infallible> {
        Ok(())
    }
    fn quantize_attention(&mut self) -> Result<(), Infallible> {
        self.access(&[Attn], &[])
    }
    fn linear(&mut self, p: Projection) -> Result<(), Infallible> {
        match p {
            Projection::Q | Projection::K | Projection::V => self.access(&[X], &[Q]),
            Projection::Gate | Projection::Up => self.access(&[X], &[Hidden]),
            Projection::O => self.access(&[Attn, X], &[X]),
            Projection::Down => self.access(&[Hidden, X], &[X]),
        }
    }
    fn dequantize_qkv(&mut self) -> Result<(), Infallible> {
        self.access(&[Q], &[])
    }
    fn rope(&mut self) -> Result<(), Infallible> {
        self.access(&[Q], &[Q])
    }
    fn attention(&mut self) -> Result<(), Infallible> {
        self.access(&[Q], &[Attn])
    }
    /// Touches nothing: the output projection's GEMM added into the stream.
    fn dequantize_o(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
    /// Touches nothing: the down projection's GEMM added into the stream.
    fn dequantize_down(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
    fn residual(&mut self) -> Result<(), Infallible> {
        self.access(&[X], &[X])
    }
    fn silu_mul(&mut self) -> Result<(), Infallible> {
        self.access(&[Hidden], &[Hidden])
    }
    /// Touches nothing: the resident runner (f32 only) refuses the stage.
    fn shadow(&mut self, _: ShadowSite) -> Result<(), Infallible> {
        Ok(())
    }
    fn lm_head(&mut self) -> Result<(), Infallible> {
        self.access(&[X], &[])
    }
    /// Touches nothing: the embed step's upload carries the scale.
    fn embed_scale(&mut self) -> Result<(), Infallible> {
        Ok(())
    }
    /// The q/k/v step added the biases (in the family's own buffer, outside the arena).
    fn qkv_bias(&mut self) -> Result<(), Infallible> {
        self.access(&[Q], &[Q])
    }
    /// The q/k/v step normalized q and k (in the family's own buffer, outside the arena).
    fn qk_norm(&mut self) -> Result<(), Infallible> {
        self.access(&[Q], &[Q])
    }
    /// Adds the normalized block output (in the family's own buffers, outside the arena)
    /// into the stream.
    fn post_norm(&mut self, _: Block) -> Result<(), Infallible> {
        self.access(&[X], &[X])
    }
    fn gelu_mul(&mut self) -> Result<(), Infallible> {
        self.access(&[Hidden], &[Hidden])
    }
}

/// The planned place of every field in one chunk's arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ChunkLayout {
    /// Byte offset per field ([`Field::index`]).
    pub offsets: [u64; Field::ALL.len()],
    /// Arena size.
    pub arena_bytes: u64,
    /// What the fields take each in its own buffer.
    pub separate_bytes: u64,
}

/// Plans a chunk's arena for fields of `sizes` bytes (by [`Field::index`]) from the
/// compiled `steps` of each stage (`layers[stage]`: its decoder layer, `None` for the
/// head), offsets aligned to `alignment`. `None` when the plan cannot be shown safe.
pub(super) fn plan_chunk_layout(
    steps: &[Vec<Step>],
    layers: &[Option<u32>],
    sizes: &[u64; Field::ALL.len()],
    alignment: u64,
) -> Option<ChunkLayout> {
    // Windows: consecutive stages of one layer (or of the head).
    let mut windows: Vec<Window> = Vec::new();
    let mut start = 0;
    for end in 1..=steps.len() {
        if end == steps.len() || layers[end] != layers[start] {
            let run: Vec<Step> = steps[start..end].iter().flatten().copied().collect();
            windows.push(Window::of(&run));
            start = end;
        }
    }
    let reference = windows.iter().max_by_key(|w| w.steps)?;
    let carried = |f: usize| windows.iter().any(|w| w.carried[f]);
    let buffers: Vec<Buffer> = Field::ALL
        .iter()
        .map(|f| {
            let i = f.index();
            let (start, end) = match reference.hull[i] {
                Some(hull) if !carried(i) => hull,
                _ => (0, reference.steps.max(1)),
            };
            Buffer {
                id: i as u32,
                bytes: sizes[i],
                start,
                end,
            }
        })
        .collect();
    let plan = plan_offsets(&buffers, alignment).ok()?;
    let mut offsets = [0u64; Field::ALL.len()];
    for p in &plan.placements {
        offsets[p.id as usize] = p.offset;
    }
    // Check: fields sharing bytes are never live at once in any window.
    let shares = |a: usize, b: usize| {
        offsets[a] < offsets[b] + sizes[b] && offsets[b] < offsets[a] + sizes[a]
    };
    for a in 0..Field::ALL.len() {
        for b in a + 1..Field::ALL.len() {
            if !shares(a, b) || sizes[a] == 0 || sizes[b] == 0 {
                continue;
            }
            if carried(a) || carried(b) {
                return None;
            }
            let overlap = windows.iter().any(|w| match (w.hull[a], w.hull[b]) {
                (Some((s1, e1)), Some((s2, e2))) => s1 < e2 && s2 < e1,
                _ => false,
            });
            if overlap {
                return None;
            }
        }
    }
    Some(ChunkLayout {
        offsets,
        arena_bytes: plan.peak_bytes,
        separate_bytes: sizes.iter().sum(),
    })
}

#[cfg(test)]
mod tests {
    use hetsched_systems::PrefillPlan;
    use hetsched_systems::testing::{tiny_device, tiny_model};

    use super::*;
    use crate::steps::Step;

    #[test]
    fn the_ffn_reuses_the_attention_blocks_bytes_and_carried_values_never_share() {
        let mut device = tiny_device();
        device.processors.truncate(1);
        let workload = hetsched_systems::Workload {
            prompt_len: 64,
            chunk_len: 32,
            float_processor: None,
        };
        let plan = PrefillPlan::new(tiny_model(3), device, workload).unwrap();
        let steps = Step::compile_stages(&plan.stages).unwrap();
        let layers: Vec<Option<u32>> = plan.stages.iter().map(|s| s.layer).collect();
        let sizes = [1024u64; Field::ALL.len()];
        let layout = plan_chunk_layout(&steps, &layers, &sizes, 256).unwrap();
        assert!(layout.arena_bytes < layout.separate_bytes, "{layout:?}");
        let range = |f: Field| {
            let o = layout.offsets[f.index()];
            o..o + sizes[f.index()]
        };
        let disjoint = |a: Field, b: Field| {
            let (a, b) = (range(a), range(b));
            a.end <= b.start || b.end <= a.start
        };
        // The residual stream and the down projection live across layers.
        for f in Field::ALL.into_iter().filter(|&f| f != Field::X) {
            assert!(disjoint(Field::X, f), "x shares with {f:?}");
        }
        for f in Field::ALL.into_iter().filter(|&f| f != Field::Down) {
            assert!(disjoint(Field::Down, f), "down shares with {f:?}");
        }
        // Values live at once never share: q, k, v meet at RoPE and attention.
        assert!(disjoint(Field::Q, Field::K) && disjoint(Field::Q, Field::V));
        assert!(disjoint(Field::Gate, Field::Up) && disjoint(Field::Up, Field::Hidden));
        assert!(disjoint(Field::Normed, Field::Gate));
    }
}
