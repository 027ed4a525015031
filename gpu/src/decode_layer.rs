//! The llama decoder layers of one token's decode step as few dispatches
//! (`decode_layer.glsl`: up to 64 layers a dispatch, one on lavapipe,
//! [`GpuContext::decode_layers_per_dispatch`]): per layer the five dispatches of
//! [`GpuBatch::gemm_fused`] and [`GpuBatch::attention_at`] the step otherwise records,
//! with the device's workgroups meeting at a counter (a grid barrier) between the stages
//! and the layers instead of at a pipeline barrier. On an H100 a
//! pipeline barrier between two dependent dispatches costs about 6 µs, and a decode step
//! of SmolLM2 has 150 of them: more than its kernels' own time. A layer's weights and
//! caches are elements of descriptor arrays, which the kernel indexes by layer. In a step
//! of one sequence whose keys are few ([`ATTENTION_WITH_O_MAX_KEYS`]) attention and o run
//! as one stage, four stages a layer: each head's output goes through its slice of W_o
//! straight into the stream, added with float atomics (the sum of the heads in no fixed
//! order, as the prefill's attention with o;
//! [`crate::GpuOptions::unfused_output_projection`] keeps o a stage of its own).
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
//!
//! One dispatch steps up to [`DECODE_LAYER_MAX_ROWS`] sequences at once (batched decode,
//! such as parallel samples of one prompt): the products read each weight once for all
//! of them, and attention runs a unit per (sequence, head, key run). The sequences share
//! the layer's caches: each row's positions map to cache rows through a shared prefix and
//! a shift of its own ([`DecodeLayers::positions`]), so samples read their prompt's rows
//! without a copy.

use hetsched_kernels::reference::RopeStyle;
use vulkano::buffer::Subbuffer;

use crate::batch::{GpuBatch, dense, has_shape};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::pipelines::Shader;

/// The flag value `decode_layer.glsl` leaves in a layer's attention slot when its
/// workgroups did not all run at once (a residual add that breaks the stream writes 1.0).
pub const DECODE_LAYER_GAVE_UP: f32 = 2.0;

/// Workgroups per multiprocessor of the decode layer's grid, steps of one row and of
/// several alike, unless [`crate::GpuOptions::decode_layer_groups_per_sm`] says
/// otherwise: 128-thread workgroups, a few KiB of shared memory each. On an H100
/// (medians): one sequence's tg128 at 962 and 918 tokens/s at 3 against 917 and 907 at 4
/// in two runs (with attention and o as one stage, whose 162 units leave most of the
/// grid idle at that stage's barrier); 8 samples at 3353 at 3, 3365 at 4 and 3113 at 2
/// (one run). 3 also leaves the grid barrier room on devices with fewer registers a
/// multiprocessor (at 4, with 20 KB of shared memory for the several-row reductions
/// then, an H100 did not keep every workgroup resident).
pub const DECODE_LAYER_GROUPS_PER_SM: u32 = 3;

/// Layers a dispatch of [`GpuBatch::decode_layers`] runs unless
/// [`crate::GpuOptions::decode_layers_per_dispatch`] says otherwise: up to 64, the whole
/// step of a model of 64 layers or fewer in one dispatch (on an H100, SmolLM2's tg128 at
/// 815 tokens/s against 730 with one layer a dispatch).
pub const DECODE_LAYERS_PER_DISPATCH: usize = 64;

/// Most sequences one dispatch of [`GpuBatch::decode_layers`] steps together.
pub const DECODE_LAYER_MAX_ROWS: usize = 8;

/// The kernel's variants, with the layers each binds (the length of its descriptor
/// arrays) and the most rows it steps, widest first, each as its f32 and its f16 weights'
/// shader; a step of one row takes a one-row variant (no loops over rows it does not
/// have).
const KERNELS: [([Shader; 2], usize, usize); 4] = [
    ([Shader::DecodeLayer, Shader::DecodeLayerF16], 64, 1),
    ([Shader::DecodeLayer1, Shader::DecodeLayer1F16], 1, 1),
    (
        [Shader::DecodeLayerRows8, Shader::DecodeLayerRows8F16],
        64,
        DECODE_LAYER_MAX_ROWS,
    ),
    (
        [Shader::DecodeLayer1Rows8, Shader::DecodeLayer1Rows8F16],
        1,
        DECODE_LAYER_MAX_ROWS,
    ),
];

