//! A session's scheduled runs: a prefill's plan compiled and run in the session's world on
//! its thread queues, and scheduled decode steps (a one-token plan, its jobs inline).

use std::sync::Arc;

use hetsched_runtime::engine::{EngineOptions, RunOutcome};
use hetsched_runtime::request_world::Advance;
use hetsched_systems::{DeviceProfile, PrefillPlan, ProcessorKind, Workload};

use super::{Session, StartedPrefill, broken};
use crate::float_kernels::FloatKernels;
use crate::generate::decode_run::DecodeRun;
use crate::generate::error::GenerateError;
use crate::generate::inline::InlineQueue;
use crate::state::PrefillState;
use crate::{ExecError, GpuUse, PrefillOptions, StageRunner, Step, lane_kernels, take_logits};

/// The stages of one plan compiled for the runner.
pub(super) struct Compiled {
    pub(super) plan: Arc<PrefillPlan>,
    steps: Vec<Vec<Step>>,
    layers: Vec<Option<u32>>,
    /// Float kernels per processor of the plan's device.
    lanes: Vec<Arc<dyn FloatKernels>>,
}

impl Session {
    /// The plan of `tokens` new tokens in chunks of `chunk_len` on `device`, compiled.
    pub(super) fn compile(
        &self,
        tokens: u32,
        chunk_len: u32,
        device: DeviceProfile,
    ) -> Result<Compiled, GenerateError> {
        let o = &self.options;
        let gpu = device
            .processors
            .iter()
            .any(|p| p.kind == ProcessorKind::Gpu);
        let float_processor = (o.gpu == GpuUse::FloatLane && gpu).then(|| "gpu".to_string());
        let lanes = lane_kernels(&self.model, &device, &o.gpu_kernels)?;
        let plan = PrefillPlan::placed(
            self.model.model_config(),
            device,
            Workload {
                prompt_len: tokens,
                chunk_len,
                float_processor,
            },
            o.placement.clone(),
        )
        .map_err(ExecError::from)?;
        let steps = Step::compile_stages(&plan.stages)?;
        let layers = plan.stages.iter().map(|s| s.layer).collect();
        Ok(Compiled {
            plan: Arc::new(plan),
            steps,
            layers,
            lanes,
        })
    }

    /// One scheduled decode step of `token`: the step's plan (compiled at the first step)
    /// run in the session's world, its jobs inline on the session's pool
    /// ([`InlineQueue`]), by a runner kept across steps whose state moves the session's
    /// tokens and KV cache in and out.
    pub(super) fn decode_scheduled(&mut self, token: u32) -> Result<RunOutcome, GenerateError> {
        let mut decode = match self.decode.take() {
            Some(d) => d,
            None => self.decode_run()?,
        };
        let caches = self.caches.take().ok_or_else(broken)?;
        let mut tokens = std::mem::take(&mut self.tokens);
        let pos0 = tokens.len();
        tokens.push(token);
        decode.runner.state.restart(tokens, pos0, caches);
        let policy = self
            .policies
            .create(&self.options.policy)
            .map_err(ExecError::from);
        let outcome = policy.and_then(|policy| {
            let world = &mut self.world;
            let mut queue = InlineQueue::new(&decode);
            let options = EngineOptions::default();
            let plan = decode.plan.clone();
            let run = self
                .pool
                .install(|| world.run(plan, policy, true, &mut queue, &options));
            Ok(run?)
        });
        let state = &mut decode.runner.state;
        let finished = outcome.and_then(|o| Ok((o, take_logits(&state.logits)?)));
        // After a failure the rows past the history are stale; the next run rewrites them.
        self.caches = Some(state.take_caches());
        self.tokens = std::mem::take(&mut state.tokens);
        self.decode = Some(decode);
        let (outcome, logits) = match finished {
            Ok(done) => done,
            Err(e) => {
                self.tokens.truncate(pos0);
                return Err(e.into());
            }
        };
        self.logits = Some(logits);
        self.world.set_cached_tokens(self.tokens.len());
        Ok(outcome)
    }

