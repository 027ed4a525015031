//! Chrome trace event JSON (the format ui.perfetto.dev and chrome://tracing open).
//!
//! One process for the device, one named thread per processor, an `X` slice per subgraph
//! (chunk, stage, template and operators in `args`), `s`/`f` flow events for dependencies
//! that cross processors, and `C` counter events.

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
    let mut events: Vec<Value> = vec![json!({
        "ph": "M", "name": "process_name", "pid": PID, "tid": 0,
        "args": { "name": trace.title },
    })];
    for (lane, l) in trace.lanes.iter().enumerate() {
        events.push(json!({
            "ph": "M", "name": "thread_name", "pid": PID, "tid": tid(lane),
            "args": { "name": format!("{} ({})", l.name, l.kind) },
        }));
        events.push(json!({
            "ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid(lane),
            "args": { "sort_index": lane },
        }));
    }
    for s in &trace.slices {
        events.push(json!({
            "ph": "X", "name": s.template, "cat": format!("chunk {}", s.key.chunk),
            "pid": PID, "tid": tid(s.lane), "ts": us(s.start_ns), "dur": us(s.end_ns - s.start_ns),
            "args": {
                "chunk": s.key.chunk, "stage": s.key.stage, "template": s.template,
                "ops": s.ops, "shared": s.shared,
            },
        }));
    }
    for (id, f) in trace.flows.iter().enumerate() {
        let (from, to) = (&trace.slices[f.from], &trace.slices[f.to]);
        // The flow leaves from inside the producing slice (1 ns before its end) and binds
        // to the enclosing slice at the consumer's start.
        let leave = from.end_ns.saturating_sub(1).max(from.start_ns);
        events.push(json!({
            "ph": "s", "name": "dependency", "cat": "dependency", "id": id,
            "pid": PID, "tid": tid(from.lane), "ts": us(leave),
        }));
        events.push(json!({
            "ph": "f", "bp": "e", "name": "dependency", "cat": "dependency", "id": id,
            "pid": PID, "tid": tid(to.lane), "ts": us(to.start_ns),
        }));
    }
    for (name, samples) in &trace.counters {
        for sample in samples {
            events.push(json!({
                "ph": "C", "name": name, "pid": PID, "ts": us(sample.at_ns),
                "args": { "value": sample.value },
            }));
        }
    }
    let doc = json!({ "displayTimeUnit": "ms", "traceEvents": events });
    serde_json::to_string(&doc).expect("trace JSON always serialises")
}
