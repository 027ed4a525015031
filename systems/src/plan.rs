//! The prefill plan: chunks x stages, where each instance runs and what it costs, and
//! the lower bound on any schedule's makespan. Plain data, built once per run.

use std::num::NonZeroU64;

use crate::attention_split::{head_groups, is_splittable, split_attention_stages};
use crate::device::DeviceProfile;
use crate::error::PlanError;
use crate::graph::{
    Sharing, StageDependency, StageTemplate, build_stages, group_layers,
    merge_for_one_chunk_one_processor, merge_for_one_processor,
};
use crate::memory::{MemoryConfig, MemoryProfile};
use crate::model::{ChunkShape, ModelConfig, OpKind};
use crate::placement::PlacementConfig;

mod lanes;
mod layout;
mod levels;

use lanes::stage_lanes;
pub use layout::{InstanceKey, PlanLayout, Workload};
use layout::{check_workload, memory_steps, successor_stages};

/// Lower bound on the makespan of any schedule of a plan (docs/policies.md, "The lower
/// bound").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerBound {
    /// Load bound, in ns. With fixed placement: the busiest processor's work. With
    /// flexible placement: the best fractional spread of the work over each instance's
    /// eligible processors (docs/policies.md, "The lower bound").
    pub busiest_processor_ns: u64,
    /// Longest dependency chain, each instance at its cheapest eligible processor, in ns.
    pub critical_path_ns: u64,
}

impl LowerBound {
    /// The bound: the larger of the two.
    pub fn ns(&self) -> u64 {
        self.busiest_processor_ns.max(self.critical_path_ns)
    }
}

/// Everything the scheduler needs to know about one prefill, fixed before it starts.
#[derive(Clone, Debug)]
pub struct PrefillPlan {
    /// The model.
    pub model: ModelConfig,
    /// The device.
    pub device: DeviceProfile,
    /// The workload.
    pub workload: Workload,
    /// Per-chunk stage chain.
    pub stages: Vec<StageTemplate>,
    /// Home processor of each stage: its only one under fixed placement; under flexible
    /// placement the one `inorder` and `peer` use and whose region holds its tensors.
    pub stage_processor: Vec<usize>,
    /// The `[placement]` rules the plan was built with (empty: fixed placement).
    pub placement: PlacementConfig,
    /// Processors each stage may run on, home first.
    stage_lanes: Vec<Vec<usize>>,
    /// For each stage, the stages that wait for it.
    successor_stages: Vec<Vec<u32>>,
    /// For each stage, its memory step (see [`PrefillPlan::memory_step`]).
    memory_steps: Vec<u32>,
    /// Number of chunks.
    pub chunks: u32,
    /// Memory regions' budgets and alignment (see [`PrefillPlan::with_memory`]).
    memory: MemoryConfig,
    /// What each chunk holds as it runs, computed once (see [`PrefillPlan::memory_profile`]).
    memory_profile: MemoryProfile,
    /// Modeled cost in ns on each lane, indexed by `id * lanes + lane`; `None` where the
    /// lane is not eligible or the id has no instance.
    lane_cost_ns: Vec<Option<NonZeroU64>>,
    /// Modeled cost on the home processor, by id (ns); 0 for ids with no instance.
    cost_ns: Vec<u64>,
    /// Cheapest eligible cost, by id (ns).
    min_cost_ns: Vec<u64>,
    /// Longest path (cheapest costs) from any entry to the start of each instance, by id.
    top_level_ns: Vec<u64>,
    /// Longest path (cheapest costs) from the start of each instance to any exit, its own
    /// cost included, by id (ns).
    bottom_level_ns: Vec<u64>,
    /// HEFT's upward rank: the bottom level with each instance at its mean eligible cost.
    upward_rank_ns: Vec<u64>,
    /// How many instances exist (counted once: the dispatch and resolve systems ask
    /// every tick whether a run is done).
    instance_count: usize,
    /// The lower bound, computed once.
    lower_bound: LowerBound,
}

