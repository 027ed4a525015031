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
    /// Ours: `lookahead` whose front-loading only runs while the NPU's remaining work does
    /// not exceed the float processors', and which lets an idle processor take another's
    /// job when that keeps the loads balanced (see docs/policies.md). The default: it meets
    /// the schedule-quality goal on every shipped phone scene.
    #[default]
    Balance,
}

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 7] = [
        Policy::Stall,
        Policy::InOrder,
        Policy::Peer,
        Policy::Heft,
        Policy::Cpf,
        Policy::Lookahead,
        Policy::Balance,
    ];

    /// Whether the policy may run an instance on any of its eligible processors. `inorder`
    /// and `peer` are fixed pipelines: they keep every instance on its home processor.
    pub fn chooses_placement(self) -> bool {
        !matches!(self, Policy::InOrder | Policy::Peer)
    }

    /// Name as written on the command line and in scenes.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Stall => "stall",
            Policy::InOrder => "inorder",
            Policy::Peer => "peer",
            Policy::Heft => "heft",
            Policy::Cpf => "cpf",
            Policy::Lookahead => "lookahead",
            Policy::Balance => "balance",
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

/// The processors whose ready queues hold `key` while it is ready under `policy`: every
/// eligible one, or only its home for a policy that keeps fixed placement.
pub fn queue_lanes(plan: &PrefillPlan, policy: Policy, key: InstanceKey) -> &[usize] {
    let lanes = plan.eligible(key);
    if policy.chooses_placement() {
        lanes
    } else {
        &lanes[..1]
    }
}

/// When each processor could start a new job: now if idle, else when its running job is
/// modeled to end (ns, by lane).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneTimes {
    /// The current time.
    pub now_ns: u64,
    /// Earliest start per lane.
    pub free_at_ns: Vec<u64>,
}

impl LaneTimes {
    /// Whether `lane` finishes `key` no later than any other processor `key` may run on
    /// would (earliest finish time, HEFT's processor rule): the guard that keeps a slow
    /// processor from taking a job a faster one would finish sooner even after its
    /// current job. Always true for an instance with one eligible processor.
    pub fn finishes_first(&self, plan: &PrefillPlan, key: InstanceKey, lane: usize) -> bool {
        let lanes = plan.eligible(key);
        if lanes.len() == 1 {
            return true;
        }
        let Some(here) = plan.cost_on(key, lane) else {
            return false;
        };
        let finish_here = self.free_at_ns[lane].max(self.now_ns) + here;
        lanes.iter().filter(|&&l| l != lane).all(|&l| {
            plan.cost_on(key, l)
                .is_none_or(|c| finish_here <= self.free_at_ns[l].max(self.now_ns) + c)
        })
    }
}

