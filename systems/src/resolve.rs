//! Phase 2: dependency resolution (seed 000, Eq. 2-3), incremental per completion.

use bevy_ecs::prelude::{MessageReader, Query, Res, ResMut};

use crate::components::RemainingDeps;
use crate::graph::StageDependency;
use crate::plan::InstanceKey;
use crate::request::{LiveRuns, RequestRun};
use crate::resources::{Index, SubgraphFinished};

/// For each finished instance G(i, j) of a request's run, every stage k waiting for j
/// (usually j+1; a shadow's pair, see [`crate::graph`]): an intra-chunk G(i, k) loses one
/// dependency; for a cross-chunk stage k, every chunk the done prefix of stage j newly
/// covers does. Newly ready instances join the run's ready queue of every processor its
/// policy may run them on. A run whose last instance is done is announced in
/// [`LiveRuns::finished`].
pub fn resolve_dependencies(
    index: Res<Index>,
    mut finished: MessageReader<SubgraphFinished>,
    mut runs: Query<&mut RequestRun>,
    mut instances: Query<&mut RemainingDeps>,
    mut live: ResMut<LiveRuns>,
) {
    for message in finished.read() {
        let mut run = runs
            .get_mut(message.request)
            .expect("a finished instance of an armed run");
        let run = &mut *run;
        let plan = &run.plan;
        let base = run.base as usize;
        let key = plan.key(message.id as usize - base);
        let grown = run.progress.mark_done(plan, key);
        live.outstanding -= 1;
        if run.progress.done_count() == plan.instance_count() {
            live.finished.push(message.request);
        }
        for &next_stage in plan.successor_stages(key.stage) {
            let chunks = match plan.stages[next_stage as usize].dependency {
                StageDependency::None => continue,
                StageDependency::IntraChunk => key.chunk..key.chunk + 1,
                StageDependency::CrossChunk => grown.clone(),
            };
            for chunk in chunks {
                let next = InstanceKey {
                    chunk,
                    stage: next_stage,
                };
                if !plan.exists(next) {
                    continue;
                }
                let id = plan.id(next);
                let entity =
                    index.instances[base + id].expect("existing instance without an entity");
                let mut remaining = instances
                    .get_mut(entity)
                    .expect("instance entity without deps");
                remaining.0 -= 1;
                if remaining.0 == 0 {
                    run.ready.insert(plan, id as u32);
                }
            }
        }
    }
}
