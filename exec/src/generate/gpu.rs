//! A session's runs with every stage resident on the GPU ([`crate::GpuUse::Resident`]):
//! the prefill and each decode step are plans on the one GPU lane, run in the session's
//! world by a [`GpuStageRunner`] that continues the session's KV cache on the device.
//!
//! The caches are one key and one value matrix per layer in device memory, with a row for
//! every position the session reserved; each run writes its rows in place and attends
//! over the rows before them, so nothing of the cache ever crosses to the host. A prefill
//! uploads its token embeddings and reads the logits back. A decode step is recorded once
//! per cache capacity and replayed (`GpuDecode`): the token and its position go
//! up in two words, the greedy next token comes back in one (the logits too only when the
//! caller samples on the host); its plan holds every decoder layer in one stage, then
//! the head (each stage is one submission of its recording).

#[cfg(feature = "gpu")]
mod lane {
    use std::sync::Arc;

    use hetsched_gpu::GpuMatrix;
    use hetsched_runtime::engine::{EngineOptions, RunOutcome};
    use hetsched_runtime::request_world::RequestWorld;
    use hetsched_systems::{PlacementConfig, Policy, PrefillPlan, Workload};

    use crate::generate::inline::InlineQueue;
    use crate::{
        DecodeOutput, DecodeStages, ExecError, ExecModel, GpuDecode, GpuKernelOptions, GpuModel,
        GpuStageRunner, GpuWeights, ResidentWeights, Step, StepRow, take_logits,
    };

    /// The model's weights and the session's KV cache on the device.
    pub(in crate::generate) struct GpuLane {
        model: Arc<GpuModel>,
        /// Per layer, `[capacity, kv_dim]` keys and values; `None` while a run has them
        /// or after a failed run.
        caches: Option<Vec<(GpuMatrix, GpuMatrix)>>,
        capacity: usize,
        /// The decode steps' buffers, made when the lane opens, and their recordings, made
        /// at the first step of each cache capacity (shared with the step's stages while it
        /// runs).
        decode: Option<Arc<GpuDecode>>,
        /// The decode step's plan (every layer in one stage, then the head).
        decode_plan: Option<Arc<PrefillPlan>>,
        /// The decoder of steps of several sequences (parallel samples), made at the first
        /// such step.
        batched: Option<GpuDecode>,
    }

    /// A plan for the GPU lane and its stages compiled.
    struct Plan {
        plan: Arc<PrefillPlan>,
        steps: Vec<Vec<Step>>,
        layers: Vec<Option<u32>>,
    }

    impl GpuLane {
        /// Opens the GPU, uploads `model`'s weights as `weights` asks (f16 only when
        /// asked by name: `Auto` is f32 here, so that a turn's greedy tokens are the CPU
        /// f32 path's) and warms the device up.
        pub(in crate::generate) fn open(
            model: &Arc<ExecModel>,
            kernels: &GpuKernelOptions,
            weights: GpuWeights,
        ) -> Result<Self, ExecError> {
            crate::gpu_open::gpu_computes(model)?;
            let weights = match weights {
                GpuWeights::F16 => ResidentWeights::F16,
                GpuWeights::F32 | GpuWeights::Auto => ResidentWeights::F32,
            };
            let gpu = Arc::new(GpuModel::upload_as(
                crate::gpu_open::gpu_context(kernels)?,
                model.clone(),
                weights,
            )?);
            gpu.warm_up()?;
            // The decode step's buffers and token embeddings (a vocab x hidden upload,
            // hundreds of ms) with the weights, so that the first step pays only its
            // recording.
            let decode = Arc::new(GpuDecode::new(gpu.clone())?);
            Ok(Self {
                model: gpu,
                caches: None,
                capacity: 0,
                decode: Some(decode),
                decode_plan: None,
                batched: None,
            })
        }

        /// Makes room for `positions` positions in all; `written` rows are kept (copied
        /// into the larger caches on the device).
        pub(in crate::generate) fn reserve(
            &mut self,
            positions: usize,
            written: usize,
        ) -> Result<(), ExecError> {
            if positions <= self.capacity && self.caches.is_some() {
                return Ok(());
            }
            let grown = self.model.alloc_caches(positions.max(self.capacity))?;
            if let Some(old) = self.caches.take().filter(|_| written > 0) {
                let failed = |e: hetsched_gpu::GpuError| ExecError::Gpu(e.to_string());
                let mut batch = self.model.context.batch_untimed().map_err(failed)?;
                for ((k, v), (k2, v2)) in old.iter().zip(&grown) {
                    batch.copy_rows(k, 0..written, k2, 0).map_err(failed)?;
                    batch.copy_rows(v, 0..written, v2, 0).map_err(failed)?;
                }
                batch.submit().map_err(failed)?;
            }
            self.capacity = positions.max(self.capacity);
            self.caches = Some(grown);
            // The recorded step wrote the old caches.
            match self.decode.as_mut().map(Arc::get_mut) {
                Some(Some(decode)) => decode.invalidate(),
                Some(None) => self.decode = None,
                None => {}
            }
            if let Some(batched) = &mut self.batched {
                batched.invalidate();
            }
            Ok(())
        }

