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
    /// NPU-stall contribution heuristic (seed 000, Eq. 6), exactly as written.
    #[default]
    Stall,
    /// Each processor runs its subgraphs in (chunk, stage) order and never skips ahead:
    /// the naive overlap of seed 000, Fig. 13a.
    InOrder,
    /// The peer implementation's fixed pipeline: two chunks in flight, the second lagging
    /// the first by one subgraph, a barrier after every step.
    Peer,
    /// HEFT as list scheduling: the ready instance with the largest upward rank (bottom
    /// level) first.
    Heft,
    /// Critical-path-first: the ready instance on the longest path through the graph (top
    /// level + bottom level) first, ties to the larger bottom level.
    Cpf,
    /// Ours: Eq. 6's stall contribution, with the NPU lane and ties ordered by upward rank
    /// so the chunk furthest behind is never starved (see docs/policies.md).
    Lookahead,
}

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 6] = [
        Policy::Stall,
        Policy::InOrder,
        Policy::Peer,
        Policy::Heft,
        Policy::Cpf,
        Policy::Lookahead,
    ];

    /// Name as written on the command line and in scenes.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Stall => "stall",
            Policy::InOrder => "inorder",
            Policy::Peer => "peer",
            Policy::Heft => "heft",
            Policy::Cpf => "cpf",
            Policy::Lookahead => "lookahead",
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

/// The ready id with the largest score; ties go to the earliest (chunk, stage), which is
/// the smallest id because ready sets iterate in id order.
fn pick_max_by<S: PartialOrd>(
    ready: &BTreeSet<u32>,
    mut score: impl FnMut(u32) -> S,
) -> Option<u32> {
    let mut best: Option<(S, u32)> = None;
    for &id in ready {
        let s = score(id);
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            best = Some((s, id));
        }
    }
    best.map(|(_, id)| id)
}

/// Picks the ready instance with the largest stall contribution (Eq. 6).
pub fn pick_stall(
    plan: &PrefillPlan,
    progress: &StageProgress,
    ready: &BTreeSet<u32>,
    kind: ProcessorKind,
) -> Option<u32> {
    pick_max_by(ready, |id| {
        stall_contribution(plan, progress, plan.key(id as usize), kind)
    })
}

/// HEFT list scheduling: largest upward rank first.
pub fn pick_heft(plan: &PrefillPlan, ready: &BTreeSet<u32>) -> Option<u32> {
    pick_max_by(ready, |id| plan.bottom_level_ns(plan.key(id as usize)))
}

/// Critical-path-first: longest path through the instance first.
pub fn pick_cpf(plan: &PrefillPlan, ready: &BTreeSet<u32>) -> Option<u32> {
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        (
            plan.top_level_ns(key) + plan.bottom_level_ns(key),
            plan.bottom_level_ns(key),
        )
    })
}

/// Ours: Eq. 6 with two changes, measured on the shipped scenes (docs/policies.md).
/// 1. When no other processor has ready work, the NPU runs the job whose float
///    successors are the *longest* (the opposite of Eq. 6's NPU rule): the idle CPU gets
///    the heavy attention of later chunks early instead of at the end, where it would
///    leave the NPU waiting.
/// 2. Ties in Eq. 6 (common: every chunk's copy of a static stage has the same cost) go
///    to the larger upward rank, the instance with the most work still behind it, instead
///    of the earliest (chunk, stage).
///
/// `others_ready` is the number of ready instances on every other processor.
pub fn pick_lookahead(
    plan: &PrefillPlan,
    progress: &StageProgress,
    ready: &BTreeSet<u32>,
    kind: ProcessorKind,
    others_ready: usize,
) -> Option<u32> {
    let feed_idle_cpu = kind == ProcessorKind::Npu && others_ready == 0;
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        let c = stall_contribution(plan, progress, key, kind);
        let rank = plan.bottom_level_ns(key);
        (if feed_idle_cpu { -c } else { c }, rank)
    })
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

/// State of the peer's fixed pipeline: which pair of chunks, which step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerPipeline {
    /// Chunks `2 * pair` and `2 * pair + 1` are in flight.
    pub pair: u32,
    /// Step within the pair: the first chunk runs stage `step`, the second `step - LAG`.
    pub step: u32,
}

impl PeerPipeline {
    /// How many subgraphs the second chunk of a pair lags the first.
    pub const LAG: u32 = 1;

    /// The instances of the current step.
    pub fn members(&self, plan: &PrefillPlan) -> Vec<InstanceKey> {
        let first = InstanceKey {
            chunk: 2 * self.pair,
            stage: self.step,
        };
        let second = self.step.checked_sub(Self::LAG).map(|stage| InstanceKey {
            chunk: 2 * self.pair + 1,
            stage,
        });
        [Some(first), second]
            .into_iter()
            .flatten()
            .filter(|k| plan.exists(*k))
            .collect()
    }

    /// Moves past every step whose instances are all done (the barrier); returns the
    /// members of the current step, empty when the prompt is finished.
    pub fn advance(&mut self, plan: &PrefillPlan, progress: &StageProgress) -> Vec<InstanceKey> {
        let steps = plan.stage_count() + Self::LAG;
        loop {
            if 2 * self.pair >= plan.chunks {
                return Vec::new();
            }
            if self.step >= steps {
                self.pair += 1;
                self.step = 0;
                continue;
            }
            let members = self.members(plan);
            if members.iter().any(|k| !progress.is_done(plan, *k)) {
                return members;
            }
            self.step += 1;
        }
    }
}

/// Peer pipeline: a member of the current step on this lane, if ready.
pub fn pick_peer(
    plan: &PrefillPlan,
    progress: &StageProgress,
    state: &mut PeerPipeline,
    ready: &BTreeSet<u32>,
) -> Option<u32> {
    state
        .advance(plan, progress)
        .into_iter()
        .map(|k| plan.id(k) as u32)
        .find(|id| ready.contains(id))
}
