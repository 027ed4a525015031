//! Every stage of a prefill on one Vulkan device with everything resident: the weights are
//! uploaded once, each chunk's activations and every layer's KV cache live in device
//! memory, and one stage is one command buffer. Only the chunk's token embeddings go up
//! and the logits come down.
//!
//! The scheduler still decides the order (the GPU is one processor lane, so it picks which
//! ready chunk's stage runs next); a stage's steps are the same [`Step`]s the CPU
//! interpreter runs, with f32 linears (the GPU has no NPU's INT8-only restriction).
//!
//! A stage is queued, not waited for: it is recorded into an open command buffer, which is
//! submitted every few stages without waiting; the device runs submissions in order (each
//! waits on a semaphore of the one before), as a CUDA stream would. So the lane is free
//! again once the stage is recorded, and host recording overlaps device work. Waiting per
//! stage cost about 100 us of fence latency each on an H100, and a submission per stage
//! about 40 us of host time (hundreds of stages per prefill). The timeline therefore shows
//! when stages were queued; the head's slice, which waits for its logits, ends when the
//! device has finished everything.
//!
//! KV rows follow the CPU interpreter's rule (seed 000 Eq. 2 lets chunk i's attention run
//! before chunk j < i rotated its keys): whichever stage needs chunk j's rows of a layer
//! first rotates and copies them into the cache, once.

use std::sync::Arc;

use hetsched_gpu::{AttentionShape, Elem, GpuBatch, GpuContext, GpuMatrix, GpuTimer};
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::resources::Job;

use hetsched_import::LlamaConfig;
use parking_lot::Mutex;

use super::ActivationBytes;
use super::error::ExecError;
use super::gpu_layout::{Field, plan_chunk_layout};
use super::queues::{JobError, JobRunner};
use super::steps::Step;
use super::weights::{ExecModel, LinearWeights};
use hetsched_systems::op::{NormSite, Projection};

fn gpu_err(e: hetsched_gpu::GpuError) -> ExecError {
    ExecError::Gpu(e.to_string())
}

/// One decoder layer's weights on the device (linears `[n, k]` f32, norms `[1, hidden]`).
struct GpuLayer {
    attn_norm: GpuMatrix,
    ffn_norm: GpuMatrix,
    /// By [`Projection::index`].
    linears: [GpuMatrix; Projection::COUNT],
}

impl GpuLayer {
    fn linear(&self, p: Projection) -> &GpuMatrix {
        &self.linears[p.index()]
    }
}

/// A model's weights resident on a Vulkan device, f32.
pub struct GpuModel {
    /// The device.
    pub context: Arc<GpuContext>,
    /// The host model (configuration, token embeddings; its weights are not used).
    pub host: Arc<ExecModel>,
    layers: Vec<GpuLayer>,
    output_norm: GpuMatrix,
    output: GpuMatrix,
    /// Bytes of weights uploaded.
    pub resident_bytes: u64,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("device", &self.context.info().name)
            .field("resident_bytes", &self.resident_bytes)
            .finish()
    }
}

