//! The prefill plan: chunks x stages, where each instance runs and what it costs, and
//! the lower bound on any schedule's makespan. Plain data, built once per run.

use serde::{Deserialize, Serialize};

use crate::device::{DeviceProfile, ProcessorKind};
use crate::error::PlanError;
use crate::graph::{Sharing, StageDependency, StageTemplate, build_stages};
use crate::memory::{MemoryConfig, MemoryProfile};
use crate::model::{ChunkShape, ExecClass, ModelConfig};
use crate::policy::Policy;

/// A workload: how long the prompt is and how it is cut and scheduled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Prompt length in tokens.
    pub prompt_len: u32,
    /// Chunk length in tokens (the fixed length of the pre-built graphs).
    pub chunk_len: u32,
    /// Scheduling policy.
    #[serde(default)]
    pub policy: Policy,
    /// Processor (by name) for float work; the first CPU, else the first GPU, by default.
    #[serde(default)]
    pub float_processor: Option<String>,
}

/// Identifies one subgraph instance: stage `stage` of chunk `chunk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InstanceKey {
    /// Chunk index.
    pub chunk: u32,
    /// Stage index in the per-chunk chain.
    pub stage: u32,
}

/// Lower bound on the makespan of any schedule of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerBound {
    /// Work of the busiest processor, in ns.
    pub busiest_processor_ns: u64,
    /// Longest dependency chain, in ns.
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
    /// Processor index of each stage.
    pub stage_processor: Vec<usize>,
    /// Number of chunks.
    pub chunks: u32,
    /// Memory regions' budgets and alignment (see [`PrefillPlan::with_memory`]).
    memory: MemoryConfig,
    /// What each chunk holds as it runs, computed once (see [`PrefillPlan::memory_profile`]).
    memory_profile: MemoryProfile,
    /// Modeled cost in ns, indexed by [`PrefillPlan::id`]; 0 for ids with no instance.
    cost_ns: Vec<u64>,
    /// Longest path from any entry to the start of each instance, by id (ns).
    top_level_ns: Vec<u64>,
    /// Longest path from the start of each instance to any exit, its own cost included
    /// (HEFT's upward rank with fixed placement), by id (ns).
    bottom_level_ns: Vec<u64>,
}

impl PrefillPlan {
    /// Builds and validates the plan.
    pub fn new(
        model: ModelConfig,
        device: DeviceProfile,
        workload: Workload,
    ) -> Result<Self, PlanError> {
        device.validate()?;
        let stages = build_stages(&model)?;
        if workload.prompt_len == 0 {
            return Err(PlanError::InvalidWorkload(
                "prompt length is 0; give at least one token".into(),
            ));
        }
        if workload.chunk_len == 0 {
            return Err(PlanError::InvalidWorkload(
                "chunk length is 0; give at least one token".into(),
            ));
        }
        if workload.prompt_len > model.context {
            return Err(PlanError::InvalidWorkload(format!(
                "prompt of {} tokens is longer than {}'s context of {} tokens; shorten the prompt",
                workload.prompt_len, model.name, model.context
            )));
        }
        let float_processor = float_processor(&device, &workload)?;
        // Without an NPU the linears fall back to the CPU, and on a GPU-only device (every
        // tensor resident there) to the GPU.
        let int8_processor = device
            .first_of(ProcessorKind::Npu)
            .or_else(|| device.first_of(ProcessorKind::Cpu))
            .or_else(|| device.first_of(ProcessorKind::Gpu))
            .ok_or_else(|| PlanError::NoProcessor("linear (NPU, CPU or GPU)".into()))?;
        let stage_processor: Vec<usize> = stages
            .iter()
            .map(|s| match s.class {
                ExecClass::Float => float_processor,
                ExecClass::Int8 => int8_processor,
            })
            .collect();
        let chunks = workload.prompt_len.div_ceil(workload.chunk_len);
        let mut plan = PrefillPlan {
            model,
            device,
            workload,
            stages,
            stage_processor,
            chunks,
            memory: MemoryConfig::default(),
            memory_profile: MemoryProfile::default(),
            cost_ns: Vec::new(),
            top_level_ns: Vec::new(),
            bottom_level_ns: Vec::new(),
        };
        // The device's own memory must hold the KV cache and one chunk (no budget set yet);
        // checked before costs, so a prompt far too large is refused, not priced.
        plan.memory_profile = MemoryProfile::new(&plan);
        plan.memory_profile.check_feasible()?;
        plan.cost_ns = plan.model_costs()?;
        plan.top_level_ns = plan.top_levels();
        plan.bottom_level_ns = plan.bottom_levels();
        Ok(plan)
    }

