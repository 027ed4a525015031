//! A llama decoder layer of one token's decode step in one dispatch
//! (`decode_layer.comp`): the five dispatches of [`GpuBatch::gemm_fused`] and
//! [`GpuBatch::attention_at`] a layer otherwise records, with the device's workgroups
//! meeting at a counter (a grid barrier) between the stages instead of at a pipeline
//! barrier. On an H100 a pipeline barrier between two dependent dispatches costs about
//! 6 µs, and a decode step of SmolLM2 has 150 of them: more than its kernels' own time.
//!
//! A grid barrier completes only if every workgroup of the grid runs at once, which Vulkan
//! does not promise. [`GpuContext::decode_layer_workgroups`] sizes the grid to what the
//! device keeps resident: a few workgroups per multiprocessor where the driver reports
//! its multiprocessor count (`VK_NV_shader_sm_builtins`), one workgroup on a CPU
//! implementation (lavapipe runs a dispatch's workgroups in any order, possibly one after
//! another), and no grid at all elsewhere, where the five dispatches stay. Should the
//! workgroups not all run at once after all, the kernel gives up waiting and raises the
//! layer's attention flag to 2.0 ([`DECODE_LAYER_GAVE_UP`]): an error for the caller,
//! never a hang.

use hetsched_kernels::reference::RopeStyle;
use vulkano::buffer::Subbuffer;

use crate::batch::{GpuBatch, dense};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::pipelines::Shader;

/// The flag value `decode_layer.comp` leaves in a layer's attention slot when its
/// workgroups did not all run at once (a residual add that breaks the stream writes 1.0).
pub const DECODE_LAYER_GAVE_UP: f32 = 2.0;

/// Workgroups per multiprocessor of the decode layer's grid unless
/// [`crate::GpuOptions::decode_layer_groups_per_sm`] says otherwise: 128-thread
/// workgroups, a few KiB of shared memory each, so four fit beside each other on any
/// NVIDIA multiprocessor of the last decade.
pub const DECODE_LAYER_GROUPS_PER_SM: u32 = 4;

/// Keys a workgroup of the layer kernel's attention walks per block.
const KEY_BLOCK: usize = 128;
/// Most key runs per head: past this, runs grow longer rather than more numerous.
const MAX_SPLITS: usize = 64;

