//! A generation session: one request's token history and KV cache, extended by scheduled
//! prefills (a prompt, or a later turn's new tokens) and by decode steps.
//!
//! Every prefill goes through the scheduler exactly as [`crate::prefill`] does (a
//! [`PrefillPlan`] of the new tokens, the engine, thread-backed queues, a
//! [`StageRunner`]); the difference is that the runner's state continues the session's
//! KV cache ([`PrefillState::continuing`]): the cache is moved into the run and back out,
//! never copied, and it has room for the tokens still to come. A decode step
//! ([`DecodePath::Scheduled`]) is the same: a one-token plan on the CPU lanes, built once,
//! whose subgraph instances (per layer; then the head) the engine resolves and dispatches
//! through the same systems. Every run of the session, prefill or decode step, is armed
//! in the session's one long-lived world ([`RequestWorld`]), where the request is an
//! entity ([`hetsched_systems::Request`]) and the schedule is built once; a decode step's jobs run inline
//! on the session's pool ([`InlineQueue`]). [`DecodePath::Direct`] runs the same
//! operators as one chain of matrix-vector kernels, without the scheduler.

mod scheduled;

pub use super::decode_path::{DecodePath, DecodeTime, WeightBytes};

use std::sync::Arc;
use std::time::Instant;

use hetsched_runtime::engine::RunOutcome;
use hetsched_runtime::request_world::RequestWorld;
use hetsched_systems::resources::{Job, SliceRecord};
use hetsched_systems::{DEFAULT_DECODE_LAYERS_PER_STAGE, PolicyRegistry};
use parking_lot::RwLock;

use super::decode_run::DecodeRun;
use super::direct;
use super::error::GenerateError;
use super::gpu::{GpuLane, StepRow};
use super::head::QuantizedHead;
use crate::state::KvCache;
use crate::{
    ExecError, ExecModel, GpuUse, JobError, JobRunner, LinearPrecision, LinearWeights,
    PrefillOptions, StageRunner, ThreadQueues,
};

/// The job runner the session's queues call: whichever run is in progress.
#[derive(Default)]
struct CurrentRun(RwLock<Option<Arc<StageRunner>>>);

impl JobRunner for CurrentRun {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        let runner = self
            .0
            .read()
            .clone()
            .ok_or("no run of this session is in progress")?;
        Ok(runner.run(job.key, job.processor)?)
    }
}

/// One request: its tokens so far, their KV cache, and the logits of the next token.
pub struct Session {
    model: Arc<ExecModel>,
    options: PrefillOptions,
    path: DecodePath,
    pub(super) pool: Arc<rayon::ThreadPool>,
    policies: PolicyRegistry,
    current: Arc<CurrentRun>,
    queues: ThreadQueues,
    /// Tokens whose keys and values are in the cache, from position 0.
    tokens: Vec<u32>,
    /// Per layer; `None` while a run has them or after a failed run.
    caches: Option<Vec<KvCache>>,
    /// Positions the caches hold.
    capacity: usize,
    logits: Option<Vec<f32>>,
    /// The last token sampled and not fed yet (a turn ends on one): the next turn's
    /// prefill starts with it.
    pub(super) pending: Option<u32>,
    /// The scheduled decode steps' plan and runner, built at the first step and kept:
    /// each step restarts the runner's state in place ([`PrefillState::restart`]).
    decode: Option<DecodeRun>,
    /// Decoder layers per subgraph instance of a scheduled decode step on one processor.
    decode_layers: u32,
    /// The request's long-lived scheduler world.
    world: RequestWorld,
    /// With [`GpuUse::Resident`]: the weights and KV cache on the GPU, where every run
    /// of the session goes (the host `caches` stay empty).
    gpu: Option<GpuLane>,
    /// The greedy next token a GPU decode step chose on the device.
    gpu_next: Option<u32>,
    /// Whether GPU decode steps read the logits back (off while a greedy turn samples
    /// on the device).
    gpu_logits: bool,
    /// The quantized head of direct steps (none: the model's f32 head).
    head: Option<QuantizedHead>,
    buffers: direct::DecodeBuffers,
    decode_time: DecodeTime,
    /// A prefill started and not yet returned ([`Session::start_prefill`]).
    started: Option<StartedPrefill>,
}

