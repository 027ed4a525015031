//! The ECS world model and scheduler systems of hetsched.
//!
//! A prompt is cut into chunks; each chunk runs through a chain of subgraph stages
//! ([`graph`]); every (chunk, stage) is an entity ([`components`]). One tick of the
//! [`scheduler_schedule`] runs the [`SchedulerSystems`] phases in order: collect
//! completions (freeing dead tensors), resolve dependencies, dispatch by policy within
//! each memory region's budget (the memory ledger), record metrics.
//!
//! This crate never names a concrete queue: the engine feeds [`resources::Inbox`] and
//! drains [`resources::Outbox`] (see [`resources`] for the contract).
//!
//! # Examples
//! ```
//! use std::sync::Arc;
//! use hetsched_systems::{PolicyRegistry, PrefillPlan, spawn_world, scheduler_schedule};
//! use hetsched_systems::resources::{Clock, Completion, Inbox, Outbox};
//! # let plan = hetsched_systems::testing::tiny_plan(2, 64, 32);
//! let policy = PolicyRegistry::builtin().create("stall")?;
//! let mut world = spawn_world(Arc::new(plan), policy);
//! let mut schedule = scheduler_schedule();
//! // A minimal simulated engine: run every dispatched job for its modeled time.
//! let mut in_flight = Vec::new();
//! loop {
//!     schedule.run(&mut world);
//!     let now = world.resource::<Clock>().now_ns;
//!     in_flight.extend(world.resource_mut::<Outbox>().0.drain(..).map(|j| (now + j.estimated_ns, now, j)));
//!     in_flight.sort_by_key(|(end, _, j)| (std::cmp::Reverse(*end), std::cmp::Reverse(j.processor)));
//!     let Some((end, start, job)) = in_flight.pop() else { break };
//!     world.resource_mut::<Clock>().now_ns = end;
//!     world.resource_mut::<Inbox>().0.push(Completion { id: job.id, processor: job.processor, start_ns: start, end_ns: end });
//! }
//! assert_eq!(world.resource::<hetsched_systems::LiveRuns>().outstanding, 0);
//! # Ok::<(), hetsched_systems::policy::UnknownPolicy>(())
//! ```

pub mod attention_span;
pub mod attention_split;
pub mod block;
mod bound;
mod collect;
pub mod components;
mod cost;
mod decode_cost;
pub mod decode_placement;
pub mod decode_plan;
mod device;
mod dispatch;
mod error;
pub mod graph;
mod measured_bound;
pub mod memory;
mod memory_dispatch;
mod metrics;
pub mod model;
pub mod op;
pub mod optimal;
mod placement;
pub mod plan;
pub mod policy;
mod progress;
pub mod request;
mod request_entity;
pub mod request_policy;
mod resolve;
pub mod resources;
pub mod retry;
pub mod ride;
pub mod shadow;
pub mod testing;
mod world;

use bevy_ecs::prelude::{IntoScheduleConfigs, Messages, ResMut, Schedule, SystemSet};
use bevy_ecs::schedule::SingleThreadedExecutor;

pub use attention_span::attention_window;
pub use cost::fit::{StageSample, fit_stage_cost, median};
pub use cost::stage::{StageCost, attended_pairs, has_attention, precision_label, stage_kind};
pub use cost::{CostModel, CostSource, MeasuredLatency, NPU_DECODE_ROWS, PeakRates};
pub use decode_cost::{
    DecodeEstimate, MAX_DECODE_BATCH, batched_decode_step_ns, decode_lane, estimate_decode,
    kv_cache_bytes,
};
pub use decode_placement::{DecodePlacement, DecodePlans};
pub use decode_plan::DEFAULT_DECODE_LAYERS_PER_STAGE;
pub use device::{CostAdaptation, OneThreadCost, PrecisionGap, PrecisionWarm, ProfileOrigin};
pub use device::{DeviceProfile, MAX_LATENCY_US, MAX_RATE, MIN_RATE, ProcessorKind, ProcessorSpec};
pub use error::PlanError;
pub use measured_bound::measured_lower_bound;
pub use model::{ModelConfig, Precision};
pub use placement::{PlacementConfig, StageKind};
pub use plan::{InstanceKey, LowerBound, PrefillPlan, Workload};
pub use policy::{DEFAULT_POLICY, Policy, PolicyRegistry};
pub use progress::StageProgress;
pub use request::{
    LiveRuns, OfRequest, Priority, Request, RequestError, RequestId, RequestPhase, RequestRun,
    RunOf, SloTargets, UnknownPriority, arm_request, disarm_request, rearm_world, spawn_request,
    spawn_request_entity,
};
pub use request_policy::{ActiveRequestPolicy, RequestPolicy};
pub use world::{spawn_request_world, spawn_world};

/// The phases of one scheduler tick, in the order they run.
#[derive(SystemSet, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchedulerSystems {
    /// Collect completions from the queues.
    Collect,
    /// Resolve dependencies; newly ready instances join ready queues.
    Resolve,
    /// Policy + dispatch to idle processors.
    Dispatch,
    /// Counters and statistics.
    Metrics,
}

/// The tick schedule: the [`SchedulerSystems`] phases chained, on a single-threaded executor.
pub fn scheduler_schedule() -> Schedule {
    let mut schedule = Schedule::default();
    schedule.set_executor(SingleThreadedExecutor::new());
    schedule.configure_sets(
        (
            SchedulerSystems::Collect,
            SchedulerSystems::Resolve,
            SchedulerSystems::Dispatch,
            SchedulerSystems::Metrics,
        )
            .chain(),
    );
    schedule.add_systems((
        collect::collect_completions.in_set(SchedulerSystems::Collect),
        resolve::resolve_dependencies.in_set(SchedulerSystems::Resolve),
        dispatch::dispatch_ready.in_set(SchedulerSystems::Dispatch),
        (metrics::record_metrics, advance_messages)
            .chain()
            .in_set(SchedulerSystems::Metrics),
    ));
    schedule
}

/// The tick of [`scheduler_schedule`] in two halves: collect and resolve, then dispatch
/// and metrics. Running both in turn is one tick; between them a caller sees which runs
/// just finished (`LiveRuns::finished`) and may arm the next ones (a request's next decode
/// step), so that they compete for the processors in the same tick's dispatch, as they
/// would had they been armed before it.
pub fn scheduler_schedule_halves() -> (Schedule, Schedule) {
    let mut settle = Schedule::default();
    settle.set_executor(SingleThreadedExecutor::new());
    settle.configure_sets((SchedulerSystems::Collect, SchedulerSystems::Resolve).chain());
    settle.add_systems((
        collect::collect_completions.in_set(SchedulerSystems::Collect),
        resolve::resolve_dependencies.in_set(SchedulerSystems::Resolve),
    ));
    let mut launch = Schedule::default();
    launch.set_executor(SingleThreadedExecutor::new());
    launch.configure_sets((SchedulerSystems::Dispatch, SchedulerSystems::Metrics).chain());
    launch.add_systems((
        dispatch::dispatch_ready.in_set(SchedulerSystems::Dispatch),
        (metrics::record_metrics, advance_messages)
            .chain()
            .in_set(SchedulerSystems::Metrics),
    ));
    (settle, launch)
}

/// Swaps message buffers once per tick so messages live exactly two ticks.
fn advance_messages(mut finished: ResMut<Messages<resources::SubgraphFinished>>) {
    finished.update();
}