/// Uploads `data` as `[rows, cols]`, counting its bytes.
fn upload(
    ctx: &GpuContext,
    bytes: &mut u64,
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<GpuMatrix, ExecError> {
    *bytes += (data.len() * 4) as u64;
    ctx.upload_f32(data, rows, cols).map_err(gpu_err)
}

fn upload_linear(
    ctx: &GpuContext,
    bytes: &mut u64,
    w: &LinearWeights,
) -> Result<GpuMatrix, ExecError> {
    match w {
        LinearWeights::F32(packed) => upload(ctx, bytes, &packed.to_rows(), packed.n(), packed.k()),
        LinearWeights::Int8 { .. } => Err(ExecError::Gpu(
            "the resident GPU path runs f32 linears: load the model with --precision f32".into(),
        )),
    }
}

impl GpuModel {
    /// Uploads `model`'s weights to `context`. The model must hold f32 linears
    /// ([`super::LinearPrecision::F32`]).
    pub fn upload(context: GpuContext, model: Arc<ExecModel>) -> Result<Self, ExecError> {
        let ctx = &context;
        let mut bytes = 0u64;
        let hidden = model.config.hidden;
        let mut layers = Vec::with_capacity(model.layers.len());
        for w in &model.layers {
            let b = &mut bytes;
            layers.push(GpuLayer {
                attn_norm: upload(ctx, b, &w.attn_norm, 1, hidden)?,
                ffn_norm: upload(ctx, b, &w.ffn_norm, 1, hidden)?,
                linears: Projection::ALL
                    .into_iter()
                    .map(|p| upload_linear(ctx, b, w.projection(p)))
                    .collect::<Result<Vec<_>, _>>()?
                    .try_into()
                    .expect("one linear per projection"),
            });
        }
        let output_norm = upload(ctx, &mut bytes, &model.output_norm, 1, hidden)?;
        let head = &model.output;
        let output = upload(ctx, &mut bytes, &head.to_rows(), head.n(), head.k())?;
        Ok(Self {
            context: Arc::new(context),
            host: model,
            layers,
            output_norm,
            output,
            resident_bytes: bytes,
        })
    }

    /// Runs a one-token prefill, so that what a first prefill pays for beyond
    /// [`GpuContext::prepare`] (descriptor pools, memory blocks of activation-sized buffers,
    /// the first open command buffer) stays out of a measured run.
    pub fn warm_up(self: &Arc<Self>) -> Result<(), ExecError> {
        let options = super::PrefillOptions {
            chunk_len: 1,
            ..super::PrefillOptions::default()
        };
        super::prefill_on_gpu(self, &[0], &options).map(drop)
    }
}

/// A chunk's value in device memory, for the checks that every read follows its write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
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
    fn name(self) -> &'static str {
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

    fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// One chunk's resident activations (allocated once per prefill, reused by every layer).
struct ChunkTensors {
    pos0: usize,
    rows: usize,
    x: GpuMatrix,
    normed: GpuMatrix,
    q: GpuMatrix,
    k: GpuMatrix,
    v: GpuMatrix,
    attn: GpuMatrix,
    o: GpuMatrix,
    gate: GpuMatrix,
    up: GpuMatrix,
    hidden: GpuMatrix,
    down: GpuMatrix,
    /// The last token's residual and its norm (the head of a prefill reads one token).
    last: GpuMatrix,
    last_normed: GpuMatrix,
    /// RoPE rotations of the chunk's positions, `[rows, head_dim]`.
    angles: GpuMatrix,
    /// Values written and not yet consumed.
    ready: u16,
    /// Input of the next projections.
    act: Option<Value>,
    /// What the next residual add adds.
    delta: Option<Value>,
    /// The final norm ran on the last token only.
    head_on_last: bool,
}

impl ChunkTensors {
    fn matrix(&self, v: Value) -> &GpuMatrix {
        match v {
            Value::Normed => &self.normed,
            Value::Q => &self.q,
            Value::O => &self.o,
            Value::Gate => &self.gate,
            Value::Up => &self.up,
            Value::Down => &self.down,
            Value::Attn => &self.attn,
            Value::Hidden => &self.hidden,
        }
    }

    /// `v` was written and not yet consumed, or the error naming `step`'s broken dependency.
    fn require(&self, v: Value, step: Step, chunk: usize) -> Result<(), ExecError> {
        if self.ready & v.bit() == 0 {
            return Err(ExecError::missing(step, chunk, v.name()));
        }
        Ok(())
    }

    fn projection_out(&self, p: Projection) -> &GpuMatrix {
        match p {
            Projection::Q => &self.q,
            Projection::K => &self.k,
            Projection::V => &self.v,
            Projection::O => &self.o,
            Projection::Gate => &self.gate,
            Projection::Up => &self.up,
            Projection::Down => &self.down,
        }
    }
}

/// A chunk's rows of one layer's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum KvRows {
    #[default]
    Missing,
    /// Projected into the chunk's `k` / `v` matrices, not yet rotated and copied.
    Pending {
        k: bool,
        v: bool,
    },
    Written,
}

/// Everything a resident prefill writes on the device.
struct RunState {
    chunks: Vec<ChunkTensors>,
    /// Per layer: `[prompt, kv_dim]` keys (rotated) and values.
    caches: Vec<(GpuMatrix, GpuMatrix)>,
    /// Per layer, per chunk.
    kv: Vec<Vec<KvRows>>,
    /// `[rows, vocab]` logits of the head.
    logits: GpuMatrix,
    /// The lane thread that records (see [`OPEN`]).
    recorder: Option<std::thread::ThreadId>,
}

