//! Components: plain data on the entities of the scheduler's world: processors and
//! subgraph instances (requests: [`crate::request`]). An instance is pending while its
//! [`RemainingDeps`] is above 0, ready at 0 (the ready queues index it), [`Running`]
//! once dispatched; done is its request's `StageProgress`. No marker is spawned that no
//! system reads.
//!
//! What the systems do not read is not spawned: chunks, templates, tensors and memory
//! regions live in the [`crate::plan::PrefillPlan`] and the memory ledger,
//! which answer by dense index in O(1) (docs/architecture.md, "What the world holds").

use bevy_ecs::prelude::Component;

use crate::device::ProcessorKind;
use crate::plan::InstanceKey;

/// A processor with one queue (seed 000, Eq. 4: one subgraph at a time).
#[derive(Component, Debug, Clone)]
pub struct Processor {
    /// Lane index (position in the device profile).
    pub index: usize,
    /// Name from the device profile.
    pub name: String,
    /// Kind.
    pub kind: ProcessorKind,
}

/// The processor's busy slot and its accumulated busy time.
#[derive(Component, Debug, Clone, Default)]
pub struct BusySlot {
    /// Instance id running now, if any.
    pub running: Option<u32>,
    /// When the running job is modeled to end, in ns (placement-aware policies compare
    /// finish times across processors with it).
    pub expected_end_ns: u64,
    /// Total busy time so far, in ns.
    pub busy_ns: u64,
}

/// A processor the engine gave up on: a job there ran past its deadline and was retried
/// elsewhere (`crate::retry`). Dispatch never starts a job on it again.
#[derive(Component, Debug, Clone, Copy, Default)]
#[component(storage = "SparseSet")]
pub struct Offline;

/// One subgraph instance G(chunk, stage).
#[derive(Component, Debug, Clone, Copy)]
pub struct SubgraphInstance {
    /// Dense id (see `PrefillPlan::id`).
    pub id: u32,
    /// (chunk, stage).
    pub key: InstanceKey,
}

/// Dependencies still outstanding; 0 once the instance is ready.
#[derive(Component, Debug, Clone, Copy)]
pub struct RemainingDeps(pub u32);

/// Dispatched: where it runs, what the model expects it to take, and when it started.
/// Collect checks a completion against it.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
#[component(storage = "SparseSet")]
pub struct Running {
    /// The processor lane the dispatcher chose (one of `PrefillPlan::eligible`).
    pub lane: usize,
    /// Modeled duration on that lane, ns.
    pub estimated_ns: u64,
    /// When it was dispatched, ns.
    pub dispatched_ns: u64,
}