    /// The scheduled decode steps' plan (its layers grouped `decode_layers` to an
    /// instance on a decode device of one processor) and their per-layer runner.
    pub(super) fn decode_run(&self) -> Result<DecodeRun, GenerateError> {
        let device = decode_device(&self.options);
        let per_layer = self.compile(1, 1, device.clone())?;
        let plan = match device.processors.len() {
            1 => Arc::new(
                PrefillPlan::decode_step(
                    self.model.model_config(),
                    device,
                    self.options.placement.clone(),
                    self.decode_layers,
                )
                .map_err(ExecError::from)?,
            ),
            _ => per_layer.plan.clone(),
        };
        let state = PrefillState::continuing(Vec::new(), 0, 1, Vec::new());
        let c = per_layer;
        let runner = StageRunner::new(self.model.clone(), c.steps, c.layers, c.lanes, state);
        Ok(DecodeRun::new(plan, &c.plan.stages, runner)?)
    }

    /// Arms `compiled` (the plan of `new`) in the session's world over the session's KV
    /// cache, which moves into the run's runner until it ends.
    pub(super) fn start_scheduled(
        &mut self,
        new: &[u32],
        compiled: &Compiled,
        plan_ns: u64,
    ) -> Result<(), GenerateError> {
        let policy = self
            .policies
            .create(&self.options.policy)
            .map_err(ExecError::from)?;
        let caches = self.caches.take().ok_or_else(broken)?;
        let pos0 = self.tokens.len();
        let mut tokens = self.tokens.clone();
        tokens.extend_from_slice(new);
        let chunk_len = compiled.plan.workload.chunk_len as usize;
        let state = PrefillState::continuing(tokens, pos0, chunk_len, caches);
        let runner = Arc::new(StageRunner::new(
            self.model.clone(),
            compiled.steps.clone(),
            compiled.layers.clone(),
            compiled.lanes.clone(),
            state,
        ));
        *self.current.0.write() = Some(runner.clone());
        let options = EngineOptions {
            cancel: self.options.cancel.clone(),
            ..EngineOptions::real_queues()
        };
        self.world.start(compiled.plan.clone(), policy, &options);
        self.started = Some(StartedPrefill::Scheduled(ScheduledPrefill {
            runner,
            plan_ns,
        }));
        Ok(())
    }

    /// Runs the started `run` on the session's thread queues until it ends (the cache and
    /// the new tokens back in the session, the logits after them kept) or pauses
    /// (`None`: `run` kept for the next resume).
    pub(super) fn advance_scheduled(
        &mut self,
        run: ScheduledPrefill,
        yield_now: &dyn Fn() -> bool,
    ) -> Result<Option<(RunOutcome, u64)>, GenerateError> {
        let outcome = match self.world.advance(&mut self.queues, yield_now) {
            Ok(Advance::Paused) => {
                self.started = Some(StartedPrefill::Scheduled(run));
                return Ok(None);
            }
            Ok(Advance::Finished(outcome)) => Ok(outcome),
            Err(e) => Err(ExecError::from(e)),
        };
        *self.current.0.write() = None;
        // Every job has finished (or the run failed): the runner is ours again. A failed
        // run whose job still holds it leaves the session without a cache (broken).
        let runner = Arc::try_unwrap(run.runner).map_err(|_| broken())?;
        let mut state = runner.state;
        let finished = outcome.and_then(|o| Ok((o, take_logits(&state.logits)?)));
        let tokens = std::mem::take(&mut state.tokens);
        // After a failure the rows past the history are stale; the next run rewrites them.
        self.caches = Some(state.into_caches());
        let (outcome, logits) = finished?;
        self.tokens = tokens;
        self.logits = Some(logits);
        self.world.set_cached_tokens(self.tokens.len());
        Ok(Some((outcome, run.plan_ns)))
    }
}

/// A scheduled prefill armed in the session's world and not finished: its runner holds
/// the session's KV cache until it ends.
pub(super) struct ScheduledPrefill {
    runner: Arc<StageRunner>,
    /// Time spent building and compiling its plan, ns.
    plan_ns: u64,
}

/// The device decode steps run on: the CPU lanes (seed 000 decodes on the CPU), or the
/// whole device if it has none. With one processor, each layer's stages merge.
fn decode_device(options: &PrefillOptions) -> DeviceProfile {
    let mut device = options.device.clone();
    let cpu: Vec<_> = device
        .processors
        .iter()
        .filter(|p| p.kind == ProcessorKind::Cpu)
        .cloned()
        .collect();
    if !cpu.is_empty() {
        device.processors = cpu;
    }
    device
}