/// An open command buffer: whose it is, the batch, and how many stages it holds.
struct OpenBatch {
    runner: u64,
    batch: GpuBatch<Arc<GpuContext>>,
    stages: usize,
}

thread_local! {
    /// The open command buffer of the runner recording on this thread. Here rather than in
    /// the runner because vulkano's command buffer builders stay on the thread whose pool
    /// allocated them (they are not `Send`).
    static OPEN: std::cell::RefCell<Option<OpenBatch>> = const { std::cell::RefCell::new(None) };
}

/// Identifies runners, so that a batch left open by a failed prefill is never continued.
static NEXT_RUNNER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Stages recorded into one command buffer before it is submitted: a submission costs
/// about 40 us of host time on an H100 (semaphore, fence, two queue submits), a recorded
/// stage about 10 us, and the device starts only once a batch is submitted.
const STAGES_PER_SUBMISSION: usize = 6;

/// When the device ran one stage of one chunk, in ns on its clock (arbitrary origin).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTime {
    /// (chunk, stage).
    pub key: InstanceKey,
    /// Start, ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
}

/// Runs stages of one prefill on the device; the [`JobRunner`] of the GPU lane.
pub struct GpuStageRunner {
    model: Arc<GpuModel>,
    steps: Vec<Vec<Step>>,
    layers: Vec<Option<u32>>,
    tokens: Vec<u32>,
    all_logits: bool,
    state: Mutex<RunState>,
    /// This runner's identity for [`OPEN`].
    id: u64,
    /// Device timestamps around every stage (2 per instance), when asked for and the queue
    /// has them.
    timer: Option<GpuTimer>,
    /// Next-token logits once the head ran (see [`super::PrefillState::logits`]).
    pub logits: Mutex<Option<Vec<f32>>>,
    activation_bytes: ActivationBytes,
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
    for f in Field::ALL {
        sizes[f.index()] = (rows * Elem::F32.ld(field_cols(c, f)) * 4) as u64;
    }
    let unpadded = Field::ALL
        .iter()
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
                    arena
                        .matrix(at, rows, field_cols(c, f), Elem::F32)
                        .map(Some)
                })
                .collect::<Result<_, _>>()
        }
        None => {
            bytes.allocated += sizes.iter().sum::<u64>();
            Field::ALL
                .iter()
                .map(|&f| {
                    ctx.alloc_matrix(rows, field_cols(c, f), Elem::F32)
                        .map(Some)
                })
                .collect::<Result<_, _>>()
        }
    };
    fields.map_err(gpu_err)
}

