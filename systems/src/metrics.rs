//! Phase 4: metrics: counter tracks for the timeline and tick statistics.

use bevy_ecs::prelude::{Query, Res, ResMut};

use crate::components::{BusySlot, Processor};
use crate::memory_dispatch::MemoryLedger;
use crate::resources::{Clock, CounterSample, Plan, ReadyQueues, RunStats, TimelineLog};

/// Samples per-processor ready-queue lengths, the number of chunks with work in flight
/// and the live bytes of every memory region (`live bytes <region>`), adding a counter
/// point only where a value changed.
pub fn record_metrics(
    plan: Res<Plan>,
    clock: Res<Clock>,
    ready: Res<ReadyQueues>,
    processors: Query<(&Processor, &BusySlot)>,
    mut timeline: ResMut<TimelineLog>,
    mut stats: ResMut<RunStats>,
    memory: Res<MemoryLedger>,
) {
    stats.ticks += 1;
    let lanes = ready.lanes.len();
    if timeline.counters.is_empty() {
        let mut names: Vec<(usize, String)> = processors
            .iter()
            .map(|(p, _)| (p.index, format!("ready on {}", p.name)))
            .collect();
        names.sort();
        timeline.counters = names.into_iter().map(|(_, n)| (n, Vec::new())).collect();
        timeline
            .counters
            .push(("chunks running".to_string(), Vec::new()));
        let profile = memory.profile();
        for column in 0..profile.columns() {
            let name = match profile.regions.get(column) {
                Some(region) => format!("live bytes {}", region.name),
                None => "live bytes device".to_string(),
            };
            timeline.counters.push((name, Vec::new()));
        }
    }
    let mut values: Vec<f64> = ready.lanes.iter().map(|q| q.len() as f64).collect();
    let mut running_chunks: Vec<u32> = processors
        .iter()
        .filter_map(|(_, s)| s.running)
        .map(|id| plan.0.key(id as usize).chunk)
        .collect();
    running_chunks.sort_unstable();
    running_chunks.dedup();
    values.push(running_chunks.len() as f64);
    values.extend(memory.live().iter().map(|&b| b as f64));
    debug_assert_eq!(values.len(), 2 * lanes + 2);
    for ((_, samples), value) in timeline.counters.iter_mut().zip(values) {
        match samples.last_mut() {
            Some(last) if last.value == value => {}
            Some(last) if last.at_ns == clock.now_ns => last.value = value,
            _ => samples.push(CounterSample {
                at_ns: clock.now_ns,
                value,
            }),
        }
    }
}
