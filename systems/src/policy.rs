//! Scheduling policies: which ready subgraph an idle processor runs next.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::device::ProcessorKind;
use crate::graph::StageDependency;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;

/// A scheduling policy, selectable by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// NPU-stall contribution heuristic (seed 000, Eq. 6).
    #[default]
    Stall,
    /// Each processor runs its subgraphs in (chunk, stage) order and never skips ahead:
    /// the naive overlap of seed 000, Fig. 13a.
    InOrder,
}

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 2] = [Policy::Stall, Policy::InOrder];

    /// Name as written on the command line and in scenes.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Stall => "stall",
            Policy::InOrder => "inorder",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy `{s}`; choose one of: {}", names.join(", "))
            })
    }
}

/// The instances that become ready when `key` completes, given what is done now: the set
/// S of seed 000, Eq. 6.
pub fn newly_enabled(
    plan: &PrefillPlan,
    progress: &StageProgress,
    key: InstanceKey,
) -> Vec<InstanceKey> {
    let next_stage = key.stage + 1;
    if next_stage >= plan.stage_count() {
        return Vec::new();
    }
    match plan.stages[next_stage as usize].dependency {
        StageDependency::None => Vec::new(),
        StageDependency::IntraChunk => {
            let next = InstanceKey {
                chunk: key.chunk,
                stage: next_stage,
            };
            if plan.exists(next) {
                vec![next]
            } else {
                Vec::new()
            }
        }
        StageDependency::CrossChunk => {
            // Completing `key` extends the done prefix of its stage only if every earlier
            // chunk is done; the prefix then runs on over chunks already done.
            if progress.done_prefix(key.stage) != key.chunk {
                return Vec::new();
            }
            let mut enabled = vec![InstanceKey {
                chunk: key.chunk,
                stage: next_stage,
            }];
            let mut chunk = key.chunk + 1;
            while chunk < plan.chunks
                && progress.is_done(
                    plan,
                    InstanceKey {
                        chunk,
                        stage: key.stage,
                    },
                )
            {
                enabled.push(InstanceKey {
                    chunk,
                    stage: next_stage,
                });
                chunk += 1;
            }
            enabled
        }
    }
}

/// Stall contribution C of running `key` on a processor of `kind` (seed 000, Eq. 6):
/// the total time of S if `key` runs on a CPU/GPU, its negation on the NPU.
pub fn stall_contribution(
    plan: &PrefillPlan,
    progress: &StageProgress,
    key: InstanceKey,
    kind: ProcessorKind,
) -> i64 {
    let total: u64 = newly_enabled(plan, progress, key)
        .into_iter()
        .map(|k| plan.cost_ns(k))
        .sum();
    let total = total as i64;
    if kind == ProcessorKind::Npu {
        -total
    } else {
        total
    }
}

/// Picks the ready instance with the largest stall contribution; ties go to the earliest
/// (chunk, stage).
pub fn pick_stall(
    plan: &PrefillPlan,
    progress: &StageProgress,
    ready: &BTreeSet<u32>,
    kind: ProcessorKind,
) -> Option<u32> {
    let mut best: Option<(i64, u32)> = None;
    for &id in ready {
        let c = stall_contribution(plan, progress, plan.key(id as usize), kind);
        if best.is_none_or(|(bc, _)| c > bc) {
            best = Some((c, id));
        }
    }
    best.map(|(_, id)| id)
}

/// In-order: the processor's next instance in (chunk, stage) order, only if it is ready.
pub fn pick_in_order(sequence: &[u32], cursor: &mut usize, ready: &BTreeSet<u32>) -> Option<u32> {
    let next = *sequence.get(*cursor)?;
    if ready.contains(&next) {
        *cursor += 1;
        Some(next)
    } else {
        None
    }
}
