//! What is particular to an NPU (the Hexagon, or its emulation): pre-built graphs of
//! static shapes, INT8 linears only, and a memory window of its own.
//!
//! - Shapes. An NPU runs graphs built ahead of time for one shape. A prefill graph is
//!   built for the chunk length, so a short last chunk runs padded to it (as seed 000
//!   pads it) and the roofline prices the padded chunk; a fitted stage cost was measured
//!   as the executors run the chunk and prices the tokens it holds. A decode graph is
//!   built for each of [`NPU_DECODE_ROWS`] rows, and a batch runs at the smallest that
//!   holds it, its padding rows computed and thrown away.
//! - Precision. Its linears are per-tensor W8A8 (a float model's linears run its FP16
//!   path, priced by the operator's work); it runs no float work, so it is the first home
//!   of the INT8 stages and of no other.
//! - Memory. It addresses only its window (4 GiB on the Hexagon): every tensor it
//!   produces or reads lies in its region, which the CPU maps zero-copy.

use super::{HomeWork, KindRules};

/// The static batch shapes (rows) an NPU decode graph is built for; a batch runs at the
/// smallest that holds it, its padding rows computed and thrown away.
pub const NPU_DECODE_ROWS: [usize; 6] = [1, 4, 8, 16, 32, 64];

/// The static shape a batch of `rows` sequences runs at on an NPU (`None`: more rows
/// than the largest shape).
fn decode_graph_rows(rows: usize) -> Option<usize> {
    NPU_DECODE_ROWS.iter().copied().find(|&shape| shape >= rows)
}

/// The NPU's rules.
pub(super) struct Npu;

impl KindRules for Npu {
    fn home_rank(&self, work: HomeWork) -> Option<u8> {
        match work {
            HomeWork::Int8Linears => Some(0),
            HomeWork::Decode => Some(1),
            HomeWork::Float | HomeWork::Shadow => None,
        }
    }

    /// The chunk length its prefill graphs were built for: a short last chunk runs
    /// padded.
    fn static_chunk_tokens(&self, chunk_len: u32) -> Option<u64> {
        Some(u64::from(chunk_len))
    }

    /// The batch padded up to its static shape; the padding rows run at the shortest
    /// context (they cost arithmetic, little cache).
    fn decode_rows(&self, contexts: &[u64]) -> Option<Vec<u64>> {
        let shape = decode_graph_rows(contexts.len())?;
        let shortest = contexts.iter().copied().min()?;
        let mut rows = contexts.to_vec();
        rows.resize(shape, shortest);
        Some(rows)
    }

    fn hosts_tensors_it_touches(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::ProcessorKind;
    use crate::model::ChunkShape;

    #[test]
    fn npu_shapes_pad_up_and_stop_at_the_largest() {
        assert_eq!(decode_graph_rows(1), Some(1));
        assert_eq!(decode_graph_rows(2), Some(4));
        assert_eq!(decode_graph_rows(9), Some(16));
        assert_eq!(decode_graph_rows(64), Some(64));
        assert_eq!(decode_graph_rows(65), None);
    }

    #[test]
    fn a_decode_batch_pads_at_its_shortest_context_on_the_npu_only() {
        let npu = ProcessorKind::Npu;
        assert_eq!(npu.decode_rows(&[9, 3]), Some(vec![9, 3, 3, 3]));
        assert_eq!(npu.decode_rows(&[9; 65]), None);
        assert_eq!(npu.decode_rows(&[]), None);
        assert_eq!(ProcessorKind::Cpu.decode_rows(&[9, 3]), Some(vec![9, 3]));
        assert_eq!(ProcessorKind::Gpu.decode_rows(&[9; 65]), Some(vec![9; 65]));
    }

    #[test]
    fn a_roofline_priced_npu_prices_the_whole_chunk_a_measured_one_what_it_holds() {
        let model = crate::testing::tiny_model(1);
        let device = crate::testing::tiny_device();
        let ops = crate::model::epilogue_ops();
        let short = ChunkShape {
            tokens: 5,
            past: 64,
        };
        for p in &device.processors {
            let want = match p.kind {
                ProcessorKind::Npu => ChunkShape {
                    tokens: 32,
                    past: 64,
                },
                _ => short,
            };
            assert_eq!(p.kind.priced_shape(&p.cost, &model, &ops, short, 32), want);
        }
        let npu = device
            .processors
            .iter()
            .find(|p| p.kind == ProcessorKind::Npu);
        let mut cost = npu.unwrap().cost.clone();
        cost.stages.push(crate::cost::StageCost {
            stage: crate::cost::stage::stage_kind(&ops),
            precision: crate::cost::stage::precision_label(&model),
            launch_us: 1.0,
            per_token_us: 1.0,
            per_pair_us: 0.0,
            window: None,
            per_window_pair_us: 0.0,
            samples: 1,
            fit_error: 0.0,
            noise: 0.0,
        });
        let measured = ProcessorKind::Npu.priced_shape(&cost, &model, &ops, short, 32);
        assert_eq!(measured, short);
    }
}