/// The instances that become ready when `key` completes, given what is done now: the set
/// S of seed 000, Eq. 6. A stage that also waits for another (a shadow's pair) joins S
/// only if that one is done already, except that a shadow counts its INT8 stage as done:
/// the shadow is the short job the merge will wait for while the NPU runs that stage, so
/// Eq. 6 must see what it holds up.
pub fn newly_enabled(
    plan: &PrefillPlan,
    progress: &StageProgress,
    key: InstanceKey,
) -> Vec<InstanceKey> {
    let partner = plan.stages[key.stage as usize]
        .is_shadow()
        .then(|| key.stage - 1);
    let mut enabled = Vec::new();
    for &next_stage in plan.successor_stages(key.stage) {
        let template = &plan.stages[next_stage as usize];
        let chunks = match template.dependency {
            StageDependency::None => continue,
            StageDependency::IntraChunk => key.chunk..key.chunk + 1,
            StageDependency::CrossChunk => {
                // Completing `key` extends the done prefix of its stage only if every
                // earlier chunk is done; the prefix then runs on over chunks already done.
                if progress.done_prefix(key.stage) != key.chunk {
                    continue;
                }
                let mut end = key.chunk + 1;
                while end < plan.chunks
                    && progress.is_done(
                        plan,
                        InstanceKey {
                            chunk: end,
                            stage: key.stage,
                        },
                    )
                {
                    end += 1;
                }
                key.chunk..end
            }
        };
        let others_done = |chunk: u32| {
            let waited = |s: &&u32| **s != key.stage && Some(**s) != partner;
            template
                .after
                .iter()
                .filter(waited)
                .all(|&s| match template.dependency {
                    StageDependency::CrossChunk => progress.done_prefix(s) > chunk,
                    _ => progress.is_done(plan, InstanceKey { chunk, stage: s }),
                })
        };
        enabled.extend(
            chunks
                .filter(|&chunk| others_done(chunk))
                .map(|chunk| InstanceKey {
                    chunk,
                    stage: next_stage,
                })
                .filter(|k| plan.exists(*k)),
        );
    }
    enabled
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
/// the smallest id because ready sets iterate in id order. A score of `None` means "not
/// a candidate on this lane".
fn pick_max_by<S: PartialOrd>(
    ready: &BTreeSet<u32>,
    mut score: impl FnMut(u32) -> Option<S>,
) -> Option<u32> {
    let mut best: Option<(S, u32)> = None;
    for &id in ready {
        let Some(s) = score(id) else { continue };
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
        Some(stall_contribution(
            plan,
            progress,
            plan.key(id as usize),
            kind,
        ))
    })
}

/// HEFT as online list scheduling: among the ready instances this lane would finish
/// first (earliest finish time over their eligible processors), the largest upward rank
/// (mean-cost bottom level). Higher-ranked instances another processor finishes sooner
/// are left for it.
pub fn pick_heft(
    plan: &PrefillPlan,
    ready: &BTreeSet<u32>,
    lane: usize,
    times: &LaneTimes,
) -> Option<u32> {
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        times
            .finishes_first(plan, key, lane)
            .then(|| plan.upward_rank_ns(key))
    })
}

/// Critical-path-first: longest path through the instance first.
pub fn pick_cpf(plan: &PrefillPlan, ready: &BTreeSet<u32>) -> Option<u32> {
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        Some((
            plan.top_level_ns(key) + plan.bottom_level_ns(key),
            plan.bottom_level_ns(key),
        ))
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
/// 3. Under flexible placement, only instances this lane finishes first (see
///    [`LaneTimes::finishes_first`]) are candidates.
///
/// `others_idle` tells whether every other processor has no ready work of its own.
pub fn pick_lookahead(
    plan: &PrefillPlan,
    progress: &StageProgress,
    ready: &BTreeSet<u32>,
    (lane, kind): (usize, ProcessorKind),
    times: &LaneTimes,
    others_idle: bool,
) -> Option<u32> {
    let feed_idle_cpu = kind == ProcessorKind::Npu && others_idle;
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        if !times.finishes_first(plan, key, lane) {
            return None;
        }
        let c = stall_contribution(plan, progress, key, kind);
        let rank = plan.bottom_level_ns(key);
        Some((if feed_idle_cpu { -c } else { c }, rank))
    })
}

/// What `balance` knows about the processors beyond this lane's ready queue.
#[derive(Clone, Copy, Debug)]
pub struct BalanceView<'a> {
    /// When each lane can start its next job.
    pub times: &'a LaneTimes,
    /// Modeled work not yet dispatched, by home lane (ns).
    pub remaining_ns: &'a [u64],
    /// Modeled work of the ready instances, by home lane (ns).
    pub ready_ns: &'a [u64],
    /// Whether no other processor has ready work of its own.
    pub others_idle: bool,
    /// Whether the float processors' remaining work is at least
    /// 1 / [`FRONT_LOAD_RATIO`] of the NPU's ([`float_threatens_tail`]).
    pub float_threatens_tail: bool,
}

/// `balance` front-loads float work freely while the NPU has at most this many times the
/// float processors' remaining work (measured on the shipped scenes: 1.5 to 2.5 meet the
/// goals on all of them; docs/policies.md).
pub const FRONT_LOAD_RATIO: u64 = 2;

