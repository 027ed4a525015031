//! Chrome trace event JSON (the format ui.perfetto.dev and chrome://tracing open).
//!
//! One process for the device, one named thread per processor, an `X` slice per subgraph
//! (chunk, stage, template and operators in `args`), `s`/`f` flow events for dependencies
//! that cross processors, and `C` counter events. [`to_chrome_json_with_prediction`] adds
//! a second process, "predicted", with the simulated slices of the same plan
//! (`hetsched run --predict --trace`).

use serde_json::{Value, json};

use super::Trace;

const PID: u32 = 1;

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn tid(lane: usize) -> usize {
    lane + 1
}

/// Renders `trace` as Chrome trace JSON.
pub fn to_chrome_json(trace: &Trace) -> String {
    document(events(trace, PID, &trace.title))
}

/// Renders a real run's `measured` trace beside its `predicted` one (the simulation of the
/// same plan): two processes, "measured" and "predicted", each with a thread per
/// processor, on the same time axis.
pub fn to_chrome_json_with_prediction(measured: &Trace, predicted: &Trace) -> String {
    let mut all = events(measured, PID, &format!("measured: {}", measured.title));
    all.extend(events(
        predicted,
        PID + 1,
        "predicted (simulated with the same profile)",
    ));
    document(all)
}

fn document(events: Vec<Value>) -> String {
    let doc = json!({ "displayTimeUnit": "ms", "traceEvents": events });
    serde_json::to_string(&doc).expect("trace JSON always serialises")
}

/// The events of `trace` as process `pid` named `process`.
fn events(trace: &Trace, pid: u32, process: &str) -> Vec<Value> {
    let mut events: Vec<Value> = vec![json!({
        "ph": "M", "name": "process_name", "pid": pid, "tid": 0,
        "args": { "name": process },
    })];
    for (lane, l) in trace.lanes.iter().enumerate() {
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": pid, "tid": tid(lane),
            "args": { "name": format!("{} ({})", l.name, l.kind) },
        }));
        events.push(json!({
            "ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid(lane),
            "args": { "sort_index": lane },
        }));
    }
    for s in &trace.slices {
        // In a trace of several requests, a slice is named by its request first: the
        // viewer colours slices by name, so each request gets its colour.
        let (name, cat) = match s.request {
            Some(r) => (format!("r{r} {}", s.template), format!("request {r}")),
            None => (s.template.clone(), format!("chunk {}", s.key.chunk)),
        };
        let mut args = json!({
            "chunk": s.key.chunk, "stage": s.key.stage, "template": s.template,
            "ops": s.ops, "shared": s.shared,
        });
        // Only a trace of several requests names them: a single run's bytes stay as they were.
        if let Some(r) = s.request {
            args["request"] = json!(r);
        }
        events.push(json!({
            "ph": "X", "name": name, "cat": cat,
            "pid": pid, "tid": tid(s.lane), "ts": us(s.start_ns), "dur": us(s.end_ns - s.start_ns),
            "args": args,
        }));
    }
    // A track per request below the processors: its span from arrival to first token,
    // with a flow from its arrival to the first token.
    for (i, r) in trace.requests.iter().enumerate() {
        let track = tid(trace.lanes.len() + i);
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": pid, "tid": track,
            "args": { "name": format!("request {} ({})", r.id, r.priority) },
        }));
        events.push(json!({
            "ph": "M", "name": "thread_sort_index", "pid": pid, "tid": track,
            "args": { "sort_index": trace.lanes.len() + i },
        }));
        events.push(json!({
            "ph": "X", "name": format!("r{} to first token", r.id), "cat": format!("request {}", r.id),
            "pid": pid, "tid": track, "ts": us(r.arrival_ns),
            "dur": us(r.first_token_ns.saturating_sub(r.arrival_ns)),
            "args": { "request": r.id, "priority": r.priority },
        }));
    }
    for (id, f) in trace.flows.iter().enumerate() {
        let (from, to) = (&trace.slices[f.from], &trace.slices[f.to]);
        // The flow leaves from inside the producing slice (1 ns before its end) and binds
        // to the enclosing slice at the consumer's start.
        let leave = from.end_ns.saturating_sub(1).max(from.start_ns);
        events.push(json!({
            "ph": "s", "name": "dependency", "cat": "dependency", "id": id,
            "pid": pid, "tid": tid(from.lane), "ts": us(leave),
        }));
        events.push(json!({
            "ph": "f", "bp": "e", "name": "dependency", "cat": "dependency", "id": id,
            "pid": pid, "tid": tid(to.lane), "ts": us(to.start_ns),
        }));
    }
    for (name, samples) in &trace.counters {
        for sample in samples {
            events.push(json!({
                "ph": "C", "name": name, "pid": pid, "ts": us(sample.at_ns),
                "args": { "value": sample.value },
            }));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::simulate;

    #[test]
    fn the_prediction_is_a_second_process_with_the_same_lanes() {
        let plan = Arc::new(tiny_plan(1, 128, 64));
        let run = simulate(plan, PolicyRegistry::builtin().create("stall").unwrap()).unwrap();
        let trace = Trace::new("t", &run);
        let both: Value =
            serde_json::from_str(&to_chrome_json_with_prediction(&trace, &trace)).unwrap();
        let events = both["traceEvents"].as_array().unwrap();
        let slices = |pid: u64| {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == pid)
                .count()
        };
        assert_eq!(slices(1), trace.slices.len());
        assert_eq!(slices(2), trace.slices.len());
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert!(names[0].starts_with("measured") && names[1].starts_with("predicted"));
        // The single-run trace is the measured process alone, under its own title.
        let one: Value = serde_json::from_str(&to_chrome_json(&trace)).unwrap();
        assert_eq!(one["traceEvents"][0]["args"]["name"], "t");
    }
}