        /// Rows of the caches (positions of one sequence, or a shared prefix and every
        /// sample's own positions).
        pub(in crate::generate) fn capacity(&self) -> usize {
            self.capacity
        }

        /// The most sequences one batched step ([`Self::step_rows`]) takes here: up to
        /// [`hetsched_gpu::DECODE_LAYER_MAX_ROWS`] where the layers run as the one-dispatch
        /// kernel, else one.
        pub(in crate::generate) fn batched_rows(&self) -> usize {
            GpuDecode::batched_rows_of(&self.model)
        }

        /// One decode step of several sequences over the session's device caches (`rows`,
        /// every position below `keys`), run here outside the session's plans, as the CPU
        /// lanes run their batched steps; returns each row's greedy token, and the logits
        /// with `want_logits`.
        pub(in crate::generate) fn step_rows(
            &mut self,
            rows: &[StepRow],
            keys: usize,
            want_logits: bool,
        ) -> Result<DecodeOutput, ExecError> {
            let caches = self.caches.as_ref().ok_or_else(lost)?;
            let batched = match &mut self.batched {
                Some(b) => b,
                None => {
                    let single = match &self.decode {
                        Some(d) => d.clone(),
                        None => Arc::new(GpuDecode::new(self.model.clone())?),
                    };
                    let batched = single.with_rows(single.batched_rows())?;
                    self.decode = Some(single);
                    self.batched.insert(batched)
                }
            };
            batched.prepare(caches, (rows, keys), want_logits)?;
            batched.run_now()
        }

        /// Prefills `tokens[pos0..]` (chunks of `chunk_len`) after the history in the
        /// device caches; returns the schedule that ran and the next token's logits.
        pub(in crate::generate) fn prefill(
            &mut self,
            world: &mut RequestWorld,
            policy: Box<dyn Policy>,
            tokens: &[u32],
            (pos0, chunk_len): (usize, u32),
        ) -> Result<(RunOutcome, Vec<f32>), ExecError> {
            let plan = self.plan(tokens.len().saturating_sub(pos0) as u32, chunk_len)?;
            self.run(world, (plan, policy), tokens, pos0)
        }

        /// One decode step: `tokens`' last token at its position, the step's recording
        /// replayed over the device caches (recorded at the first step of each cache
        /// capacity) through the step's plan in `world`; returns the greedy next token, and
        /// the logits with `want_logits`.
        pub(in crate::generate) fn step(
            &mut self,
            world: &mut RequestWorld,
            policy: Box<dyn Policy>,
            tokens: &[u32],
            want_logits: bool,
        ) -> Result<(RunOutcome, DecodeOutput), ExecError> {
            let (Some(&token), Some(caches)) = (tokens.last(), self.caches.as_ref()) else {
                return Err(lost());
            };
            let mut decode = match self.decode.take() {
                Some(d) => d,
                None => Arc::new(GpuDecode::new(self.model.clone())?),
            };
            let plan = match &self.decode_plan {
                Some(p) => p.clone(),
                None => {
                    let layers = self.model.host.config.n_layers as u32;
                    let plan = Arc::new(PrefillPlan::decode_step(
                        self.model.host.model_config(),
                        crate::resident_gpu_device(),
                        PlacementConfig::default(),
                        layers.max(1),
                    )?);
                    self.decode_plan = Some(plan.clone());
                    plan
                }
            };
            let row = [StepRow::alone(token, tokens.len() - 1)];
            let prepared = match Arc::get_mut(&mut decode) {
                Some(d) => d.prepare(caches, (&row, self.capacity), want_logits),
                None => Err(ExecError::Kernel(
                    "a GPU decode step is still held by an earlier step's stages".into(),
                )),
            };
            let outcome = prepared.and_then(|()| {
                let stages = DecodeStages {
                    decode: decode.clone(),
                    stage_layers: plan.stages.iter().map(|s| s.layer).collect(),
                };
                let mut queue = InlineQueue::new(&stages);
                let options = EngineOptions::default();
                Ok(world.run(plan, policy, true, &mut queue, &options)?)
            });
            let out = outcome.and_then(|o| Ok((o, decode.finish()?)));
            self.decode = Some(decode);
            out
        }

