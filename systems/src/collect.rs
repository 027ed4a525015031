//! Phase 1: collect completions from the queues.

use bevy_ecs::prelude::{Commands, Entity, MessageWriter, Query, Res, ResMut};

use crate::components::{BusySlot, Running};
use crate::request::{OfRequest, Request, RequestRun};
use crate::resources::{Completion, Inbox, Index, SliceRecord, SubgraphFinished, TimelineLog};
use crate::ride::{Carries, RidingIn};

/// Takes each reported instance off [`Running`], frees its processor and the memory its
/// dead tensors held (its request's `MemoryLedger::finish`), records its slice (for its
/// request) with the modeled duration beside the measured one, and announces it with
/// [`SubgraphFinished`]; the decode rows that rode in its job ([`Carries`]) finish with
/// it, on its lane, the same way. The engine validates completions before they reach the
/// [`Inbox`]; the checks here guard that contract.
#[allow(clippy::too_many_arguments)]
pub fn collect_completions(
    index: Res<Index>,
    mut inbox: ResMut<Inbox>,
    instances: Query<(&Running, &OfRequest)>,
    mut runs: Query<(&Request, &mut RequestRun)>,
    mut slots: Query<&mut BusySlot>,
    mut timeline: ResMut<TimelineLog>,
    mut finished: MessageWriter<SubgraphFinished>,
    mut commands: Commands,
    carried: Query<&Carries>,
) {
    for done in inbox.0.drain(..) {
        let entity = index.instances[done.id as usize]
            .expect("completion for an instance that does not exist");
        let (run, owner) = instances
            .get(entity)
            .unwrap_or_else(|_| panic!("instance {} completed while not running", done.id));
        assert_eq!(
            run.lane, done.processor,
            "instance {} completed on a lane it was not dispatched to",
            done.id
        );
        commands.entity(entity).remove::<Running>();
        let mut slot = slots
            .get_mut(index.processors[done.processor])
            .expect("processor entity without a slot");
        assert_eq!(
            slot.running,
            Some(done.id),
            "processor {} reported a job it was not running",
            done.processor
        );
        slot.running = None;
        slot.busy_ns += done.end_ns - done.start_ns;
        let ended = Ended {
            id: done.id,
            request: owner.0,
            estimated_ns: run.estimated_ns,
        };
        ended.record(&done, &mut runs, &mut timeline, &mut finished);
        // The decode rows that rode in this job end with it, on its lane.
        let Ok(riders) = carried.get(entity) else {
            continue;
        };
        commands.entity(entity).remove::<Carries>();
        for &rider in &riders.0 {
            let rider_entity =
                index.instances[rider as usize].expect("a rider instance that does not exist");
            let (ride, owner) = instances
                .get(rider_entity)
                .unwrap_or_else(|_| panic!("rider {rider} completed while not running"));
            commands
                .entity(rider_entity)
                .remove::<Running>()
                .remove::<RidingIn>();
            let ended = Ended {
                id: rider,
                request: owner.0,
                estimated_ns: ride.estimated_ns,
            };
            ended.record(&done, &mut runs, &mut timeline, &mut finished);
        }
    }
}

/// An instance that ended in a job the queues reported (its own, or the job it rode in).
struct Ended {
    id: u32,
    request: Entity,
    estimated_ns: u64,
}

impl Ended {
    /// Frees the memory its dead tensors held, records its slice on the job's lane and
    /// times, and announces it.
    fn record(
        &self,
        done: &Completion,
        runs: &mut Query<(&Request, &mut RequestRun)>,
        timeline: &mut TimelineLog,
        finished: &mut MessageWriter<SubgraphFinished>,
    ) {
        let (request, mut armed) = runs
            .get_mut(self.request)
            .expect("instance of an armed run");
        let local = self.id - armed.base;
        let key = armed.plan.key(local as usize);
        armed.memory.finish(key);
        timeline.slices.push(SliceRecord {
            id: local,
            request: request.id,
            key,
            processor: done.processor,
            start_ns: done.start_ns,
            end_ns: done.end_ns,
            estimated_ns: self.estimated_ns,
        });
        finished.write(SubgraphFinished {
            id: self.id,
            request: self.request,
        });
    }
}