/// A prefill between [`Session::start_prefill`] and its end.
enum StartedPrefill {
    /// Armed in the session's world; its runner holds the session's KV cache.
    Scheduled(scheduled::ScheduledPrefill),
    /// Ran whole at its start (the GPU lane), its result kept for the resume.
    Finished((RunOutcome, u64)),
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model.name)
            .field("path", &self.path)
            .field("tokens", &self.tokens.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Session {
    /// An empty session of `model`: prefills scheduled under `options` (CPU and
    /// emulated-NPU lanes, or a GPU float lane), decode steps on `path`.
    pub fn new(
        model: Arc<ExecModel>,
        options: PrefillOptions,
        path: DecodePath,
    ) -> Result<Self, GenerateError> {
        Self::with_pool(model, options, path, None)
    }

    /// [`Session::new`] whose kernels run on `pool` (shared by the sessions of one
    /// engine) rather than a pool of its own of `options.threads` threads.
    pub fn with_pool(
        model: Arc<ExecModel>,
        options: PrefillOptions,
        path: DecodePath,
        pool: Option<Arc<rayon::ThreadPool>>,
    ) -> Result<Self, GenerateError> {
        options.validate()?;
        let gpu = match options.gpu {
            GpuUse::Resident if path != DecodePath::Scheduled => {
                return Err(ExecError::InvalidOption {
                    option: "decode",
                    message: "with every stage resident on the GPU, decode steps are scheduled \
                              on the GPU lane (the KV cache lives there): use the scheduled \
                              decode path"
                        .into(),
                }
                .into());
            }
            GpuUse::Resident => Some(GpuLane::open(
                &model,
                &options.gpu_kernels,
                options.gpu_weights,
            )?),
            _ => None,
        };
        let threads = options.threads;
        let pool = match pool {
            Some(pool) => pool,
            None => Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("hetsched-worker-{i}"))
                    .build()
                    .map_err(|e| ExecError::Threads {
                        threads,
                        reason: e.to_string(),
                    })?,
            ),
        };
        let device = crate::prefill_device(&options);
        let current = Arc::new(CurrentRun::default());
        let queues = ThreadQueues::start(device.processors.len(), current.clone(), pool.clone())
            .map_err(|e| ExecError::Threads {
                threads,
                reason: e.to_string(),
            })?;
        let layers = model.layers.len();
        let head = match path {
            DecodePath::Direct => QuantizedHead::own_width(&model),
            DecodePath::DirectInt8Head => {
                (model.precision != LinearPrecision::F32).then(|| QuantizedHead::int8(&model))
            }
            DecodePath::DirectF32Head | DecodePath::Scheduled => None,
        };
        Ok(Self {
            head,
            model,
            options,
            path,
            pool,
            policies: PolicyRegistry::builtin(),
            current,
            queues,
            tokens: Vec::new(),
            caches: Some((0..layers).map(|_| KvCache::default()).collect()),
            capacity: 0,
            logits: None,
            pending: None,
            decode: None,
            decode_layers: DEFAULT_DECODE_LAYERS_PER_STAGE,
            world: RequestWorld::new(0),
            gpu,
            gpu_next: None,
            gpu_logits: true,
            buffers: direct::DecodeBuffers::default(),
            decode_time: DecodeTime::default(),
            started: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<ExecModel> {
        &self.model
    }

    /// Tokens in the KV cache, from position 0.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits of the token after [`Self::tokens`], once anything ran (not after a GPU
    /// decode step of a greedy turn of [`Self::generate`], which reads back only the
    /// token the device chose).
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    /// Sets how many consecutive decoder layers one subgraph instance of a scheduled
    /// decode step holds (on a decode device of one processor; default
    /// [`DEFAULT_DECODE_LAYERS_PER_STAGE`]; 1: an instance per layer). The step computes
    /// the same either way; fewer instances cost the scheduler less
    /// ([`hetsched_systems::decode_plan`]).
    ///
    /// # Errors
    /// [`ExecError::InvalidOption`] for 0.
    pub fn set_decode_layers(&mut self, layers: u32) -> Result<(), GenerateError> {
        if layers == 0 {
            return Err(ExecError::InvalidOption {
                option: "decode layers",
                message: "0 layers per decode instance runs nothing; give at least 1".into(),
            }
            .into());
        }
        self.decode_layers = layers;
        self.decode = None;
        Ok(())
    }

    /// Subgraph instances of one scheduled decode step, once the first has run.
    pub fn decode_instances(&self) -> Option<usize> {
        self.decode.as_ref().map(DecodeRun::instances)
    }

    /// Time spent in decode steps so far.
    pub fn decode_time(&self) -> DecodeTime {
        self.decode_time
    }

    /// Weight bytes one decode step reads: the layers' linears, and the head the
    /// session's decode path runs (quantized, or the model's f32 head). The outlier
    /// shadow's float rows are not counted (read only for outlier channels).
    pub fn weight_bytes_per_token(&self) -> WeightBytes {
        let layers = self.model.layers.iter();
        let head = match &self.head {
            Some(head) => head.bytes(),
            None => 4 * (self.model.output.n() * self.model.output.k()) as u64,
        };
        WeightBytes {
            layers: layers
                .flat_map(|l| &l.linears)
                .map(LinearWeights::bytes)
                .sum(),
            head,
        }
    }

    /// Makes room in the KV cache for `positions` positions in all (it grows in place;
    /// written rows stay where they are).
    pub fn reserve(&mut self, positions: usize) -> Result<(), GenerateError> {
        self.check_not_started()?;
        let context = self.model.config.context_length;
        let positions = positions.min(context);
        if positions <= self.capacity {
            return Ok(());
        }
        if let Some(gpu) = &mut self.gpu {
            gpu.reserve(positions, self.tokens.len())?;
            self.capacity = positions;
            return Ok(());
        }
        let kv_dim = self.model.config.kv_dim();
        for cache in self.caches_mut()? {
            cache.k.resize(positions * kv_dim, 0.0);
            cache.v.resize(positions * kv_dim, 0.0);
        }
        self.capacity = positions;
        Ok(())
    }

    /// Refuses to touch the tokens or the cache while a started prefill holds them.
    fn check_not_started(&self) -> Result<(), GenerateError> {
        match self.started {
            Some(_) => Err(GenerateError::PrefillOrder(
                "a prefill of this session is paused: resume it before feeding more tokens",
            )),
            None => Ok(()),
        }
    }

    fn caches_mut(&mut self) -> Result<&mut Vec<KvCache>, GenerateError> {
        self.caches.as_mut().ok_or_else(broken)
    }

    /// Checks that `new` tokens fit after the history: in the vocabulary, in the context.
    fn check_tokens(&self, new: &[u32]) -> Result<(), GenerateError> {
        self.check_not_started()?;
        let c = &self.model.config;
        if new.is_empty() {
            return Err(GenerateError::EmptyTurn);
        }
        if let Some(&id) = new.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ExecError::TokenOutOfRange {
                id,
                vocab: c.vocab_size,
            }
            .into());
        }
        if self.tokens.len() + new.len() > c.context_length {
            return Err(GenerateError::BeyondContext {
                history: self.tokens.len(),
                prompt: new.len(),
                max_tokens: 0,
                context: c.context_length,
            });
        }
        Ok(())
    }

    /// Prefills `new` after the history through the scheduler (chunks of the options'
    /// length), leaving the logits of the token after it. Returns the schedule that ran
    /// and the time spent building and compiling its plan, ns.
    pub fn prefill(&mut self, new: &[u32]) -> Result<(RunOutcome, u64), GenerateError> {
        self.start_prefill(new)?;
        self.resume_prefill(&|| false)?
            .ok_or(GenerateError::PrefillOrder(
                "a prefill that may not pause paused",
            ))
    }

    /// Starts prefilling `new` after the history, to be run by
    /// [`Session::resume_prefill`], which may pause it at a subgraph boundary so that
    /// another session's run takes the processors (a many-requests engine preempting a
    /// long prefill). On the GPU lane the whole prefill runs here.
    pub fn start_prefill(&mut self, new: &[u32]) -> Result<(), GenerateError> {
        self.check_tokens(new)?;
        self.reserve(self.tokens.len() + new.len())?;
        if self.gpu.is_some() {
            let ran = self.prefill_on_gpu(new)?;
            self.started = Some(StartedPrefill::Finished(ran));
            return Ok(());
        }
        let planning = Instant::now();
        let device = crate::prefill_device(&self.options);
        let compiled = self.compile(new.len() as u32, self.options.chunk_len, device)?;
        let plan_ns = planning.elapsed().as_nanos() as u64;
        self.start_scheduled(new, &compiled, plan_ns)
    }

    /// Runs the started prefill until it ends (its schedule and planning time, as
    /// [`Session::prefill`] returns) or until `yield_now`, asked after each completion,
    /// says another run wants the processors: then it pauses at the next subgraph
    /// boundary, nothing of it in flight, and returns `None`; call again to resume.
    pub fn resume_prefill(
        &mut self,
        yield_now: &dyn Fn() -> bool,
    ) -> Result<Option<(RunOutcome, u64)>, GenerateError> {
        match self.started.take() {
            None => Err(GenerateError::PrefillOrder(
                "no prefill of this session was started to resume",
            )),
            Some(StartedPrefill::Finished(ran)) => Ok(Some(ran)),
            Some(StartedPrefill::Scheduled(run)) => self.advance_scheduled(run, yield_now),
        }
    }

    /// Feeds `token` (the one just generated) and leaves the logits of the next.
    pub fn step(&mut self, token: u32) -> Result<(), GenerateError> {
        self.check_tokens(&[token])?;
        let needed = self.tokens.len() + 1;
        if needed > self.capacity {
            // Doubling keeps growth (a copy of the written rows) rare.
            self.reserve(needed.max(2 * self.capacity))?;
        }
        let started = Instant::now();
        let busy_ns = match self.path {
            DecodePath::Scheduled => {
                let outcome = match self.gpu.is_some() {
                    true => self.step_on_gpu(token)?,
                    false => self.decode_scheduled(token)?,
                };
                let slices = outcome.timeline.slices;
                slices.iter().map(SliceRecord::duration_ns).sum()
            }
            DecodePath::Direct | DecodePath::DirectF32Head | DecodePath::DirectInt8Head => {
                let position = self.tokens.len();
                let kernel_ns = self.buffers.kernel_ns();
                let caches = self.caches.as_mut().ok_or_else(broken)?;
                let (model, head, buffers) = (&self.model, self.head.as_ref(), &mut self.buffers);
                let logits = self.pool.install(|| {
                    direct::decode_step(model, head, caches, token, position, buffers)
                })?;
                self.tokens.push(token);
                // The superseded logits are the next step's buffer.
                if let Some(read) = self.logits.replace(logits) {
                    self.buffers.recycle_logits(read);
                }
                self.buffers.kernel_ns() - kernel_ns
            }
        };
        self.decode_time.steps += 1;
        self.decode_time.wall_ns += started.elapsed().as_nanos() as u64;
        self.decode_time.busy_ns += busy_ns;
        Ok(())
    }

    /// The history's KV cache (per layer) and the positions it holds, which batched
    /// steps of sequences after the history read as their shared prefix.
    pub(crate) fn history_cache(&self) -> Result<(&[KvCache], usize), GenerateError> {
        Ok((
            self.caches.as_deref().ok_or_else(broken)?,
            self.tokens.len(),
        ))
    }

    /// Refuses batched decode steps on a session whose steps are scheduled on the CPU
    /// (on the GPU lane they are [`Self::step_rows_on_gpu`]).
    pub(super) fn check_batched(&self) -> Result<(), GenerateError> {
        if self.path == DecodePath::Scheduled && self.gpu.is_none() {
            return Err(ExecError::InvalidOption {
                option: "decode",
                message: "batched decode steps (parallel samples) run on the direct path on \
                          the CPU, or resident on the GPU; use the direct decode path"
                    .into(),
            }
            .into());
        }
        Ok(())
    }

    /// The most sequences one batched step takes: on the GPU lane as many as its
    /// decoder steps together (one where its layers do not run as one dispatch), on the
    /// CPU no limit of its own.
    pub(super) fn batched_rows(&self) -> Option<usize> {
        self.gpu.as_ref().map(GpuLane::batched_rows)
    }

    /// Makes room on the GPU lane for `rows` cache rows (a shared prefix and the
    /// samples' own positions after it), keeping the history's rows. Nothing on the CPU.
    pub(super) fn reserve_gpu_rows(&mut self, rows: usize) -> Result<(), GenerateError> {
        let written = self.tokens.len();
        match &mut self.gpu {
            Some(gpu) if gpu.capacity() < rows => Ok(gpu.reserve(rows, written)?),
            _ => Ok(()),
        }
    }

    /// One batched decode step on the GPU lane (`rows`: each sequence's token, position
    /// and cache rows, every position below `keys`), timed as the session's decode steps;
    /// returns each row's greedy token, or with `want_logits` each row's logits.
    pub(super) fn step_rows_on_gpu(
        &mut self,
        rows: &[StepRow],
        keys: usize,
        want_logits: bool,
    ) -> Result<Chosen, GenerateError> {
        let started = Instant::now();
        let gpu = self.gpu.as_mut().ok_or_else(broken)?;
        let out = gpu.step_rows(rows, keys, want_logits)?;
        let wall_ns = started.elapsed().as_nanos() as u64;
        self.decode_time.steps += 1;
        self.decode_time.wall_ns += wall_ns;
        self.decode_time.busy_ns += wall_ns;
        let vocab = self.model.config.vocab_size;
        Ok(match out.logits {
            Some(logits) => Chosen::Logits(logits.chunks(vocab).map(<[f32]>::to_vec).collect()),
            None => Chosen::Tokens(out.next),
        })
    }

    /// One batched decode step of sequences that continue the session's history (parallel
    /// samples): `sequences[i]` is a token, its position (at or after the history's
    /// end) and the sequence's own cache for the positions after the history, per layer.
    /// The history's cache is shared, read only. Returns each sequence's logits.
    pub(super) fn step_after_history(
        &mut self,
        sequences: &mut [(u32, usize, &mut [KvCache])],
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        self.check_batched()?;
        if self.gpu.is_some() {
            return Err(ExecError::Kernel(
                "a session resident on the GPU keeps its cache there: its batched steps are \
                 GPU steps"
                    .into(),
            )
            .into());
        }
        let vocab = self.model.config.vocab_size;
        if let Some(&(id, ..)) = sequences.iter().find(|s| s.0 as usize >= vocab) {
            return Err(ExecError::TokenOutOfRange { id, vocab }.into());
        }
        let started = Instant::now();
        let shared_len = self.tokens.len();
        let shared = self.caches.as_deref().ok_or_else(broken)?;
        let mut steps: Vec<_> = sequences
            .iter_mut()
            .map(|(token, position, own)| super::sequence_kv::SequenceStep {
                token: *token,
                position: *position,
                kv: super::sequence_kv::SequenceKv::after_prefix(shared, shared_len, own),
            })
            .collect();
        let (model, head, buffers) = (&self.model, self.head.as_ref(), &mut self.buffers);
        let logits = self
            .pool
            .install(|| direct::decode_batch(model, head, &mut steps, buffers))?;
        let wall_ns = started.elapsed().as_nanos() as u64;
        self.decode_time.steps += 1;
        self.decode_time.wall_ns += wall_ns;
        self.decode_time.busy_ns += wall_ns;
        Ok(logits)
    }

    /// Prefills `new` after the history on the GPU lane; the plan is built inside the run
    /// (its time is reported as 0).
    fn prefill_on_gpu(&mut self, new: &[u32]) -> Result<(RunOutcome, u64), GenerateError> {
        let policy = self
            .policies
            .create(&self.options.policy)
            .map_err(ExecError::from)?;
        let pos0 = self.tokens.len();
        let mut tokens = self.tokens.clone();
        tokens.extend_from_slice(new);
        let gpu = self.gpu.as_mut().ok_or_else(broken)?;
        let at = (pos0, self.options.chunk_len);
        let (outcome, logits) = gpu.prefill(&mut self.world, policy, &tokens, at)?;
        self.finish_gpu_run(tokens, Some(logits), None);
        Ok((outcome, 0))
    }

    /// One decode step of `token` on the GPU lane.
    fn step_on_gpu(&mut self, token: u32) -> Result<RunOutcome, GenerateError> {
        let policy = self
            .policies
            .create(&self.options.policy)
            .map_err(ExecError::from)?;
        let mut tokens = self.tokens.clone();
        tokens.push(token);
        let gpu = self.gpu.as_mut().ok_or_else(broken)?;
        let want_logits = self.gpu_logits;
        let (outcome, out) = gpu.step(&mut self.world, policy, &tokens, want_logits)?;
        self.finish_gpu_run(tokens, out.logits, out.next.first().copied());
        Ok(outcome)
    }

    fn finish_gpu_run(&mut self, tokens: Vec<u32>, logits: Option<Vec<f32>>, next: Option<u32>) {
        self.tokens = tokens;
        self.logits = logits;
        self.gpu_next = next;
        self.world.set_cached_tokens(self.tokens.len());
    }

    /// The greedy next token a GPU decode step chose on the device, if the last run was
    /// one.
    pub(super) fn gpu_greedy_next(&self) -> Option<u32> {
        self.gpu_next
    }

    /// Whether GPU decode steps read the logits back; a greedy turn turns it off (the
    /// device chooses the token).
    pub(super) fn set_gpu_logits(&mut self, read: bool) {
        self.gpu_logits = read;
    }
}

/// What a batched step gave each of its sequences, in order.
pub(super) enum Chosen {
    /// Their logits, to sample from.
    Logits(Vec<Vec<f32>>),
    /// The tokens the GPU chose (greedy).
    Tokens(Vec<u32>),
}

fn broken() -> GenerateError {
    ExecError::Kernel("the session's KV cache was lost in a failed run: start a new session".into())
        .into()
}
