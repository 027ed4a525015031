//! Phase 4: metrics: counter tracks for the timeline and tick statistics.

use bevy_ecs::prelude::{Local, Query, Res, ResMut};

use crate::components::{BusySlot, Processor, SubgraphInstance};
use crate::request::{LiveRuns, OfRequest, RequestRun};
use crate::resources::{Clock, CounterSample, Index, RunStats, TimelineLog};

/// Samples per-processor ready-queue lengths (every armed request's), the number of
/// (request, chunk) pairs with work in flight and the live bytes of every memory region
/// summed over the armed requests (`live bytes <region>`), adding a counter point only
/// where a value changed.
#[allow(clippy::too_many_arguments)]
pub fn record_metrics(
    clock: Res<Clock>,
    index: Res<Index>,
    live: Res<LiveRuns>,
    runs: Query<&RequestRun>,
    instances: Query<(&SubgraphInstance, &OfRequest)>,
    processors: Query<(&Processor, &BusySlot)>,
    mut timeline: ResMut<TimelineLog>,
    mut stats: ResMut<RunStats>,
    mut values: Local<Vec<f64>>,
) {
    stats.ticks += 1;
    let lanes = index.processors.len();
    let armed = || live.requests.iter().filter_map(|&e| runs.get(e).ok());
    let Some(first) = armed().next() else {
        return;
    };
    let profile = first.memory().profile();
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
        for column in 0..profile.columns() {
            let name = match profile.regions.get(column) {
                Some(region) => format!("live bytes {}", region.name),
                None => "live bytes device".to_string(),
            };
            timeline.counters.push((name, Vec::new()));
        }
    }
    let columns = profile.columns();
    values.clear();
    values.resize(lanes + 1 + columns, 0.0);
    let mut running_chunks: Vec<(OfRequest, u32)> = processors
        .iter()
        .filter_map(|(_, s)| s.running)
        .filter_map(|id| index.instances[id as usize])
        .filter_map(|e| instances.get(e).ok())
        .map(|(instance, owner)| (*owner, instance.key.chunk))
        .collect();
    running_chunks.sort_unstable_by_key(|(o, c)| (o.0, *c));
    running_chunks.dedup();
    values[lanes] = running_chunks.len() as f64;
    for run in armed() {
        for (lane, queue) in run.ready.lanes.iter().enumerate() {
            values[lane] += queue.len() as f64;
        }
        for (column, &bytes) in run.memory().live().iter().enumerate().take(columns) {
            values[lanes + 1 + column] += bytes as f64;
        }
    }
    for ((_, samples), &value) in timeline.counters.iter_mut().zip(values.iter()) {
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