/// `balance` lets a processor take another's job (beyond an earliest-finish win) only if
/// the home processor's ready backlog covers at least this share of the job's run here,
/// in percent (measured on the shipped CPU + GPU + NPU scenes: 60 to 80 meet the goals;
/// 100 leaves the CPU idle, 40 or less starves the NPU; docs/policies.md).
pub const STEAL_COVER_PERCENT: u64 = 70;

/// Whether the NPU lanes' remaining work is at most [`FRONT_LOAD_RATIO`] times the other
/// lanes' (by home lane): the float side then threatens the tail.
pub fn float_threatens_tail(plan: &PrefillPlan, remaining_ns: &[u64]) -> bool {
    let (mut npu, mut float) = (0u64, 0u64);
    for (spec, &work) in plan.device.processors.iter().zip(remaining_ns) {
        if spec.kind == ProcessorKind::Npu {
            npu += work;
        } else {
            float += work;
        }
    }
    npu <= FRONT_LOAD_RATIO * float
}

/// Ours, `balance`: `lookahead` with two changes (docs/policies.md).
/// 1. While the other processors are idle, the NPU front-loads (runs the job whose float
///    successors S are the longest) freely only while the float side threatens the tail
///    ([`float_threatens_tail`]). Otherwise it front-loads only a job whose S the float
///    processors finish while the NPU works through the rest of its ready queue; if none
///    fits, Eq. 6's rule stands (shortest S first), so the NPU is never left waiting for
///    float work it did not need to wait for.
/// 2. Under flexible placement a processor runs its own (home) jobs first. It takes
///    another processor's job if it finishes it first ([`LaneTimes::finishes_first`]),
///    or if (a) the home processor's ready work covers most of the job's run here
///    ([`STEAL_COVER_PERCENT`]) and
///    (b) it finishes the job and all its own remaining work before the home processor
///    finishes the rest of its own: a steal that evens out the loads without starving
///    the home processor or extending its tail. Of those, the least urgent (smallest
///    bottom level) first: the home processor keeps the urgent ones.
pub fn pick_balance(
    plan: &PrefillPlan,
    progress: &StageProgress,
    ready: &BTreeSet<u32>,
    (lane, kind): (usize, ProcessorKind),
    view: BalanceView<'_>,
) -> Option<u32> {
    let feed_idle_cpu = kind == ProcessorKind::Npu && view.others_idle;
    let times = view.times;
    let now = times.now_ns;
    pick_max_by(ready, |id| {
        let key = plan.key(id as usize);
        let home = plan.processor(key);
        let rank = plan.bottom_level_ns(key) as i64;
        if home != lane {
            let here = plan.cost_on(key, lane)?;
            let home_cost = plan.cost_ns(key);
            let home_free = times.free_at_ns[home].max(now);
            // While this lane runs the job, the float processors keep feeding the home
            // processor, so its ready backlog need only cover part of the run.
            let backlog = home_free - now + view.ready_ns[home] - home_cost;
            let home_stays_busy = backlog * 100 >= here * STEAL_COVER_PERCENT;
            let balanced = now + here + view.remaining_ns[lane]
                <= home_free + view.remaining_ns[home] - home_cost;
            let steal = (home_stays_busy && balanced) || times.finishes_first(plan, key, lane);
            return steal.then_some((false, false, 0, -rank));
        }
        let c = stall_contribution(plan, progress, key, kind);
        if feed_idle_cpu {
            // -c is the time of S on the float processors. It "fits" when the NPU can
            // work through the rest of its ready queue meanwhile; when the float side's
            // remaining work threatens the tail, every S may be front-loaded.
            let backlog = view.ready_ns[lane] - plan.cost_ns(key);
            let fits = view.float_threatens_tail || (-c) as u64 <= backlog;
            return Some((true, fits, if fits { -c } else { c }, rank));
        }
        Some((true, false, c, rank))
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