impl PrefillPlan {
    /// Builds and validates the plan with fixed placement (no `[placement]` rules).
    pub fn new(
        model: ModelConfig,
        device: DeviceProfile,
        workload: Workload,
    ) -> Result<Self, PlanError> {
        Self::placed(model, device, workload, PlacementConfig::default())
    }

    /// Builds and validates the plan; `placement` lists the processors each kind of stage
    /// may run on (see [`PlacementConfig`]).
    ///
    /// # Errors
    /// [`PlanError`] for a bad model, device, workload or placement rule, a processor that
    /// cannot price a stage it is eligible for, or memory that cannot hold one chunk.
    pub fn placed(
        model: ModelConfig,
        device: DeviceProfile,
        workload: Workload,
        placement: PlacementConfig,
    ) -> Result<Self, PlanError> {
        Self::placed_grouped(model, device, workload, placement, 1, None)
    }

    /// [`PrefillPlan::placed`], where a plan of one chunk on one processor (a decode
    /// step) holds `layers_per_stage` decoder layers a stage ([`crate::decode_plan`]).
    pub(crate) fn placed_grouped(
        model: ModelConfig,
        device: DeviceProfile,
        workload: Workload,
        placement: PlacementConfig,
        layers_per_stage: u32,
        only_lane: Option<usize>,
    ) -> Result<Self, PlanError> {
        device.validate()?;
        let mut stages = build_stages(&model)?;
        check_workload(&model, &workload)?;
        if device.processors.len() == 1 || only_lane.is_some() {
            stages = match workload.prompt_len <= workload.chunk_len {
                true => group_layers(merge_for_one_chunk_one_processor(stages), layers_per_stage)?,
                false => merge_for_one_processor(stages),
            };
        }
        Self::from_stages(model, device, workload, placement, stages, only_lane)
    }

    /// This plan with each chunk's attention stage cut by query heads into a prep, parts
    /// and a merge ([`crate::attention_split`]), as many parts as the longest chunk's
    /// attention needs to run about `part_ns` or less a part on the stage's home
    /// processor (at most one a query head; [`crate::attention_split::head_groups`]),
    /// its memory settings kept. The plan is
    /// returned as it is where no attention stage is that long, on a device of one
    /// processor (nothing runs beside a part there) and where a processor prices an
    /// attention stage by a fitted stage cost (measured whole: its parts never were).
    ///
    /// # Errors
    /// As [`PrefillPlan::placed`] and [`PrefillPlan::with_memory`], for the cut plan.
    pub fn with_attention_split(self, part_ns: u64) -> Result<Self, PlanError> {
        let parts = self.attention_parts(part_ns);
        if parts <= 1 {
            return Ok(self);
        }
        let groups = head_groups(&self.model, parts);
        let stages = split_attention_stages(self.stages.clone(), &groups);
        let memory = self.memory.clone();
        Self::from_stages(
            self.model,
            self.device,
            self.workload,
            self.placement,
            stages,
            None,
        )?
        .with_memory(memory)
    }