    /// Sets the memory budgets and alignment, refusing budgets that can never be met.
    ///
    /// # Errors
    /// [`PlanError::InvalidMemory`] for an unknown region or a bad alignment;
    /// [`PlanError::Memory`] when a region cannot hold the KV cache and one chunk.
    pub fn with_memory(mut self, memory: MemoryConfig) -> Result<Self, PlanError> {
        memory.validate(&self.device)?;
        self.memory = memory;
        self.memory_profile = MemoryProfile::new(&self);
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

    fn model_costs(&self) -> Result<Vec<u64>, PlanError> {
        let mut costs = vec![0; self.id_space()];
        for key in self.instances() {
            let stage = &self.stages[key.stage as usize];
            let processor = &self.device.processors[self.stage_processor[key.stage as usize]];
            let shape = ChunkShape {
                tokens: u64::from(self.workload.chunk_len),
                past: u64::from(key.chunk) * u64::from(self.workload.chunk_len),
            };
            costs[self.id(key)] = processor.cost.subgraph_ns(&self.model, &stage.ops, shape).ok_or_else(|| {
                PlanError::InvalidDevice(format!(
                    "processor `{}` has no peak rate for the precision of stage {}; give it one",
                    processor.name, stage.name
                ))
            })?;
        }
        Ok(costs)
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
        key.chunk < self.chunks
            && (key.stage as usize) < self.stages.len()
            && (!self.stages[key.stage as usize].last_chunk_only || key.chunk + 1 == self.chunks)
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
        self.instances().count()
    }

    /// Modeled cost of an instance in ns.
    pub fn cost_ns(&self, key: InstanceKey) -> u64 {
        self.cost_ns[self.id(key)]
    }

    /// Processor index an instance runs on.
    pub fn processor(&self, key: InstanceKey) -> usize {
        self.stage_processor[key.stage as usize]
    }

    /// The instances `key` waits for (seed 000, Eq. 2-3).
    pub fn predecessors(&self, key: InstanceKey) -> Vec<InstanceKey> {
        let InstanceKey { chunk, stage } = key;
        match self.stages[stage as usize].dependency {
            StageDependency::None => Vec::new(),
            StageDependency::IntraChunk => vec![InstanceKey {
                chunk,
                stage: stage - 1,
            }],
            StageDependency::CrossChunk => (0..=chunk)
                .map(|c| InstanceKey {
                    chunk: c,
                    stage: stage - 1,
                })
                .collect(),
        }
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

    /// Total modeled work per processor, in ns.
    pub fn work_per_processor(&self) -> Vec<u64> {
        let mut work = vec![0; self.device.processors.len()];
        for key in self.instances() {
            work[self.processor(key)] += self.cost_ns(key);
        }
        work
    }

    /// Lower bound: the busiest processor's work and the critical path.
    pub fn lower_bound(&self) -> LowerBound {
        let busiest_processor_ns = self.work_per_processor().into_iter().max().unwrap_or(0);
        let critical_path_ns = self
            .instances()
            .map(|k| self.bottom_level_ns(k))
            .max()
            .unwrap_or(0);
        LowerBound {
            busiest_processor_ns,
            critical_path_ns,
        }
    }

    /// Longest dependency path from any entry to the start of `key`, in ns.
    pub fn top_level_ns(&self, key: InstanceKey) -> u64 {
        self.top_level_ns[self.id(key)]
    }

    /// Longest dependency path from the start of `key` to any exit, its own cost
    /// included, in ns: HEFT's upward rank under fixed placement.
    pub fn bottom_level_ns(&self, key: InstanceKey) -> u64 {
        self.bottom_level_ns[self.id(key)]
    }

    /// Top levels stage by stage: a cross-chunk stage waits for the running maximum over
    /// earlier chunks of the previous stage's finish.
    fn top_levels(&self) -> Vec<u64> {
        let mut top = vec![0u64; self.id_space()];
        for stage in 1..self.stage_count() {
            let mut prefix_max = 0u64;
            for chunk in 0..self.chunks {
                let before = InstanceKey {
                    chunk,
                    stage: stage - 1,
                };
                let finish = if self.exists(before) {
                    top[self.id(before)] + self.cost_ns(before)
                } else {
                    0
                };
                prefix_max = prefix_max.max(finish);
                let key = InstanceKey { chunk, stage };
                if !self.exists(key) {
                    continue;
                }
                top[self.id(key)] = match self.stages[stage as usize].dependency {
                    StageDependency::None => 0,
                    StageDependency::IntraChunk => finish,
                    StageDependency::CrossChunk => prefix_max,
                };
            }
        }
        top
    }

    /// Bottom levels from the last stage back: the successors of G(i, j) are G(i, j+1),
    /// and for a cross-chunk stage j+1 every G(i', j+1) with i' >= i (a suffix maximum).
    fn bottom_levels(&self) -> Vec<u64> {
        let mut bottom = vec![0u64; self.id_space()];
        for stage in (0..self.stage_count()).rev() {
            let next = stage + 1;
            let cross = next < self.stage_count()
                && self.stages[next as usize].dependency == StageDependency::CrossChunk;
            let mut suffix_max = 0u64;
            for chunk in (0..self.chunks).rev() {
                let after = InstanceKey { chunk, stage: next };
                let after_level = if self.exists(after) {
                    bottom[self.id(after)]
                } else {
                    0
                };
                suffix_max = suffix_max.max(after_level);
                let key = InstanceKey { chunk, stage };
                if !self.exists(key) {
                    continue;
                }
                let tail = if cross { suffix_max } else { after_level };
                bottom[self.id(key)] = self.cost_ns(key) + tail;
            }
        }
        bottom
    }
}

fn float_processor(device: &DeviceProfile, workload: &Workload) -> Result<usize, PlanError> {
    match &workload.float_processor {
        Some(name) => {
            let index = device
                .processors
                .iter()
                .position(|p| &p.name == name)
                .ok_or_else(|| {
                    PlanError::InvalidWorkload(format!(
                        "float_processor `{name}` is not a processor of {}; use one of: {}",
                        device.name,
                        device
                            .processors
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            if device.processors[index].kind == ProcessorKind::Npu {
                return Err(PlanError::InvalidWorkload(format!(
                    "float_processor `{name}` is an NPU; float work needs a CPU or GPU"
                )));
            }
            Ok(index)
        }
        None => device
            .first_of(ProcessorKind::Cpu)
            .or_else(|| device.first_of(ProcessorKind::Gpu))
            .ok_or_else(|| PlanError::NoProcessor("float (CPU or GPU)".into())),
    }
}
