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

mod decode;
mod family;
mod model;
mod record;
mod tensors;

use std::sync::Arc;

use hetsched_gpu::{GpuBatch, GpuContext, GpuMatrix, GpuTimer};
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::resources::Job;
use parking_lot::Mutex;

use super::ActivationBytes;
use super::error::ExecError;
use super::queues::{JobError, JobRunner};
use super::steps::Step;
use super::walk::walk;
pub use decode::{DecodeOutput, DecodeStages, GpuDecode, StepRow};
use model::GpuLayer;
pub use model::{GpuModel, ResidentWeights};
use record::Recorder;
use tensors::{ChunkTensors, NonFiniteFlags, RunState, alloc_caches};

fn gpu_err(e: hetsched_gpu::GpuError) -> ExecError {
    ExecError::Gpu(e.to_string())
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
    /// The non-finite flags, read back with the logits.
    nonfinite: Mutex<Option<Vec<f32>>>,
    activation_bytes: ActivationBytes,
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
        let c = &model.host.config;
        let caches = alloc_caches(&model.context, c, model.layers.len(), tokens.len())?;
        let plan = (steps, layers);
        let run = (0, chunk_len, all_logits, timestamps);
        Self::continuing(model, plan, tokens, caches, run)
    }

    /// Like [`Self::new`], but computing only `tokens[pos0..]` over `caches` (one key and
    /// value cache per layer, from [`GpuModel::alloc_caches`]), which already hold
    /// positions `0..pos0` and have rows for every token: a later turn, or one decode step
    /// (a chunk of one token), continues the cache in place on the device.
    /// [`Self::take_caches`] hands the caches back afterwards. `run` is `(pos0, chunk_len,
    /// all_logits, timestamps)`.
    pub fn continuing(
        model: Arc<GpuModel>,
        (steps, layers): (Vec<Vec<Step>>, Vec<Option<u32>>),
        tokens: Vec<u32>,
        caches: Vec<(GpuMatrix, GpuMatrix)>,
        (pos0, chunk_len, all_logits, timestamps): (usize, usize, bool, bool),
    ) -> Result<Self, ExecError> {
        let ctx = &model.context;
        let c = &model.host.config;
        let short = caches.iter().find(|(k, _)| k.rows() < tokens.len());
        if caches.len() != model.layers.len() || short.is_some() || pos0 >= tokens.len() {
            return Err(ExecError::Kernel(format!(
                "a resident GPU run of positions {pos0}..{} needs {} layer caches of that many rows",
                tokens.len(),
                model.layers.len()
            )));
        }
        let mut activation_bytes = ActivationBytes::default();
        let chunks = (pos0..tokens.len())
            .step_by(chunk_len.max(1))
            .map(|pos0| {
                let rows = chunk_len.min(tokens.len() - pos0);
                let plan = (steps.as_slice(), layers.as_slice());
                ChunkTensors::alloc(ctx, c, (pos0, rows), plan, &mut activation_bytes)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let timer = match timestamps {
            true => ctx.timer(2 * steps.len() * chunks.len()).map_err(gpu_err)?,
            false => None,
        };
        let n_layers = model.layers.len();
        let head = (c.vocab_size, all_logits);
        let state = RunState::alloc(ctx, n_layers, chunks, caches, head)?;
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
            nonfinite: Mutex::new(None),
            activation_bytes,
        })
    }

    /// The layers' KV caches, moved out (after the run: positions up to the last token
    /// written); the runner is spent.
    pub fn take_caches(&self) -> Vec<(GpuMatrix, GpuMatrix)> {
        std::mem::take(&mut self.state.lock().caches)
    }

    /// The chunks' activation buffers: as planned (arenas) against one buffer per value.
    pub fn activation_bytes(&self) -> ActivationBytes {
        self.activation_bytes
    }

    /// Records stage `key.stage` of chunk `key.chunk` into the open command buffer, which
    /// is submitted without waiting every `STAGES_PER_SUBMISSION` stages (the device runs
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
        let mut recorder = Recorder {
            runner: self,
            batch: &mut batch,
            state: &mut state,
            layer,
            chunk,
            reads_logits: false,
        };
        walk(steps, &mut recorder)?;
        let reads_logits = recorder.reads_logits;
        if let Some(timer) = &self.timer {
            batch.timestamp(timer, stamp + 1).map_err(gpu_err)?;
        }
        if reads_logits {
            let rows = state.nonfinite.rows();
            batch.read(&state.nonfinite, 0..rows).map_err(gpu_err)?;
            // Runs after every stage recorded or submitted before it: its wait is the
            // prefill's.
            let out = batch.submit().map_err(gpu_err)?;
            let mut reads = out.reads.into_iter();
            *self.logits.lock() = reads.next();
            *self.nonfinite.lock() = reads.next();
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

    /// The first block whose output made the residual stream non-finite, in (chunk,
    /// layer) order, as [`ExecError::NonFiniteOnDevice`]; `Ok` when none did (or the
    /// head never ran). Every residual add on the device raises a flag for its block
    /// instead of reading activations back.
    pub fn check_finite(&self) -> Result<(), ExecError> {
        let flags = NonFiniteFlags {
            layers: self.model.layers.len(),
        };
        let raised = self
            .nonfinite
            .lock()
            .as_deref()
            .and_then(|f| flags.first_raised(f));
        match raised {
            None => Ok(()),
            Some((chunk, layer, block)) => Err(ExecError::NonFiniteOnDevice {
                layer,
                block,
                chunk,
            }),
        }
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
}

impl JobRunner for GpuStageRunner {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        Ok(self.run_stage(job.key)?)
    }

    fn uses_pool(&self) -> bool {
        false
    }
}