    /// How many parts [`PrefillPlan::with_attention_split`] cuts attention into: the
    /// longest attention operator (of the last two chunks, on its stage's home processor)
    /// over `part_ns`, rounded up, at most the query heads; 1 where it cuts nothing.
    fn attention_parts(&self, part_ns: u64) -> u32 {
        if self.lanes() < 2 || part_ns == 0 {
            return 1;
        }
        let mut parts = 1u32;
        for (j, stage) in self.stages.iter().enumerate() {
            if !is_splittable(stage) {
                continue;
            }
            let fitted = self.stage_lanes[j].iter().any(|&lane| {
                let cost = &self.device.processors[lane].cost;
                cost.stage_cost(&self.model, &stage.ops).is_some()
            });
            if fitted {
                return 1;
            }
            let Some(op) = stage.ops.iter().find(|op| op.kind == OpKind::Attention) else {
                continue;
            };
            let processor = &self.device.processors[self.stage_processor[j]];
            let ops = std::slice::from_ref(op);
            // The longest chunk's attention: the last one, or the one before it when the
            // last holds fewer tokens (attention grows with the keys before a chunk).
            for chunk in self.chunks.saturating_sub(2)..self.chunks {
                let key = InstanceKey {
                    chunk,
                    stage: j as u32,
                };
                let shape = processor.kind.priced_shape(
                    &processor.cost,
                    &self.model,
                    ops,
                    self.executed_shape(key),
                    self.workload.chunk_len,
                );
                let ns = processor.cost.op_ns(&self.model, op, shape).unwrap_or(0.0);
                let needed = (ns / part_ns as f64).ceil().min(f64::from(u32::MAX)) as u32;
                parts = parts.max(needed);
            }
        }
        parts.min(self.model.heads)
    }

    /// Builds the plan of `stages` (a linked per-chunk chain): lanes, instances, memory
    /// and costs.
    fn from_stages(
        model: ModelConfig,
        device: DeviceProfile,
        workload: Workload,
        placement: PlacementConfig,
        stages: Vec<StageTemplate>,
        only_lane: Option<usize>,
    ) -> Result<Self, PlanError> {
        let stage_lanes = match only_lane {
            Some(lane) if lane < device.processors.len() => vec![vec![lane]; stages.len()],
            Some(lane) => {
                return Err(PlanError::InvalidDevice(format!(
                    "processor {lane} does not exist: the device has {}",
                    device.processors.len()
                )));
            }
            None => stage_lanes(&device, &workload, &stages, &placement)?,
        };
        let stage_processor = stage_lanes.iter().map(|lanes| lanes[0]).collect();
        let chunks = workload.prompt_len.div_ceil(workload.chunk_len);
        let successor_stages = successor_stages(&stages);
        let memory_steps = memory_steps(&stages);
        // Every stage in every chunk, but a last-chunk-only stage in the last chunk alone.
        let last_chunk_only = stages.iter().filter(|s| s.last_chunk_only).count();
        let instance_count =
            chunks as usize * stages.len() - (chunks as usize).saturating_sub(1) * last_chunk_only;
        let mut plan = PrefillPlan {
            model,
            device,
            workload,
            stages,
            stage_processor,
            placement,
            successor_stages,
            memory_steps,
            stage_lanes,
            chunks,
            memory: MemoryConfig::default(),
            memory_profile: MemoryProfile::default(),
            lane_cost_ns: Vec::new(),
            cost_ns: Vec::new(),
            min_cost_ns: Vec::new(),
            top_level_ns: Vec::new(),
            bottom_level_ns: Vec::new(),
            upward_rank_ns: Vec::new(),
            instance_count,
            lower_bound: LowerBound {
                busiest_processor_ns: 0,
                critical_path_ns: 0,
            },
        };
        // The device's own memory must hold the KV cache and one chunk (no budget set yet);
        // checked before costs, so a prompt far too large is refused, not priced.
        plan.memory_profile = MemoryProfile::new(&plan.layout(), &plan.memory);
        plan.memory_profile.check_feasible()?;
        plan.price()?;
        Ok(plan)
    }

    /// Prices every instance on its eligible lanes, then the levels, ranks and the lower
    /// bound that the policies and the report read.
    fn price(&mut self) -> Result<(), PlanError> {
        self.lane_cost_ns = self.model_costs()?;
        self.derive_from_lane_costs();
        Ok(())
    }

    /// Sets the memory budgets and alignment, refusing budgets that can never be met.
    ///
    /// # Errors
    /// [`PlanError::InvalidMemory`] for an unknown region or a bad alignment;
    /// [`PlanError::Memory`] when a region cannot hold the KV cache and one chunk.
    pub fn with_memory(mut self, memory: MemoryConfig) -> Result<Self, PlanError> {
        memory.validate(&self.device)?;
        self.memory = memory;
        self.memory_profile = MemoryProfile::new(&self.layout(), &self.memory);
        self.memory_profile.check_feasible()?;
        Ok(self)
    }

