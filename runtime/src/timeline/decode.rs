//! Decode steps in a timeline: after a generation's prefill, one slice per decode step on
//! the lane that ran it (a step is a few milliseconds, where the prefill's subgraphs are
//! tens of them; drawing a step's dozens of subgraph instances would be thousands of
//! slivers). Slices are named `decode N` and carry the `decode` operator.

use hetsched_systems::InstanceKey;

use super::{Slice, Trace};

/// `trace` (a prefill's) with decode steps added on `lane`: `spans_ns` are each step's
/// start and end, ns after `offset_ns` (where the prefill ended on the trace's clock).
/// Slices stay sorted by (lane, start) and the flows follow them.
pub fn with_decode_steps(
    mut trace: Trace,
    lane: usize,
    offset_ns: u64,
    spans_ns: &[(u64, u64)],
) -> Trace {
    let prefill_slices = trace.slices.len();
    trace
        .slices
        .extend(spans_ns.iter().enumerate().map(|(i, &(start, end))| Slice {
            lane,
            key: InstanceKey {
                chunk: u32::try_from(i).unwrap_or(u32::MAX),
                stage: 0,
            },
            template: format!("decode {i}"),
            ops: vec!["decode".to_string()],
            shadow: false,
            shared: false,
            start_ns: offset_ns.saturating_add(start),
            end_ns: offset_ns.saturating_add(end.max(start)),
            request: None,
        }));
    let mut order: Vec<usize> = (0..trace.slices.len()).collect();
    // Decode slices after every prefill slice of the same start (stable, by index).
    order.sort_by_key(|&i| {
        (
            trace.slices[i].lane,
            trace.slices[i].start_ns,
            i >= prefill_slices,
            i,
        )
    });
    let mut new_index = vec![0; order.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let mut slices: Vec<Option<Slice>> = std::mem::take(&mut trace.slices)
        .into_iter()
        .map(Some)
        .collect();
    trace.slices = order.iter().filter_map(|&i| slices[i].take()).collect();
    for flow in &mut trace.flows {
        flow.from = new_index[flow.from];
        flow.to = new_index[flow.to];
    }
    let last = trace.slices.iter().map(|s| s.end_ns).max().unwrap_or(0);
    trace.makespan_ns = trace.makespan_ns.max(last);
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Flow, Lane};

    fn slice(lane: usize, start_ns: u64, end_ns: u64) -> Slice {
        Slice {
            lane,
            key: InstanceKey {
                chunk: 0,
                stage: lane as u32,
            },
            template: format!("L{lane}"),
            ops: Vec::new(),
            shadow: false,
            shared: false,
            start_ns,
            end_ns,
            request: None,
        }
    }

    #[test]
    fn steps_follow_the_prefill_on_their_lane_and_flows_follow_their_slices() {
        let lanes = ["cpu", "npu"].map(|n| Lane {
            name: n.into(),
            kind: "cpu",
        });
        let trace = Trace {
            title: "t".into(),
            lanes: lanes.to_vec(),
            // Sorted by (lane, start): cpu 0..10, npu 10..30, with a flow cpu -> npu.
            slices: vec![slice(0, 0, 10), slice(1, 10, 30)],
            flows: vec![Flow { from: 0, to: 1 }],
            counters: Vec::new(),
            makespan_ns: 30,
            requests: Vec::new(),
        };
        let with = with_decode_steps(trace, 0, 30, &[(0, 5), (6, 12)]);
        let names: Vec<&str> = with.slices.iter().map(|s| s.template.as_str()).collect();
        assert_eq!(names, ["L0", "decode 0", "decode 1", "L1"]);
        assert_eq!((with.slices[2].start_ns, with.slices[2].end_ns), (36, 42));
        assert_eq!(with.makespan_ns, 42);
        let flow = with.flows[0];
        assert_eq!(
            (
                with.slices[flow.from].template.as_str(),
                with.slices[flow.to].template.as_str()
            ),
            ("L0", "L1")
        );
    }
}
