//! A chunk's memory over its own progress, and whether a budget can ever be met.
//!
//! A chunk's memory steps run one after another (a step is a stage, or an INT8 stage and
//! the outlier shadow beside it: [`PlanLayout::memory_step`]), so the bytes a chunk holds
//! in a region depend only on how far it got: `wait[j]` before step `j` starts, `run[j]`
//! while it runs (both stages of a step allocate when the first starts and free when the
//! last ends). `peak_from[j]` is the most it will hold from step `j` on. These are the same for
//! every chunk but the last (which also runs the model head), so two profiles describe a
//! whole prefill. Sizes are rounded up to the region alignment, as the planner packs them.
//! Every table has one column per region and a last column for the whole device (the sum),
//! which the device budget (`MemoryConfig::device_budget_bytes`) limits.

use super::MemoryError;
use super::align_up;
use super::region::{MemoryConfig, Region};
use super::tensors::{KvCache, TensorTemplate, chunk_tensors};
use crate::plan::{InstanceKey, PlanLayout};

/// Bytes per (step, column) of one chunk's progress; index `step * columns + column`,
/// where the columns are the regions and then the device total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkProfile {
    /// Columns per stage row: regions + 1 (the device total).
    pub regions: usize,
    /// Memory steps this chunk runs.
    pub steps: u32,
    /// Allocated when step `j` starts (its stages' outputs and workspace).
    pub alloc: Vec<u64>,
    /// Freed when step `j` ends (its workspace and tensors it reads last).
    pub free: Vec<u64>,
    /// Held before step `j` starts; row `steps` is what is left at the end (0).
    pub wait: Vec<u64>,
    /// Held while step `j` runs.
    pub run: Vec<u64>,
    /// The most held from step `j` on (`run` suffix maximum); row `steps` is 0.
    pub peak_from: Vec<u64>,
}

impl ChunkProfile {
    /// The profile of chunk `chunk` of a plan's `layout`, whose chunk tensors are `tensors`
    /// ([`chunk_tensors`]), with sizes aligned as in `regions`.
    pub fn new(
        layout: &PlanLayout,
        regions: &[Region],
        tensors: &[TensorTemplate],
        chunk: u32,
    ) -> ChunkProfile {
        let r = regions.len() + 1;
        let stages = (0..layout.stage_count())
            .take_while(|&stage| layout.exists(InstanceKey { chunk, stage }))
            .count() as u32;
        let steps = stages
            .checked_sub(1)
            .map_or(0, |last| layout.memory_step(last) + 1);
        let n = steps as usize;
        let mut alloc = vec![0u64; n * r];
        let mut free = vec![0u64; n * r];
        for t in tensors {
            if t.producer >= stages {
                continue;
            }
            let size = align_up(t.bytes, regions[t.region].alignment).unwrap_or(u64::MAX);
            let last = layout.memory_step(t.last_use(layout, chunk)) as usize;
            let first = layout.memory_step(t.producer) as usize;
            // Saturating: absurd sizes must reach the feasibility check, not overflow.
            for column in [t.region, r - 1] {
                let at = first * r + column;
                alloc[at] = alloc[at].saturating_add(size);
                let at = last * r + column;
                free[at] = free[at].saturating_add(size);
            }
        }
        let mut wait = vec![0u64; (n + 1) * r];
        let mut run = vec![0u64; n * r];
        for j in 0..n {
            for k in 0..r {
                run[j * r + k] = wait[j * r + k].saturating_add(alloc[j * r + k]);
                wait[(j + 1) * r + k] = run[j * r + k].saturating_sub(free[j * r + k]);
            }
        }
        let mut peak_from = vec![0u64; (n + 1) * r];
        for j in (0..n).rev() {
            for k in 0..r {
                peak_from[j * r + k] = peak_from[(j + 1) * r + k].max(run[j * r + k]);
            }
        }
        ChunkProfile {
            regions: r,
            steps,
            alloc,
            free,
            wait,
            run,
            peak_from,
        }
    }

    /// The most this chunk ever holds in `region`.
    pub fn peak(&self, region: usize) -> u64 {
        self.peak_from[region]
    }

    /// Row `step` of a per-step table.
    pub fn row<'a>(&self, table: &'a [u64], step: u32) -> &'a [u64] {
        let at = step as usize * self.regions;
        &table[at..at + self.regions]
    }
}