/// Storage buffers a variant of `layers` layers binds: 6 arrays of a layer's buffers, 9
/// single buffers.
fn storage_buffers(layers: usize) -> u32 {
    (6 * layers + 9) as u32
}

/// Keys a workgroup of the layer kernel's attention walks per block.
const KEY_BLOCK: usize = 128;
/// Most key runs per head: past this, runs grow longer rather than more numerous. The
/// merge loads each run's max and sum with a thread of its own (128 a workgroup).
const MAX_SPLITS: usize = 64;
const _: () = assert!(MAX_SPLITS <= 128);

/// Most keys (a step's [`DecodeLayers::keys`]) at which a step of one sequence runs
/// attention and o as one stage (`decode_layer.glsl`'s `attention_unit` with o, unless
/// [`crate::GpuOptions::unfused_output_projection`]): each head's attention then runs
/// once per block of 32 of o's rows, 18 times for SmolLM2, over every key in one
/// workgroup, which costs less than a stage and a grid barrier only while the keys are a
/// few blocks. Steps of several sequences keep o a stage of its own (the several-row
/// kernels leave the stage out; it is not measured there).
pub const ATTENTION_WITH_O_MAX_KEYS: usize = 4 * KEY_BLOCK;

/// One llama decoder layer's own buffers for [`GpuBatch::decode_layers`]: every matrix
/// dense, the weights f32 or f16 (every layer's alike; the products then round their
/// inputs to f16 as [`GpuBatch::gemm_fused`]'s f16 kernels do) and laid out as
/// [`GpuBatch::gemm_fused`] takes them, the caches f32.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLayerWeights<'a> {
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
    /// The layer's key and value caches, `[capacity, kv]` each.
    pub caches: (&'a GpuMatrix, &'a GpuMatrix),
}