        /// The plan of `tokens` new tokens in chunks of `chunk_len` on the GPU lane,
        /// compiled.
        fn plan(&self, tokens: u32, chunk_len: u32) -> Result<Plan, ExecError> {
            let plan = PrefillPlan::new(
                self.model.host.model_config(),
                crate::resident_gpu_device(),
                Workload {
                    prompt_len: tokens,
                    chunk_len,
                    float_processor: None,
                },
            )?;
            let (steps, layers) = crate::prefill_parts::compile(&plan)?;
            Ok(Plan {
                plan: Arc::new(plan),
                steps,
                layers,
            })
        }

        /// Runs `plan` (of `tokens[pos0..]`) in `world`, its jobs recorded inline on this
        /// thread, over the session's device caches; returns the outcome and the logits of
        /// the token after `tokens`.
        fn run(
            &mut self,
            world: &mut RequestWorld,
            (compiled, policy): (Plan, Box<dyn Policy>),
            tokens: &[u32],
            pos0: usize,
        ) -> Result<(RunOutcome, Vec<f32>), ExecError> {
            let caches = self.caches.take().ok_or_else(lost)?;
            let chunk_len = compiled.plan.workload.chunk_len as usize;
            let stages = (compiled.steps.clone(), compiled.layers.clone());
            let run = (pos0, chunk_len, false, false);
            let model = self.model.clone();
            let runner =
                GpuStageRunner::continuing(model, stages, tokens.to_vec(), caches.clone(), run);
            let runner = match runner {
                Ok(r) => r,
                Err(e) => {
                    self.caches = Some(caches);
                    return Err(e);
                }
            };
            drop(caches);
            let mut queue = InlineQueue::new(&runner);
            let options = EngineOptions::default();
            let plan = compiled.plan.clone();
            let outcome = world.run(plan, policy, false, &mut queue, &options);
            // The head's submission waited for every stage: the caches are free again.
            self.caches = Some(runner.take_caches());
            let outcome = outcome?;
            runner.check_finite()?;
            Ok((outcome, take_logits(&runner.logits)?))
        }
    }

    fn lost() -> ExecError {
        ExecError::Kernel(
            "the session's GPU KV cache was lost in a failed run: start a new session".into(),
        )
    }
}

#[cfg(feature = "gpu")]
pub(super) use crate::StepRow;
#[cfg(feature = "gpu")]
pub(super) use lane::GpuLane;
#[cfg(not(feature = "gpu"))]
pub(super) use stub::StepRow;

/// Without the `gpu` feature there is no GPU lane: the type has no value, and
/// [`GpuLane::open`] says how to build one.
#[cfg(not(feature = "gpu"))]
pub(super) enum GpuLane {}

#[cfg(not(feature = "gpu"))]
mod stub {
    use hetsched_runtime::engine::RunOutcome;
    use hetsched_runtime::request_world::RequestWorld;
    use hetsched_systems::Policy;

    use crate::{ExecError, ExecModel};

    type Ran = Result<(RunOutcome, Vec<f32>), ExecError>;

    /// What a decode step gives: each row's greedy next token, and the logits when asked
    /// for.
    pub(in crate::generate) struct DecodeOutput {
        pub(in crate::generate) next: Vec<u32>,
        pub(in crate::generate) logits: Option<Vec<f32>>,
    }

    /// A sequence's token in a batched step (see the GPU build's `StepRow`): made by the
    /// samples' code, read only by a GPU lane, which this build has none of.
    #[allow(dead_code)]
    pub(in crate::generate) struct StepRow {
        pub(in crate::generate) token: u32,
        pub(in crate::generate) position: usize,
        pub(in crate::generate) shift: (usize, usize),
    }

    impl super::GpuLane {
        pub(in crate::generate) fn open(
            _: &std::sync::Arc<ExecModel>,
            _: &crate::GpuKernelOptions,
            _: crate::GpuWeights,
        ) -> Result<Self, ExecError> {
            Err(crate::gpu_open::no_gpu_support())
        }

        pub(in crate::generate) fn reserve(&mut self, _: usize, _: usize) -> Result<(), ExecError> {
            match *self {}
        }

        pub(in crate::generate) fn prefill(
            &mut self,
            _: &mut RequestWorld,
            _: Box<dyn Policy>,
            _: &[u32],
            _: (usize, u32),
        ) -> Ran {
            match *self {}
        }

        pub(in crate::generate) fn step(
            &mut self,
            _: &mut RequestWorld,
            _: Box<dyn Policy>,
            _: &[u32],
            _: bool,
        ) -> Result<(RunOutcome, DecodeOutput), ExecError> {
            match *self {}
        }

        pub(in crate::generate) fn capacity(&self) -> usize {
            match *self {}
        }

        pub(in crate::generate) fn batched_rows(&self) -> usize {
            match *self {}
        }

        pub(in crate::generate) fn step_rows(
            &mut self,
            _: &[StepRow],
            _: usize,
            _: bool,
        ) -> Result<DecodeOutput, ExecError> {
            match *self {}
        }
    }
}
