//! Components: plain data on the entities of the scheduler's world (processors, chunks,
//! subgraph templates, subgraph instances, tensors).

use bevy_ecs::prelude::{Component, Entity};

use crate::device::ProcessorKind;
use crate::graph::Sharing;
use crate::memory::TensorKind;
use crate::model::ExecClass;
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

/// Memory a processor can address: its region (see `memory::Region`).
#[derive(Component, Debug, Clone, Copy)]
pub struct MemoryRegion {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Bytes the scheduler may keep live in it (activations and KV cache).
    pub budget_bytes: u64,
    /// Alignment of planned offsets.
    pub alignment: u64,
}

/// A chunk of the prompt.
#[derive(Component, Debug, Clone, Copy)]
pub struct Chunk {
    /// Chunk index.
    pub index: u32,
    /// First token of the chunk.
    pub first_token: u32,
    /// Real (unpadded) tokens in the chunk.
    pub tokens: u32,
}

/// A subgraph template: built once; static ones are shared by every chunk.
#[derive(Component, Debug, Clone)]
pub struct SubgraphTemplate {
    /// Stage index in the per-chunk chain.
    pub stage: u32,
    /// Readable name.
    pub name: String,
    /// Operator names.
    pub ops: Vec<String>,
    /// Static (shared) or dynamic (per chunk).
    pub sharing: Sharing,
    /// Processor class.
    pub class: ExecClass,
}

/// One subgraph instance G(chunk, stage).
#[derive(Component, Debug, Clone, Copy)]
pub struct SubgraphInstance {
    /// Dense id (see `PrefillPlan::id`).
    pub id: u32,
    /// (chunk, stage).
    pub key: InstanceKey,
    /// Template entity.
    pub template: Entity,
    /// Chunk entity.
    pub chunk: Entity,
}

/// Life cycle of an instance: Pending -> Ready -> Running -> Done.
#[derive(Component, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubgraphState {
    /// Waiting for dependencies.
    Pending,
    /// Every dependency done; waiting for its processor.
    Ready,
    /// Dispatched to its processor's queue.
    Running,
    /// Completed.
    Done,
}

/// Dependencies still outstanding.
#[derive(Component, Debug, Clone, Copy)]
pub struct RemainingDeps(pub u32);

/// Where an instance runs: its home processor until it is dispatched, then the processor
/// the dispatcher chose (one of its eligible ones, see `PrefillPlan::eligible`).
#[derive(Component, Debug, Clone, Copy)]
pub struct Placement {
    /// Processor entity.
    pub processor: Entity,
    /// Processor lane index.
    pub index: usize,
}

/// Modeled execution time on its [`Placement`].
#[derive(Component, Debug, Clone, Copy)]
pub struct EstimatedCost {
    /// Nanoseconds.
    pub ns: u64,
}

/// A tensor of one chunk: an activation a stage hands to later stages, or a stage's
/// workspace (see `memory::chunk_tensors`).
#[derive(Component, Debug, Clone)]
pub struct Tensor {
    /// Size in bytes.
    pub bytes: u64,
    /// Region (processor lane) it is allocated in.
    pub region: usize,
    /// Activation or workspace.
    pub kind: TensorKind,
    /// Producing instance.
    pub producer: Entity,
    /// Consuming instances, in stage order (none for a workspace).
    pub consumers: Vec<Entity>,
}

/// One layer's KV cache buffer, preallocated for the whole prompt; chunks write their
/// rows in place (see `memory::KvCache`).
#[derive(Component, Debug, Clone, Copy)]
pub struct KvCacheLayer {
    /// Decoder layer.
    pub layer: u32,
    /// Bytes (K and V).
    pub bytes: u64,
    /// Region (processor lane).
    pub region: usize,
}
