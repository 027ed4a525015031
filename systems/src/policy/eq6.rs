//! Seed 000's Eq. 6: the set S an instance's completion makes ready, and its stall
//! contribution. Shared by `stall`, `lookahead` and `balance`.

use crate::device::ProcessorKind;
use crate::graph::StageDependency;
use crate::plan::{InstanceKey, PrefillPlan};
use crate::progress::StageProgress;

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
    let mut enabled = Vec::new();
    for_each_enabled(plan, progress, key, |k| enabled.push(k));
    enabled
}

/// Calls `f` on each instance of [`newly_enabled`], in its order, without collecting
/// them (a policy asks this for every ready instance at every decision).
fn for_each_enabled(
    plan: &PrefillPlan,
    progress: &StageProgress,
    key: InstanceKey,
    mut f: impl FnMut(InstanceKey),
) {
    let partner = plan.stages[key.stage as usize]
        .is_shadow()
        .then(|| key.stage - 1);
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
        chunks
            .filter(|&chunk| others_done(chunk))
            .map(|chunk| InstanceKey {
                chunk,
                stage: next_stage,
            })
            .filter(|k| plan.exists(*k))
            .for_each(&mut f);
    }
}

/// The total modeled time of the set S that completing `key` makes ready
/// ([`newly_enabled`]), in ns.
pub fn stall_total(plan: &PrefillPlan, progress: &StageProgress, key: InstanceKey) -> u64 {
    let mut total = 0u64;
    for_each_enabled(plan, progress, key, |k| total += plan.cost_ns(k));
    total
}

/// Stall contribution C of an instance whose S takes `total` ns, run on a processor of
/// `kind` (seed 000, Eq. 6): `total` where the kind runs float work (a CPU/GPU: the most
/// work made ready first), its negation where it runs none (the NPU: S runs on the float
/// processors, so the shortest S first keeps them from holding it up).
pub fn contribution_on(kind: ProcessorKind, total: u64) -> i64 {
    let total = total as i64;
    match kind.runs_float_work() {
        true => total,
        false => -total,
    }
}

/// Stall contribution C of running `key` on a processor of `kind` (seed 000, Eq. 6):
/// [`contribution_on`] of its [`stall_total`].
pub fn stall_contribution(
    plan: &PrefillPlan,
    progress: &StageProgress,
    key: InstanceKey,
    kind: ProcessorKind,
) -> i64 {
    contribution_on(kind, stall_total(plan, progress, key))
}
