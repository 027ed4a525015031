//! Phase 2: dependency resolution (seed 000, Eq. 2-3), incremental per completion.

use bevy_ecs::prelude::{Commands, MessageReader, Query, Res, ResMut};

use crate::components::{Ready, RemainingDeps};
use crate::graph::StageDependency;
use crate::plan::InstanceKey;
use crate::progress::StageProgress;
use crate::resources::{Index, Plan, ReadyQueues, SubgraphFinished};

/// For each finished instance G(i, j), every stage k waiting for j (usually j+1; a
/// shadow's pair, see [`crate::graph`]): an intra-chunk G(i, k) loses one dependency; for
/// a cross-chunk stage k, every chunk the done prefix of stage j newly covers does.
/// Newly ready instances join the ready queue of every processor the policy may run them
/// on.
pub fn resolve_dependencies(
    plan: Res<Plan>,
    index: Res<Index>,
    mut finished: MessageReader<SubgraphFinished>,
    mut progress: ResMut<StageProgress>,
    mut instances: Query<&mut RemainingDeps>,
    mut ready: ResMut<ReadyQueues>,
    mut commands: Commands,
) {
    let plan = &plan.0;
    for message in finished.read() {
        let key = plan.key(message.id as usize);
        let grown = progress.mark_done(plan, key);
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
                let entity = index.instances[id].expect("existing instance without an entity");
                let mut remaining = instances
                    .get_mut(entity)
                    .expect("instance entity without deps");
                remaining.0 -= 1;
                if remaining.0 == 0 {
                    commands.entity(entity).insert(Ready);
                    ready.insert(plan, id as u32);
                }
            }
        }
    }
}
