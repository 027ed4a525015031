//! Phase 1: collect completions from the queues.

use bevy_ecs::prelude::{MessageWriter, Query, Res, ResMut};

use crate::components::{BusySlot, SubgraphState};
use crate::memory_dispatch::MemoryLedger;
use crate::resources::{Inbox, Index, Plan, SliceRecord, SubgraphFinished, TimelineLog};

/// Marks each reported instance Done, frees its processor and the memory its dead
/// tensors held ([`MemoryLedger::finish`]), records its slice, and announces it with
/// [`SubgraphFinished`].
#[allow(clippy::too_many_arguments)]
pub fn collect_completions(
    plan: Res<Plan>,
    index: Res<Index>,
    mut inbox: ResMut<Inbox>,
    mut states: Query<&mut SubgraphState>,
    mut slots: Query<&mut BusySlot>,
    mut timeline: ResMut<TimelineLog>,
    mut finished: MessageWriter<SubgraphFinished>,
    mut memory: ResMut<MemoryLedger>,
) {
    for done in inbox.0.drain(..) {
        let entity = index.instances[done.id as usize]
            .expect("completion for an instance that does not exist");
        let mut state = states
            .get_mut(entity)
            .expect("instance entity without a state");
        assert_eq!(
            *state,
            SubgraphState::Running,
            "instance {} completed while not running",
            done.id
        );
        *state = SubgraphState::Done;
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
        let key = plan.0.key(done.id as usize);
        memory.finish(key);
        timeline.slices.push(SliceRecord {
            id: done.id,
            key,
            processor: done.processor,
            start_ns: done.start_ns,
            end_ns: done.end_ns,
        });
        finished.write(SubgraphFinished { id: done.id });
    }
}