impl std::fmt::Debug for GpuStageRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStageRunner")
            .field("model", &self.model)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl GpuStageRunner {
    /// Allocates the device tensors of a prefill of `tokens` cut into `chunk_len`-token
    /// chunks, running `steps` (compiled from the plan's stages, whose layers are
    /// `layers`); with `timestamps`, brackets every stage with device timestamps (about 5%
    /// of the prefill on an H100: each one waits for the work before it).
    pub fn new(
        model: Arc<GpuModel>,
        steps: Vec<Vec<Step>>,
        layers: Vec<Option<u32>>,
        tokens: Vec<u32>,
        chunk_len: usize,
        all_logits: bool,
        timestamps: bool,
    ) -> Result<Self, ExecError> {
        let ctx = &model.context;
        let c = &model.host.config;
        let alloc =
            |rows: usize, cols: usize| ctx.alloc_matrix(rows, cols, Elem::F32).map_err(gpu_err);
        let mut chunks = Vec::new();
        let mut activation_bytes = ActivationBytes::default();
        for pos0 in (0..tokens.len()).step_by(chunk_len.max(1)) {
            let rows = chunk_len.min(tokens.len() - pos0);
            let positions: Vec<usize> = (pos0..pos0 + rows).collect();
            let mut fields = chunk_fields(ctx, c, rows, &steps, &layers, &mut activation_bytes)?;
            let mut take = |f: Field| {
                fields[f.index()]
                    .take()
                    .ok_or_else(|| ExecError::Kernel(format!("no buffer for {f:?}")))
            };
            chunks.push(ChunkTensors {
                pos0,
                rows,
                x: take(Field::X)?,
                normed: take(Field::Normed)?,
                q: take(Field::Q)?,
                k: take(Field::K)?,
                v: take(Field::V)?,
                attn: take(Field::Attn)?,
                o: take(Field::O)?,
                gate: take(Field::Gate)?,
                up: take(Field::Up)?,
                hidden: take(Field::Hidden)?,
                down: take(Field::Down)?,
                last: alloc(1, c.hidden)?,
                last_normed: alloc(1, c.hidden)?,
                angles: ctx
                    .rope_angles(&positions, c.head_dim, c.rope_base)
                    .map_err(gpu_err)?,
                ready: 0,
                act: None,
                delta: None,
                head_on_last: false,
            });
        }
        let head_rows = match (all_logits, chunks.last()) {
            (true, Some(last)) => last.rows,
            _ => 1,
        };
        let caches = (0..model.layers.len())
            .map(|_| {
                Ok((
                    alloc(tokens.len(), c.kv_dim())?,
                    alloc(tokens.len(), c.kv_dim())?,
                ))
            })
            .collect::<Result<_, ExecError>>()?;
        let timer = match timestamps {
            true => ctx.timer(2 * steps.len() * chunks.len()).map_err(gpu_err)?,
            false => None,
        };
        let state = RunState {
            kv: vec![vec![KvRows::Missing; chunks.len()]; model.layers.len()],
            logits: alloc(head_rows, c.vocab_size)?,
            chunks,
            caches,
            recorder: None,
        };
        Ok(Self {
            model,
            steps,
            layers,
            tokens,
            all_logits,
            state: Mutex::new(state),
            id: NEXT_RUNNER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            timer,
            logits: Mutex::new(None),
            activation_bytes,
        })
    }

    /// The chunks' activation buffers: as planned (arenas) against one buffer per value.
    pub fn activation_bytes(&self) -> ActivationBytes {
        self.activation_bytes
    }

    /// Records stage `key.stage` of chunk `key.chunk` into the open command buffer, which
    /// is submitted without waiting every [`STAGES_PER_SUBMISSION`] stages (the device runs
    /// submissions in order); the head's submission waits for all of them.
    pub fn run_stage(&self, key: InstanceKey) -> Result<(), ExecError> {
        let (chunk, stage) = (key.chunk as usize, key.stage as usize);
        let mut state = self.state.lock();
        let (Some(steps), true) = (self.steps.get(stage), chunk < state.chunks.len()) else {
            return Err(ExecError::Kernel(format!(
                "no stage {stage} of chunk {chunk} in this prefill"
            )));
        };
        // The head (no layer) reads the last layer's output.
        let layer = self.layers[stage].map_or(self.model.layers.len(), |l| l as usize);
        // Stages must be recorded in the order the device is to run them: on one thread.
        let me = std::thread::current().id();
        if *state.recorder.get_or_insert(me) != me {
            return Err(ExecError::Kernel(
                "the resident GPU runner records on one lane thread only; give its plan a single GPU processor".into(),
            ));
        }
        let open = OPEN.with(|open| open.borrow_mut().take());
        let (mut batch, recorded) = match open {
            Some(open) if open.runner == self.id => (open.batch, open.stages),
            // Nothing open, or what a failed prefill left: start afresh.
            _ => (
                GpuBatch::owned(self.model.context.clone()).map_err(gpu_err)?,
                0,
            ),
        };
        let stamp = 2 * (chunk * self.steps.len() + stage);
        if let Some(timer) = &self.timer {
            batch.timestamp(timer, stamp).map_err(gpu_err)?;
        }
        let mut reads_logits = false;
        for &step in steps {
            reads_logits |= self.record(&mut batch, &mut state, step, layer, chunk)?;
        }
        if let Some(timer) = &self.timer {
            batch.timestamp(timer, stamp + 1).map_err(gpu_err)?;
        }
        if reads_logits {
            // Runs after every stage recorded or submitted before it: its wait is the
            // prefill's.
            let out = batch.submit().map_err(gpu_err)?;
            *self.logits.lock() = out.reads.into_iter().next();
        } else if recorded + 1 >= STAGES_PER_SUBMISSION {
            batch.submit_async().map_err(gpu_err)?;
        } else {
            OPEN.with(|open| {
                *open.borrow_mut() = Some(OpenBatch {
                    runner: self.id,
                    batch,
                    stages: recorded + 1,
                })
            });
        }
        Ok(())
    }

    /// When each stage ran on the device; `None` without timestamps. Read after the
    /// prefill.
    pub fn device_times(&self) -> Result<Option<Vec<DeviceTime>>, ExecError> {
        let Some(timer) = &self.timer else {
            return Ok(None);
        };
        let stamps = timer.read_ns().map_err(gpu_err)?;
        let stages = self.steps.len().max(1);
        Ok(Some(
            stamps
                .chunks_exact(2)
                .enumerate()
                .filter_map(|(i, pair)| {
                    let key = InstanceKey {
                        chunk: (i / stages) as u32,
                        stage: (i % stages) as u32,
                    };
                    Some(DeviceTime {
                        key,
                        start_ns: pair[0]?,
                        end_ns: pair[1]?,
                    })
                })
                .collect(),
        ))
    }

    fn layer(&self, layer: usize) -> Result<&GpuLayer, ExecError> {
        self.model
            .layers
            .get(layer)
            .ok_or_else(|| ExecError::Kernel(format!("layer {layer} is not in the model")))
    }

    /// Records one step; returns whether it reads the logits back.
    fn record(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        step: Step,
        layer: usize,
        chunk: usize,
    ) -> Result<bool, ExecError> {
        let c = &self.model.host.config;
        let t = &mut state.chunks[chunk];
        let take = |t: &mut ChunkTensors, v: Value| -> Result<(), ExecError> {
            t.require(v, step, chunk)?;
            t.ready &= !v.bit();
            Ok(())
        };
        match step {
            Step::Embed => {
                let hidden = c.hidden;
                let embd = &self.model.host.token_embd;
                let mut x = Vec::with_capacity(t.rows * hidden);
                for &id in &self.tokens[t.pos0..t.pos0 + t.rows] {
                    let row = id as usize;
                    x.extend_from_slice(&embd[row * hidden..(row + 1) * hidden]);
                }
                b.write(&t.x, 0, &x).map_err(gpu_err)?;
            }
            Step::Norm(site) => {
                let weight = match site {
                    NormSite::Attention => &self.layer(layer)?.attn_norm,
                    NormSite::Ffn => &self.layer(layer)?.ffn_norm,
                    NormSite::Final => &self.model.output_norm,
                };
                if site == NormSite::Final && !self.all_logits {
                    // Prefill needs the last token's logits only.
                    b.copy_rows(&t.x, t.rows - 1..t.rows, &t.last, 0)
                        .map_err(gpu_err)?;
                    b.rms_norm(&t.last, weight, c.norm_eps, &t.last_normed)
                        .map_err(gpu_err)?;
                    t.head_on_last = true;
                } else {
                    b.rms_norm(&t.x, weight, c.norm_eps, &t.normed)
                        .map_err(gpu_err)?;
                }
                t.ready |= Value::Normed.bit();
            }
            // f32 linears: the activation is read as it is.
            Step::QuantizeNormed(_) => {
                take(t, Value::Normed)?;
                t.act = Some(Value::Normed);
            }
            Step::QuantizeAttention => {
                take(t, Value::Attn)?;
                t.act = Some(Value::Attn);
            }
            // An f32 model has no outliers and so no shadow stages; a plan that has one was
            // not built for this runner.
            Step::Shadow(site) => {
                return Err(ExecError::UnsupportedOp {
                    op: site.op_name(),
                    stage: "the resident GPU path (f32 only)".into(),
                });
            }
            Step::Linear(p) => {
                let act = t
                    .act
                    .ok_or_else(|| ExecError::missing(step, chunk, "activation"))?;
                let w = self.layer(layer)?.linear(p);
                b.matmul_f32(t.matrix(act), w, t.projection_out(p))
                    .map_err(gpu_err)?;
                match p {
                    Projection::K | Projection::V => {
                        let rows = &mut state.kv[layer][chunk];
                        let (mut k, mut v) = match *rows {
                            KvRows::Pending { k, v } => (k, v),
                            _ => (false, false),
                        };
                        k |= p == Projection::K;
                        v |= p == Projection::V;
                        *rows = KvRows::Pending { k, v };
                    }
                    Projection::Q => t.ready |= Value::Q.bit(),
                    Projection::O => t.ready |= Value::O.bit(),
                    Projection::Gate => t.ready |= Value::Gate.bit(),
                    Projection::Up => t.ready |= Value::Up.bit(),
                    Projection::Down => t.ready |= Value::Down.bit(),
                }
            }
            // f32 queries need no dequantization; they must exist all the same.
            Step::DequantizeQkv => t.require(Value::Q, step, chunk)?,
            Step::Rope => {
                t.require(Value::Q, step, chunk)?;
                b.rope(&t.q, &t.angles, c.n_heads, c.rope_style)
                    .map_err(gpu_err)?;
                self.write_kv(b, state, layer, chunk)?;
            }
            Step::Attention => {
                for earlier in 0..=chunk {
                    self.write_kv(b, state, layer, earlier)?;
                }
                let t = &mut state.chunks[chunk];
                take(t, Value::Q)?;
                let shape = AttentionShape {
                    n_tokens: t.rows,
                    pos0: t.pos0,
                    kv_len: t.pos0 + t.rows,
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                };
                let (k_cache, v_cache) = &state.caches[layer];
                b.attention(&t.q, (k_cache, v_cache), &shape, &t.attn)
                    .map_err(gpu_err)?;
                t.ready |= Value::Attn.bit();
            }
            Step::DequantizeO => {
                take(t, Value::O)?;
                t.delta = Some(Value::O);
            }
            Step::DequantizeDown => {
                take(t, Value::Down)?;
                t.delta = Some(Value::Down);
            }
            Step::Residual => {
                let d = t
                    .delta
                    .take()
                    .ok_or_else(|| ExecError::missing(step, chunk, "delta"))?;
                b.add_assign(&t.x, t.matrix(d)).map_err(gpu_err)?;
            }
            Step::SiluMul => {
                take(t, Value::Gate)?;
                take(t, Value::Up)?;
                b.silu_mul(&t.gate, &t.up, &t.hidden).map_err(gpu_err)?;
                t.act = Some(Value::Hidden);
            }
            Step::LmHead => {
                take(t, Value::Normed)?;
                let x = if t.head_on_last {
                    &t.last_normed
                } else {
                    &t.normed
                };
                if x.rows() != state.logits.rows() {
                    return Err(ExecError::Kernel(format!(
                        "the head of chunk {chunk} has {} rows, the logits {}: only the last chunk runs the head",
                        x.rows(),
                        state.logits.rows()
                    )));
                }
                b.matmul_f32(x, &self.model.output, &state.logits)
                    .map_err(gpu_err)?;
                b.read(&state.logits, 0..state.logits.rows())
                    .map_err(gpu_err)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rotates chunk `chunk`'s keys of `layer` and copies its keys and values into the
    /// cache, once (see the module note).
    fn write_kv(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        match state.kv[layer][chunk] {
            KvRows::Written => return Ok(()),
            KvRows::Pending { k: true, v: true } => {}
            _ => {
                return Err(ExecError::missing(
                    Step::Attention,
                    chunk,
                    "keys and values",
                ));
            }
        }
        let c = &self.model.host.config;
        let t = &state.chunks[chunk];
        let (k_cache, v_cache) = &state.caches[layer];
        b.rope(&t.k, &t.angles, c.n_kv_heads, c.rope_style)
            .map_err(gpu_err)?;
        b.copy_rows(&t.k, 0..t.rows, k_cache, t.pos0)
            .map_err(gpu_err)?;
        b.copy_rows(&t.v, 0..t.rows, v_cache, t.pos0)
            .map_err(gpu_err)?;
        state.kv[layer][chunk] = KvRows::Written;
        Ok(())
    }
}

impl JobRunner for GpuStageRunner {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        Ok(self.run_stage(job.key)?)
    }

    fn uses_pool(&self) -> bool {
        false
    }
}