    /// The memory settings (budgets, alignment).
    pub fn memory(&self) -> &MemoryConfig {
        &self.memory
    }

    /// Chunk tensors, regions and what a chunk holds as it runs, under
    /// [`PrefillPlan::memory`].
    pub fn memory_profile(&self) -> &MemoryProfile {
        &self.memory_profile
    }

    /// Every instance priced on every lane it may run on.
    fn model_costs(&self) -> Result<Vec<Option<NonZeroU64>>, PlanError> {
        let lanes = self.lanes();
        let mut costs = vec![None; self.id_space() * lanes];
        for key in self.instances() {
            let stage = &self.stages[key.stage as usize];
            let executed = self.executed_shape(key);
            for &lane in self.eligible(key) {
                let processor = &self.device.processors[lane];
                // The shape the processor's kind prices the chunk at: the tokens it
                // holds, or on an NPU priced by the roofline its graphs' fixed length.
                let shape = processor.kind.priced_shape(
                    &processor.cost,
                    &self.model,
                    &stage.ops,
                    executed,
                    self.workload.chunk_len,
                );
                let ns = processor
                    .cost
                    .subgraph_ns(&self.model, &stage.ops, shape)
                    .and_then(NonZeroU64::new)
                    .ok_or_else(|| {
                        let why = if lane == self.processor(key) {
                            "give it one"
                        } else {
                            "give it one, or drop it from the [placement] rule"
                        };
                        PlanError::InvalidDevice(format!(
                            "processor `{}` has no peak rate for the precision of stage {}; {why}",
                            processor.name, stage.name
                        ))
                    })?;
                costs[self.id(key) * lanes + lane] = Some(ns);
            }
        }
        Ok(costs)
    }

