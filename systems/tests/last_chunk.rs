//! A prompt that is not a multiple of the chunk length: the short last chunk is priced
//! at the tokens it holds where the processor runs what it is given (CPU, GPU, measured
//! costs), and at the full chunk on an NPU priced by the roofline (pre-built graphs of a
//! fixed length, as seed 000 pads).

use hetsched_systems::testing::tiny_plan;
use hetsched_systems::{InstanceKey, ProcessorKind};

#[test]
fn the_short_last_chunk_is_priced_at_its_tokens_except_on_a_roofline_npu() {
    // 300 tokens in chunks of 128: the third chunk holds 44.
    let short = tiny_plan(2, 300, 128);
    let full = tiny_plan(2, 384, 128);
    let (mut cheaper, mut padded) = (0, 0);
    for stage in 0..short.stages.len() as u32 {
        let key = InstanceKey { chunk: 2, stage };
        if !short.exists(key) {
            continue;
        }
        let lane = short.processor(key);
        let (s, f) = (short.cost_ns(key), full.cost_ns(key));
        match short.device.processors[lane].kind {
            ProcessorKind::Npu => {
                assert_eq!(s, f, "stage {stage}: an NPU runs the padded chunk");
                padded += 1;
            }
            _ => {
                assert!(
                    s < f,
                    "stage {stage}: 44 tokens cost {s} ns, 128 cost {f} ns"
                );
                cheaper += 1;
            }
        }
        // Earlier chunks are full in both plans.
        let first = InstanceKey { chunk: 0, stage };
        if short.exists(first) {
            assert_eq!(short.cost_ns(first), full.cost_ns(first));
        }
    }
    assert!(
        cheaper > 0 && padded > 0,
        "both kinds of processor were checked"
    );
}

#[test]
fn the_instance_count_kept_is_the_instances_listed() {
    // One chunk, several, a short last one: the head (last chunk only) once.
    for (layers, prompt_len, chunk_len) in [(1, 64, 64), (2, 300, 128), (3, 1024, 256), (2, 1, 1)] {
        let plan = tiny_plan(layers, prompt_len, chunk_len);
        assert_eq!(plan.instance_count(), plan.instances().count());
    }
}