/// One llama decoder layer's operands for [`GpuBatch::decode_layer`]: every matrix dense
/// f32 (columns a multiple of 4), the weights laid out as [`GpuBatch::gemm_fused`] takes
/// them.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLayer<'a> {
    /// The residual stream, `[1, hidden]`, read and written.
    pub x: &'a GpuMatrix,
    /// `[Wq; Wk; Wv]` `[q + 2 kv, hidden]`, the attention norm folded in
    /// ([`crate::fold_norm`]) and each head's rows in [`crate::rope_pair_rows`] order.
    pub qkv: &'a GpuMatrix,
    /// `[hidden, q]`.
    pub o: &'a GpuMatrix,
    /// Gate and up interleaved ([`crate::interleave_rows`]), `[2 ffn, hidden]`, the FFN
    /// norm folded in.
    pub gate_up: &'a GpuMatrix,
    /// `[hidden, ffn]`.
    pub down: &'a GpuMatrix,
    /// RoPE's (cos, sin) table of every position the caches hold, `[capacity, head_dim]`.
    pub angles: &'a GpuMatrix,
    /// The layer's key and value caches, `[capacity, kv]` each.
    pub caches: (&'a GpuMatrix, &'a GpuMatrix),
    /// The token's position, `[1, 1]` or more u32 ([`Elem::I32`]), read when the batch
    /// runs: it must be below `capacity` (the kernel cannot check it).
    pub positions: &'a GpuMatrix,
    /// Scratch: q `[1, q]`, attention's output `[1, q]`, the gate/up product `[1, ffn]`.
    pub scratch: (&'a GpuMatrix, &'a GpuMatrix, &'a GpuMatrix),
    /// Dense f32 flags and the slots of the attention and feed-forward residual adds.
    pub flags: (&'a GpuMatrix, usize, usize),
    /// Query heads and key/value heads.
    pub heads: (usize, usize),
    /// Which dims RoPE pairs.
    pub style: RopeStyle,
    /// The norms' epsilon.
    pub eps: f32,
}

/// The grid barriers' counters of one recorded step, one per layer, zeroed at the step's
/// start each time it runs ([`GpuBatch::decode_layer_counters`]).
#[derive(Clone, Debug)]
pub struct DecodeLayerCounters {
    buf: Subbuffer<[u32]>,
    layers: usize,
}

impl GpuContext {
    /// Workgroups of [`GpuBatch::decode_layer`]'s grid on this device, or `None` where it
    /// does not run (see the module note): the device's multiprocessors times
    /// [`DECODE_LAYER_GROUPS_PER_SM`] where the driver reports them, one on a CPU
    /// implementation, `None` without subgroup arithmetic or with
    /// [`crate::GpuOptions::five_dispatch_decode`].
    pub fn decode_layer_workgroups(&self) -> Option<u32> {
        if !self.info.subgroup_arithmetic || self.five_dispatch_decode {
            return None;
        }
        if self.info.kind == crate::DeviceKind::Cpu {
            return Some(1);
        }
        let per_sm = self
            .decode_layer_groups_per_sm
            .unwrap_or(DECODE_LAYER_GROUPS_PER_SM);
        self.info
            .multiprocessors
            .map(|sm| sm.saturating_mul(per_sm).max(1))
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// Counters for `layers` [`GpuBatch::decode_layer`] dispatches, zeroed here in the
    /// recording (so every replay zeroes them again before its layers run).
    pub fn decode_layer_counters(&mut self, layers: usize) -> Result<DecodeLayerCounters> {
        let job = self.job_mut();
        let buf = job
            .ctx()
            .alloc_words(layers.max(1) as u64, "decode layer counters")?;
        job.fill_zero(&buf)?;
        Ok(DecodeLayerCounters { buf, layers })
    }

    /// Records layer `layer` of a token's decode step as one dispatch; see the module
    /// note. Refused (an error, nothing recorded) where
    /// [`GpuContext::decode_layer_workgroups`] is `None`.
    pub fn decode_layer(
        &mut self,
        l: &DecodeLayer<'_>,
        counters: &DecodeLayerCounters,
        layer: usize,
    ) -> Result<()> {
        const OP: &str = "decode_layer";
        let job = self.job_mut();
        let Some(groups) = job.ctx().decode_layer_workgroups() else {
            return Err(shape(
                OP,
                "this device runs no decode layer kernel (no subgroup arithmetic, no \
                 multiprocessor count, or switched off): record the five dispatches",
            ));
        };
        if layer >= counters.layers {
            return Err(shape(
                OP,
                format!("layer {layer} of {} counters", counters.layers),
            ));
        }
        let s = check(l)?;
        let (kc, vc) = l.caches;
        let (q, attn, hidden) = l.scratch;
        let (flags, slot_o, slot_down) = l.flags;
        let splits = kc.rows().div_ceil(KEY_BLOCK).clamp(1, MAX_SPLITS);
        // Per head a counter (padded to whole vec4s), then per (head, run) its max, sum
        // and output: written before the merge reads them, so only the counters need
        // zeroing, once; the merging workgroup leaves its counter at zero.
        let d4 = s.head_dim / 4;
        let words = s.n_heads.next_multiple_of(4) + s.n_heads * splits * (d4 + 1) * 4;
        let part = job
            .ctx()
            .alloc_words(words as u64, "decode layer attention partials")?;
        job.zero_once(&part)?;
        // Prefetching pays where workgroups wait for each other; one workgroup never does.
        let prefetch = groups > 1 && !job.ctx().decode_layer_no_prefetch;
        let push = [
            (s.hidden / 4) as u32,
            (s.ffn / 4) as u32,
            l.eps.to_bits(),
            (s.n_heads * s.head_dim) as u32,
            (s.n_kv_heads * s.head_dim) as u32,
            s.head_dim as u32,
            (l.angles.ld_words() / 2) as u32,
            u32::from(l.style == RopeStyle::HalfSplit) << 1 | u32::from(prefetch) << 2,
            s.n_heads as u32,
            s.n_kv_heads as u32,
            kc.rows() as u32,
            (1.0 / (s.head_dim as f32).sqrt()).to_bits(),
            splits as u32,
            slot_o as u32,
            slot_down as u32,
            layer as u32,
        ];
        let buffers = [
            &l.x.buf,
            &l.qkv.buf,
            &l.o.buf,
            &l.gate_up.buf,
            &l.down.buf,
            &l.angles.buf,
            &kc.buf,
            &vc.buf,
            &l.positions.buf,
            &q.buf,
            &attn.buf,
            &hidden.buf,
            &flags.buf,
            &part,
            &counters.buf,
        ];
        job.dispatch(Shader::DecodeLayer, &buffers, push, [groups, 1, 1])
    }
}

/// The shapes a [`DecodeLayer`] implies.
struct LayerShape {
    hidden: usize,
    ffn: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

/// Checks every operand of `l` against the others; returns the shapes.
fn check(l: &DecodeLayer<'_>) -> Result<LayerShape> {
    const OP: &str = "decode_layer";
    let (n_heads, n_kv_heads) = l.heads;
    let head_dim = l.angles.cols();
    let hidden = l.x.cols();
    let ffn = l.down.cols();
    if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(shape(
            OP,
            format!("{n_heads} query heads over {n_kv_heads} key/value heads"),
        ));
    }
    if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > crate::MAX_HEAD_DIM {
        return Err(shape(
            OP,
            format!(
                "head_dim {head_dim} must be a multiple of 4 up to {}",
                crate::MAX_HEAD_DIM
            ),
        ));
    }
    let (qcols, kvcols) = (n_heads * head_dim, n_kv_heads * head_dim);
    let capacity = l.caches.0.rows();
    dense(OP, "x", l.x, 1, hidden)?;
    dense(OP, "qkv", l.qkv, qcols + 2 * kvcols, hidden)?;
    dense(OP, "o", l.o, hidden, qcols)?;
    dense(OP, "gate_up", l.gate_up, 2 * ffn, hidden)?;
    dense(OP, "down", l.down, hidden, ffn)?;
    dense(OP, "k cache", l.caches.0, capacity, kvcols)?;
    dense(OP, "v cache", l.caches.1, capacity, kvcols)?;
    dense(OP, "angles", l.angles, l.angles.rows(), head_dim)?;
    let (q, attn, hid) = l.scratch;
    dense(OP, "q", q, 1, qcols)?;
    dense(OP, "attention output", attn, 1, qcols)?;
    dense(OP, "gate/up product", hid, 1, ffn)?;
    let (flags, slot_o, slot_down) = l.flags;
    dense(OP, "flags", flags, flags.rows(), flags.cols())?;
    if capacity == 0 || l.angles.rows() < capacity {
        return Err(shape(
            OP,
            format!(
                "caches of {capacity} rows and a RoPE table of {} positions",
                l.angles.rows()
            ),
        ));
    }
    if slot_o.max(slot_down) >= flags.rows() * flags.cols() {
        return Err(shape(OP, "a flag slot past the flags"));
    }
    if l.positions.elem() != Elem::I32 || l.positions.rows() * l.positions.cols() == 0 {
        return Err(shape(OP, "positions must hold a u32 (I32)"));
    }
    Ok(LayerShape {
        hidden,
        ffn,
        n_heads,
        n_kv_heads,
        head_dim,
    })
}