/// Everything memory-aware dispatch needs: regions, KV cache per region, the chunk
/// tensors, and the profiles of an ordinary chunk and of the last one. A plan computes
/// it once ([`crate::PrefillPlan::memory_profile`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryProfile {
    /// The tensors of one chunk ([`chunk_tensors`]).
    pub tensors: Vec<TensorTemplate>,
    /// Regions in lane order.
    pub regions: Vec<Region>,
    /// KV cache bytes per column (aligned), held for the whole prefill.
    pub kv_bytes: Vec<u64>,
    /// Resident float weight rows of the outlier shadow per column (aligned), held for
    /// the whole prefill in the region of the shadow stages' home processor.
    pub shadow_bytes: Vec<u64>,
    /// Budget per column: each region's, then the device's.
    pub budgets: Vec<u64>,
    /// Every chunk but the last.
    pub chunk: ChunkProfile,
    /// The last chunk (runs the model head too).
    pub last: ChunkProfile,
    /// Chunks in the prefill.
    pub chunks: u32,
}

impl MemoryProfile {
    /// The profile of a plan's `layout` under the budgets and alignment of `memory`.
    pub fn new(layout: &PlanLayout, memory: &MemoryConfig) -> MemoryProfile {
        let regions = memory.regions(layout.device);
        let kv = KvCache::of(layout);
        let mut kv_bytes = vec![0u64; regions.len() + 1];
        let align = regions[kv.region].alignment;
        kv_bytes[kv.region] = u64::from(kv.layers)
            .saturating_mul(align_up(kv.bytes_per_layer, align).unwrap_or(u64::MAX));
        kv_bytes[regions.len()] = kv_bytes[kv.region];
        let mut shadow_bytes = vec![0u64; regions.len() + 1];
        if let (Some(shadow), Some(stage)) = (
            &layout.model.shadow,
            (0..layout.stage_count()).find(|&s| layout.stages[s as usize].is_shadow()),
        ) {
            let region = layout.stage_processor[stage as usize];
            let (resident, _) = shadow.weight_bytes(layout.model);
            shadow_bytes[region] =
                align_up(resident, regions[region].alignment).unwrap_or(u64::MAX);
            shadow_bytes[regions.len()] = shadow_bytes[region];
        }
        let mut budgets: Vec<u64> = regions.iter().map(|r| r.budget_bytes).collect();
        budgets.push(
            memory
                .device_budget_bytes
                .unwrap_or_else(|| budgets.iter().fold(0u64, |a, &b| a.saturating_add(b))),
        );
        let tensors = chunk_tensors(layout);
        let chunk = ChunkProfile::new(layout, &regions, &tensors, 0);
        let last = ChunkProfile::new(layout, &regions, &tensors, layout.chunks - 1);
        MemoryProfile {
            tensors,
            regions,
            kv_bytes,
            shadow_bytes,
            budgets,
            chunk,
            last,
            chunks: layout.chunks,
        }
    }

    /// The profile of chunk `chunk`.
    pub fn of(&self, chunk: u32) -> &ChunkProfile {
        if chunk + 1 == self.chunks {
            &self.last
        } else {
            &self.chunk
        }
    }

    /// Bytes held for the whole prefill in `column`: the KV cache and the shadow's
    /// resident weight rows.
    pub fn resident_bytes(&self, column: usize) -> u64 {
        self.kv_bytes[column].saturating_add(self.shadow_bytes[column])
    }

    /// Columns: regions, then the device total.
    pub fn columns(&self) -> usize {
        self.budgets.len()
    }

    /// Name of a column: the region's, or `device` for the total.
    pub fn column_name(&self, column: usize) -> &str {
        self.regions
            .get(column)
            .map_or("device (all regions)", |r| r.name.as_str())
    }

    /// The least budget each column needs: KV cache plus the largest one chunk holds.
    pub fn minimum_bytes(&self) -> Vec<u64> {
        (0..self.columns())
            .map(|r| {
                self.resident_bytes(r)
                    .saturating_add(self.chunk.peak(r).max(self.last.peak(r)))
            })
            .collect()
    }

    /// Whether every region's budget holds every chunk at its peak at once: then memory
    /// never delays a job and dispatch can skip its checks.
    pub fn unconstrained(&self) -> bool {
        (0..self.columns()).all(|r| {
            let chunks = u128::from(self.chunks.saturating_sub(1)) * u128::from(self.chunk.peak(r))
                + u128::from(self.last.peak(r))
                + u128::from(self.resident_bytes(r));
            chunks <= u128::from(self.budgets[r])
        })
    }

    /// Refuses a budget that can never be met: one chunk alone, with the KV cache and the
    /// shadow's weight rows, must fit in every region.
    ///
    /// # Errors
    /// [`MemoryError::NeverFits`] for the first region too small.
    pub fn check_feasible(&self) -> Result<(), MemoryError> {
        for (r, needed) in self.minimum_bytes().into_iter().enumerate() {
            if needed > self.budgets[r] {
                return Err(MemoryError::NeverFits {
                    region: self.column_name(r).to_string(),
                    needed,
                    available: self.budgets[r],
                    kv_cache: self.kv_bytes[r],
                    shadow_weights: self.shadow_bytes[r],
                    chunk_peak: self.chunk.peak(r).max(self.last.peak(r)),
                });
            }
        }
        Ok(())
    }
}
