//! A session's runs with every stage resident on the GPU ([`crate::GpuUse::Resident`]):
//! the prefill and each decode step are plans on the one GPU lane, run in the session's
//! world by a [`GpuStageRunner`] that continues the session's KV cache on the device.
//!
//! The caches are one key and one value matrix per layer in device memory, with a row for
//! every position the session reserved; each run (a prefill chunk by chunk, or a decode
//! step: one chunk of one token) writes its rows in place and attends over the rows
//! before them, so nothing of the cache ever crosses to the host. Only a run's token
//! embeddings go up and its logits come down.

#[cfg(feature = "gpu")]
mod lane {
    use std::sync::Arc;

    use hetsched_gpu::GpuMatrix;
    use hetsched_runtime::engine::{EngineOptions, RunOutcome};
    use hetsched_runtime::request_world::RequestWorld;
    use hetsched_systems::{Policy, PrefillPlan, Workload};

    use crate::generate::inline::InlineQueue;
    use crate::{
        ExecError, ExecModel, GpuKernelOptions, GpuModel, GpuStageRunner, Step, take_logits,
    };

    /// The model's weights and the session's KV cache on the device.
    pub(in crate::generate) struct GpuLane {
        model: Arc<GpuModel>,
        /// Per layer, `[capacity, kv_dim]` keys and values; `None` while a run has them
        /// or after a failed run.
        caches: Option<Vec<(GpuMatrix, GpuMatrix)>>,
        capacity: usize,
        /// The one-token plan of decode steps, compiled at the first step.
        decode: Option<Plan>,
    }

    /// A plan for the GPU lane and its stages compiled.
    #[derive(Clone)]
    struct Plan {
        plan: Arc<PrefillPlan>,
        steps: Vec<Vec<Step>>,
        layers: Vec<Option<u32>>,
    }

    impl GpuLane {
        /// Opens the GPU, uploads `model`'s (f32) weights and warms the device up.
        pub(in crate::generate) fn open(
            model: &Arc<ExecModel>,
            kernels: &GpuKernelOptions,
        ) -> Result<Self, ExecError> {
            crate::gpu_open::gpu_computes(model)?;
            let gpu = Arc::new(GpuModel::upload(
                crate::gpu_open::gpu_context(kernels)?,
                model.clone(),
            )?);
            gpu.warm_up()?;
            Ok(Self {
                model: gpu,
                caches: None,
                capacity: 0,
                decode: None,
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
            Ok(())
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
            let (outcome, logits, _) = self.run(world, (plan, policy, false), tokens, pos0)?;
            Ok((outcome, logits))
        }

        /// One decode step: `tokens`' last token as a one-token plan (built once) on the
        /// GPU lane, continuing the device caches.
        pub(in crate::generate) fn step(
            &mut self,
            world: &mut RequestWorld,
            policy: Box<dyn Policy>,
            tokens: &[u32],
        ) -> Result<(RunOutcome, Vec<f32>), ExecError> {
            let plan = match self.decode.take() {
                Some(p) => p,
                None => self.plan(1, 1)?,
            };
            let pos0 = tokens.len().saturating_sub(1);
            let (outcome, logits, plan) = self.run(world, (plan, policy, true), tokens, pos0)?;
            self.decode = Some(plan);
            Ok((outcome, logits))
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
        /// thread, over the session's device caches; returns the outcome, the logits of
        /// the token after `tokens`, and the plan.
        fn run(
            &mut self,
            world: &mut RequestWorld,
            (compiled, policy, decode): (Plan, Box<dyn Policy>, bool),
            tokens: &[u32],
            pos0: usize,
        ) -> Result<(RunOutcome, Vec<f32>, Plan), ExecError> {
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
            let outcome = world.run(plan, policy, decode, &mut queue, &options);
            // The head's submission waited for every stage: the caches are free again.
            self.caches = Some(runner.take_caches());
            let outcome = outcome?;
            runner.check_finite()?;
            Ok((outcome, take_logits(&runner.logits)?, compiled))
        }
    }

    fn lost() -> ExecError {
        ExecError::Kernel(
            "the session's GPU KV cache was lost in a failed run: start a new session".into(),
        )
    }
}

#[cfg(feature = "gpu")]
pub(super) use lane::GpuLane;

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

    impl super::GpuLane {
        pub(in crate::generate) fn open(
            _: &std::sync::Arc<ExecModel>,
            _: &crate::GpuKernelOptions,
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
        ) -> Ran {
            match *self {}
        }
    }
}