    /// The plan's layout without its costs, which memory accounting reads.
    pub fn layout(&self) -> PlanLayout<'_> {
        PlanLayout {
            model: &self.model,
            device: &self.device,
            workload: &self.workload,
            stages: &self.stages,
            stage_processor: &self.stage_processor,
            memory_steps: &self.memory_steps,
            chunks: self.chunks,
        }
    }

    /// Number of processor lanes.
    pub fn lanes(&self) -> usize {
        self.device.processors.len()
    }

    /// Stages per chunk, including the last-chunk-only head.
    pub fn stage_count(&self) -> u32 {
        self.stages.len() as u32
    }

    /// Size of the dense id space (some ids have no instance).
    pub fn id_space(&self) -> usize {
        self.chunks as usize * self.stages.len()
    }

    /// Dense id of an instance: `chunk * stages + stage`, so ids sort in (chunk, stage) order.
    pub fn id(&self, key: InstanceKey) -> usize {
        key.chunk as usize * self.stages.len() + key.stage as usize
    }

    /// Key of a dense id.
    pub fn key(&self, id: usize) -> InstanceKey {
        let s = self.stages.len();
        InstanceKey {
            chunk: (id / s) as u32,
            stage: (id % s) as u32,
        }
    }

    /// Whether the instance exists (the head runs for the last chunk only).
    pub fn exists(&self, key: InstanceKey) -> bool {
        self.layout().exists(key)
    }

    /// Every instance, in (chunk, stage) order.
    pub fn instances(&self) -> impl Iterator<Item = InstanceKey> + '_ {
        (0..self.chunks)
            .flat_map(move |chunk| {
                (0..self.stage_count()).map(move |stage| InstanceKey { chunk, stage })
            })
            .filter(|k| self.exists(*k))
    }

    /// Number of instances.
    pub fn instance_count(&self) -> usize {
        self.instance_count
    }

    /// Modeled cost of an instance on its home processor, in ns.
    pub fn cost_ns(&self, key: InstanceKey) -> u64 {
        self.cost_ns[self.id(key)]
    }

    /// Modeled cost of an instance on `lane`, in ns, or `None` when it may not run there.
    pub fn cost_on(&self, key: InstanceKey, lane: usize) -> Option<u64> {
        self.lane_cost_ns
            .get(self.id(key) * self.lanes() + lane)
            .copied()
            .flatten()
            .map(NonZeroU64::get)
    }

    /// Cheapest modeled cost of an instance over its eligible processors, in ns.
    pub fn min_cost_ns(&self, key: InstanceKey) -> u64 {
        self.min_cost_ns[self.id(key)]
    }

    /// Home processor of an instance: its only one under fixed placement.
    pub fn processor(&self, key: InstanceKey) -> usize {
        self.stage_processor[key.stage as usize]
    }

    /// The shape an instance runs at: the prompt tokens its chunk holds (the last chunk
    /// may hold fewer than `chunk_len`) and the tokens before it (the KV cache it reads).
    pub fn executed_shape(&self, key: InstanceKey) -> ChunkShape {
        let (prompt, chunk_len) = (self.workload.prompt_len, self.workload.chunk_len);
        let past = key.chunk * chunk_len;
        ChunkShape {
            tokens: u64::from(chunk_len.min(prompt.saturating_sub(past)).max(1)),
            past: u64::from(past),
        }
    }

    /// Processors an instance may run on, home first.
    pub fn eligible(&self, key: InstanceKey) -> &[usize] {
        &self.stage_lanes[key.stage as usize]
    }

    /// Whether some stage may run on more than one processor.
    pub fn is_flexible(&self) -> bool {
        self.stage_lanes.iter().any(|lanes| lanes.len() > 1)
    }

    /// The instances `key` waits for (seed 000, Eq. 2-3; a shadow's pair, see
    /// [`crate::graph`]).
    pub fn predecessors(&self, key: InstanceKey) -> Vec<InstanceKey> {
        let stage = &self.stages[key.stage as usize];
        let chunks = match stage.dependency {
            StageDependency::None => return Vec::new(),
            StageDependency::IntraChunk => key.chunk..key.chunk + 1,
            StageDependency::CrossChunk => 0..key.chunk + 1,
        };
        stage
            .after
            .iter()
            .flat_map(|&s| {
                chunks
                    .clone()
                    .map(move |chunk| InstanceKey { chunk, stage: s })
            })
            .filter(|k| self.exists(*k))
            .collect()
    }

    /// The memory step of `stage` (see [`PlanLayout::memory_step`]).
    pub fn memory_step(&self, stage: u32) -> u32 {
        self.layout().memory_step(stage)
    }

    /// Memory steps of a chunk that runs every stage (the last one, with the head).
    pub fn memory_step_count(&self) -> u32 {
        self.memory_steps.last().map_or(0, |&last| last + 1)
    }

    /// The stages that wait for `stage` (see [`crate::graph::StageTemplate::after`]).
    pub fn successor_stages(&self, stage: u32) -> &[u32] {
        &self.successor_stages[stage as usize]
    }

    /// Stages that run once per chunk (excludes the last-chunk-only head).
    pub fn stages_per_chunk(&self) -> usize {
        self.stages.iter().filter(|s| !s.last_chunk_only).count()
    }

    /// Per-chunk stages that are static, i.e. shared across chunks.
    pub fn shared_stages_per_chunk(&self) -> usize {
        self.stages
            .iter()
            .filter(|s| !s.last_chunk_only && s.sharing == Sharing::Static)
            .count()
    }

    /// Total modeled work per home processor, in ns.
    pub fn work_per_processor(&self) -> Vec<u64> {
        let mut work = vec![0; self.device.processors.len()];
        for key in self.instances() {
            work[self.processor(key)] += self.cost_ns(key);
        }
        work
    }
}