/// The llama decoder layers of a token's step for [`GpuBatch::decode_layers`], and what
/// they share.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLayers<'a> {
    /// The layers, in order.
    pub layers: &'a [DecodeLayerWeights<'a>],
    /// The residual stream, `[rows, hidden]` (a row per sequence, 1 ..=
    /// [`DECODE_LAYER_MAX_ROWS`]), read and written.
    pub x: &'a GpuMatrix,
    /// RoPE's (cos, sin) table of every position a row may be at, `[positions,
    /// head_dim]`.
    pub angles: &'a GpuMatrix,
    /// Per row four u32 ([`Elem::I32`], at least `4 · rows` words), read when the batch
    /// runs: the token's position `p`, then a shared prefix `s` and a shift `o`: the row
    /// attends over positions `0 ..= p`, and position `j` lives in cache row `j` below
    /// `s` and `j + o` from `s` on (one sequence: `(p, 0, 0)`). Every position must be
    /// below `keys` and every mapped row below the caches' rows: the kernel cannot check
    /// them.
    pub positions: &'a GpuMatrix,
    /// A bound on every row's position + 1 (at most the RoPE table's positions): the
    /// attention's key runs split this many keys.
    pub keys: usize,
    /// Scratch, a row per sequence: q `[rows, q]`, attention's output `[rows, q]`, the
    /// gate/up product `[rows, ffn]`.
    pub scratch: (&'a GpuMatrix, &'a GpuMatrix, &'a GpuMatrix),
    /// Dense f32 flags, and the slot of the first layer's attention residual add: layer
    /// `l`'s attention and feed-forward adds raise slots `first + 2 l` and `first + 2 l +
    /// 1`.
    pub flags: (&'a GpuMatrix, usize),
    /// Query heads and key/value heads.
    pub heads: (usize, usize),
    /// Which dims RoPE pairs.
    pub style: RopeStyle,
    /// The norms' epsilon.
    pub eps: f32,
}

/// The grid barriers' counters of one recorded step, one per dispatch, zeroed at the
/// step's start each time it runs ([`GpuBatch::decode_layer_counters`]).
#[derive(Clone, Debug)]
pub struct DecodeLayerCounters {
    buf: Subbuffer<[u32]>,
    dispatches: usize,
}

impl GpuContext {
    /// Workgroups of [`GpuBatch::decode_layers`]'s grid on this device, or `None` where it
    /// does not run (see the module note): the device's multiprocessors times
    /// [`DECODE_LAYER_GROUPS_PER_SM`] where the driver reports them, one on a CPU
    /// implementation; `None` without subgroup arithmetic, float atomic adds to buffers,
    /// dynamic indexing of storage-buffer arrays or room for the kernel's bindings, or with
    /// [`crate::GpuOptions::five_dispatch_decode`].
    pub fn decode_layer_workgroups(&self) -> Option<u32> {
        self.decode_layer_grid(1)
    }

    /// The most sequences one dispatch of [`GpuBatch::decode_layers`] steps here:
    /// [`DECODE_LAYER_MAX_ROWS`], one where the several-row variants do not run
    /// (subgroups under 4 invocations), none where the kernel does not run at all.
    pub fn decode_layer_max_rows(&self) -> usize {
        match (
            self.decode_layer_grid(DECODE_LAYER_MAX_ROWS),
            self.decode_layer_grid(1),
        ) {
            (Some(_), _) => DECODE_LAYER_MAX_ROWS,
            (None, Some(_)) => 1,
            (None, None) => 0,
        }
    }

    /// Workgroups of the grid of a step of `rows` sequences (see
    /// [`GpuContext::decode_layer_workgroups`]).
    fn decode_layer_grid(&self, rows: usize) -> Option<u32> {
        self.decode_layer_kernel(rows, Elem::F32)?;
        if self.info.kind == crate::DeviceKind::Cpu {
            return Some(1);
        }
        // An asked-for count holds for every width (the grid barrier refuses one that
        // does not fit, by name).
        let per_sm = self
            .decode_layer_groups_per_sm
            .unwrap_or(DECODE_LAYER_GROUPS_PER_SM);
        self.info
            .multiprocessors
            .map(|sm| sm.saturating_mul(per_sm).max(1))
    }

    /// Layers one dispatch of [`GpuBatch::decode_layers`] runs at most here:
    /// [`crate::GpuOptions::decode_layers_per_dispatch`] (default
    /// [`DECODE_LAYERS_PER_DISPATCH`], at most 64), or one on a CPU implementation
    /// (lavapipe computed wrong results with three of SmolLM2's layers bound at once) or
    /// where the device binds fewer than 393 storage buffers a stage; `None` where the
    /// kernel does not run ([`GpuContext::decode_layer_workgroups`]).
    pub fn decode_layers_per_dispatch(&self) -> Option<usize> {
        self.decode_layer_workgroups()?;
        self.decode_layer_kernel(1, Elem::F32)
            .map(|(_, _, per_dispatch)| per_dispatch)
    }

    /// The widest variant of the kernel for steps of `rows` sequences over `weights`
    /// (f32 or f16) the device binds, where it may run at all: its shader, the layers it
    /// binds, and the layers a dispatch runs. `None` also for `rows` 0 or past
    /// [`DECODE_LAYER_MAX_ROWS`], and for weights of another type.
    pub(crate) fn decode_layer_kernel(
        &self,
        rows: usize,
        weights: Elem,
    ) -> Option<(Shader, usize, usize)> {
        // The several-row variants size their reductions for subgroups of 4 or more.
        let kernel_rows = match rows {
            1 => 1,
            2..=DECODE_LAYER_MAX_ROWS if self.info.subgroup_size.is_some_and(|s| s >= 4) => {
                DECODE_LAYER_MAX_ROWS
            }
            _ => return None,
        };
        let i = &self.info;
        // Attention with o adds into the stream with float atomics (the kernel declares
        // them, so it cannot even be built for a device without).
        if !i.subgroup_arithmetic
            || !i.storage_buffer_array_indexing
            || !i.float_atomic_add
            || self.five_dispatch_decode
        {
            return None;
        }
        let cpu = i.kind == crate::DeviceKind::Cpu;
        let cap = self
            .decode_layers_per_dispatch
            .unwrap_or(DECODE_LAYERS_PER_DISPATCH)
            .max(1);
        let by_weights = match weights {
            Elem::F32 => 0,
            Elem::F16 => 1,
            Elem::I32 | Elem::I8 => return None,
        };
        KERNELS
            .into_iter()
            .filter(|&(_, _, rows)| rows == kernel_rows)
            .filter(|&(_, layers, _)| (!cpu && cap > 1) || layers == 1)
            .find(|&(_, layers, _)| i.max_stage_storage_buffers >= storage_buffers(layers))
            .map(|(shaders, layers, _)| (shaders[by_weights], layers, layers.min(cap)))
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// Counters for the dispatches of [`GpuBatch::decode_layers`] over `layers` layers,
    /// zeroed here in the recording (so every replay zeroes them again before its layers
    /// run).
    pub fn decode_layer_counters(&mut self, layers: usize) -> Result<DecodeLayerCounters> {
        let job = self.job_mut();
        let per_dispatch = job.ctx().decode_layers_per_dispatch().unwrap_or(1);
        let dispatches = layers.div_ceil(per_dispatch).max(1);
        let buf = job
            .ctx()
            .alloc_words(dispatches as u64, "decode layer counters")?;
        job.fill_zero(&buf)?;
        Ok(DecodeLayerCounters { buf, dispatches })
    }

    /// Records the layers of a decode step of `l.x.rows()` sequences,
    /// [`GpuContext::decode_layers_per_dispatch`] to a dispatch; see the module note.
    /// Refused (an error, nothing recorded) where [`GpuContext::decode_layer_workgroups`]
    /// is `None`.
    pub fn decode_layers(
        &mut self,
        l: &DecodeLayers<'_>,
        counters: &DecodeLayerCounters,
    ) -> Result<()> {
        let s = check(l)?;
        let job = self.job_mut();
        let ctx = job.ctx();
        let (Some(groups), Some((shader, bound, per_dispatch))) = (
            ctx.decode_layer_grid(s.rows),
            ctx.decode_layer_kernel(s.rows, s.weights),
        ) else {
            return Err(shape(
                OP,
                "this device runs no decode layer kernel (no subgroup arithmetic, no float \
                 atomic adds, no indexing of buffer arrays, no multiprocessor count, or \
                 switched off): \
                 record the five dispatches a layer",
            ));
        };
        let runs = l.layers.chunks(per_dispatch);
        if runs.len() > counters.dispatches {
            return Err(shape(
                OP,
                format!(
                    "{} layers take {} dispatches; the counters serve {}",
                    l.layers.len(),
                    runs.len(),
                    counters.dispatches
                ),
            ));
        }
        let splits = l.keys.div_ceil(KEY_BLOCK).clamp(1, MAX_SPLITS);
        // Per layer and (row, head) a counter (padded to whole vec4s), then per (row,
        // head, run) its max, sum and output: written before the merge reads them, so only
        // the counters need zeroing, once; the merging workgroup leaves its counter at
        // zero.
        let d4 = s.head_dim / 4;
        let row_heads = s.rows * s.n_heads;
        let layer_words = row_heads.next_multiple_of(4) + row_heads * splits * (d4 + 1) * 4;
        let part = job.ctx().alloc_words(
            (layer_words * l.layers.len().min(per_dispatch)) as u64,
            "decode layer attention partials",
        )?;
        job.zero_once(&part)?;
        let prefetch = job.ctx().decode_layer_prefetch;
        let ctx = job.ctx();
        let attention_with_o = s.rows == 1
            && !ctx.unfused_output_projection
            && l.keys
                <= ctx
                    .decode_attention_with_o_max_keys
                    .unwrap_or(ATTENTION_WITH_O_MAX_KEYS);
        let (q, attn, hidden) = l.scratch;
        let (flags, first_slot) = l.flags;
        for (dispatch, run) in runs.enumerate() {
            let first = dispatch * per_dispatch;
            let push = [
                (s.hidden / 4) as u32,
                (s.ffn / 4) as u32,
                l.eps.to_bits(),
                (s.n_heads * s.head_dim) as u32,
                (s.n_kv_heads * s.head_dim) as u32,
                s.head_dim as u32,
                (l.angles.ld_words() / 2) as u32,
                u32::from(l.style == RopeStyle::HalfSplit) << 1
                    | u32::from(prefetch) << 2
                    | u32::from(attention_with_o) << 3
                    | (s.rows as u32) << 8,
                s.n_heads as u32,
                s.n_kv_heads as u32,
                l.keys as u32,
                (1.0 / (s.head_dim as f32).sqrt()).to_bits(),
                splits as u32,
                (first_slot + 2 * first) as u32,
                run.len() as u32,
                dispatch as u32,
            ];
            // Every array element is bound: the run's layers, then its last layer again.
            let array = |f: for<'w> fn(&DecodeLayerWeights<'w>) -> &'w GpuMatrix| {
                let last = run[run.len() - 1];
                (0..bound)
                    .map(|i| &f(run.get(i).unwrap_or(&last)).buf)
                    .collect::<Vec<_>>()
            };
            let [wqkv, wo, wgu, wdown, kc, vc] = [
                array(|w| w.qkv),
                array(|w| w.o),
                array(|w| w.gate_up),
                array(|w| w.down),
                array(|w| w.caches.0),
                array(|w| w.caches.1),
            ];
            let bindings: [&[&Subbuffer<[u32]>]; 15] = [
                &[&l.x.buf],
                &wqkv,
                &wo,
                &wgu,
                &wdown,
                &[&l.angles.buf],
                &kc,
                &vc,
                &[&l.positions.buf],
                &[&q.buf],
                &[&attn.buf],
                &[&hidden.buf],
                &[&flags.buf],
                &[&part],
                &[&counters.buf],
            ];
            job.dispatch_arrays(shader, &bindings, push, [groups, 1, 1])?;
        }
        Ok(())
    }
}

