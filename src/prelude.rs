//! What a runtime that embeds the scheduling core needs, in one import:
//! `use hetsched::prelude::*;`.
//!
//! - plan a prefill: [`Scene`] (or [`PrefillPlan`] from a [`ModelConfig`], a
//!   [`DeviceProfile`] and a [`Workload`]);
//! - schedule it: a [`Policy`] from the [`PolicyRegistry`] (or your own type);
//! - run it on your queues ([`Backend`], fed [`Job`]s, answering [`Completion`]s; the
//!   contract is on the trait, its breaches are [`BackendFault`]s) with [`run`] /
//!   [`run_with`] ([`EngineOptions`], [`Deadline`]), a step at a time from your own
//!   event loop with a [`Stepper`], or on a virtual clock with [`simulate`];
//! - read the result: [`RunOutcome`], [`RunReport`] (`new` for a simulation,
//!   [`RunReport::measured`] for a run on real queues), [`Trace`] written with
//!   [`to_chrome_json`] and [`to_svg`];
//! - or prefill a real model on this machine's queues: [`ExecModel`], [`PrefillOptions`],
//!   [`prefill`].
//!
//! # Examples
//! ```
//! use std::sync::Arc;
//! use hetsched::prelude::*;
//!
//! let scene = Scene::default_scene();
//! let plan = Arc::new(scene.plan()?);
//! let policy = PolicyRegistry::builtin().create("stall")?;
//! let run = simulate(plan.clone(), policy)?;
//! assert!(run.makespan_ns >= plan.lower_bound().ns());
//! println!("{}", RunReport::new(&scene.name, &run).summary());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use crate::backends::{Backend, BackendError};
pub use crate::engine::{
    BackendFault, Deadline, EngineError, EngineOptions, RunOutcome, Step, Stepper, Wait, run,
    run_with, simulate,
};
pub use crate::exec::{ExecError, ExecModel, LinearPrecision, PrefillOptions, prefill};
pub use crate::report::RunReport;
pub use crate::scene::{Scene, SceneError};
pub use crate::timeline::Trace;
pub use crate::timeline::chrome::to_chrome_json;
pub use crate::timeline::svg::to_svg;
pub use hetsched_systems::policy::{
    PickContext, Policy, PolicyRegistry, UnknownPolicy, pick_max_by,
};
pub use hetsched_systems::resources::{Completion, Job};
pub use hetsched_systems::{
    DeviceProfile, ModelConfig, PlacementConfig, PlanError, PrefillPlan, ProcessorKind, Workload,
};