const OP: &str = "decode_layers";

/// The shapes a [`DecodeLayers`] implies.
struct LayerShape {
    rows: usize,
    /// The weights' type, every layer's alike.
    weights: Elem,
    hidden: usize,
    ffn: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

/// Checks that weight matrix `m` is dense `[rows, cols]` of type `elem`, f32 or f16
/// (every row's stride its columns).
fn dense_weights(elem: Elem, what: &str, m: &GpuMatrix, rows: usize, cols: usize) -> Result<()> {
    if !matches!(elem, Elem::F32 | Elem::F16) || m.elem() != elem || m.ld() != m.cols() {
        return Err(shape(
            OP,
            format!(
                "{what} must be dense f32 or f16 like the first layer's q/k/v ({elem:?}, columns a \
                 multiple of {}), got {:?} with {} columns",
                4 * elem.per_word(),
                m.elem(),
                m.cols()
            ),
        ));
    }
    has_shape(OP, what, m, rows, cols)
}

/// Checks every operand of `l` against the others; returns the shapes.
fn check(l: &DecodeLayers<'_>) -> Result<LayerShape> {
    let (n_heads, n_kv_heads) = l.heads;
    let head_dim = l.angles.cols();
    let (rows, hidden) = (l.x.rows(), l.x.cols());
    let Some(first) = l.layers.first() else {
        return Err(shape(OP, "no layers"));
    };
    let ffn = first.down.cols();
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
    let capacity = first.caches.0.rows();
    if rows == 0 || rows > DECODE_LAYER_MAX_ROWS {
        return Err(shape(
            OP,
            format!("{rows} rows: a step takes 1 to {DECODE_LAYER_MAX_ROWS} sequences"),
        ));
    }
    dense(OP, "x", l.x, rows, hidden)?;
    let weights = first.qkv.elem();
    for w in l.layers {
        dense_weights(weights, "qkv", w.qkv, qcols + 2 * kvcols, hidden)?;
        dense_weights(weights, "o", w.o, hidden, qcols)?;
        dense_weights(weights, "gate_up", w.gate_up, 2 * ffn, hidden)?;
        dense_weights(weights, "down", w.down, hidden, ffn)?;
        dense(OP, "k cache", w.caches.0, capacity, kvcols)?;
        dense(OP, "v cache", w.caches.1, capacity, kvcols)?;
    }
    dense(OP, "angles", l.angles, l.angles.rows(), head_dim)?;
    let (q, attn, hid) = l.scratch;
    dense(OP, "q", q, rows, qcols)?;
    dense(OP, "attention output", attn, rows, qcols)?;
    dense(OP, "gate/up product", hid, rows, ffn)?;
    let (flags, first_slot) = l.flags;
    dense(OP, "flags", flags, flags.rows(), flags.cols())?;
    if capacity == 0 || l.keys == 0 || l.angles.rows() < l.keys {
        return Err(shape(
            OP,
            format!(
                "caches of {capacity} rows, keys up to {} and a RoPE table of {} positions",
                l.keys,
                l.angles.rows()
            ),
        ));
    }
    if first_slot + 2 * l.layers.len() > flags.rows() * flags.cols() {
        return Err(shape(OP, "a layer's flag slot past the flags"));
    }
    if l.positions.elem() != Elem::I32 || l.positions.rows() * l.positions.cols() < 4 * rows {
        return Err(shape(
            OP,
            format!("positions must hold {} u32 (I32)", 4 * rows),
        ));
    }
    Ok(LayerShape {
        rows,
        weights,
        hidden,
        ffn,
        n_heads,
        n_kv_heads,
        head_dim,
    })
}
