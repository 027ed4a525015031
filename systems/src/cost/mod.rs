//! What work costs on a processor, and what is particular to each kind of processor.
//!
//! Every processor is priced by the same two models, whatever its kind: the roofline
//! per operator with its overheads and measured latencies ([`roofline`]: [`CostModel`])
//! and the fitted stage costs a measured profile carries ([`stage`]: [`StageCost`],
//! fitted to measured samples by [`fit`]). The
//! numbers are the device profile's data; what differs between kinds is the rules around
//! them, and those live in one file per kind, behind one interface, the methods of
//! [`ProcessorKind`]:
//!
//! - `npu.rs`: an NPU runs pre-built graphs of static shapes: a prefill chunk is priced
//!   at the chunk length its graph was built for, a decode batch is padded up to one of
//!   [`NPU_DECODE_ROWS`]; it runs the INT8 linears (per-tensor W8A8) and no float work, so
//!   it is their first home and never the float processor; it addresses only its own
//!   memory window, so every tensor it produces or reads lives in its region.
//! - `cpu.rs`: the CPU is the first home of float work, of the outlier shadow and of
//!   decode steps, and the linears' home where there is no NPU (its INT8 path).
//! - `gpu.rs`: the GPU runs float work where there is no CPU, and the linears on a
//!   device of GPUs alone.
//!
//! The plan, the policies, the memory planner and the placement ask these methods instead
//! of comparing kinds, so a rule about a kind is written once, beside its kind's others.

use serde::{Deserialize, Serialize};

use crate::model::{ChunkShape, ModelConfig, OpDecl};

mod cpu;
pub mod fit;
mod gpu;
mod npu;
pub mod roofline;
pub mod stage;

pub use npu::NPU_DECODE_ROWS;
pub use roofline::{CostModel, CostSource, MeasuredLatency, PeakRates};
pub use stage::StageCost;

/// Kind of processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ProcessorKind {
    /// Host CPU cores (one queue).
    Cpu,
    /// GPU (Vulkan queue).
    Gpu,
    /// Neural processing unit (Hexagon queue).
    Npu,
}

/// Work a device gives a default home processor (absent a `[placement]` rule or a
/// named float processor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HomeWork {
    /// Float stages: norms, RoPE, attention, (de)quantisation, the head.
    Float,
    /// INT8 stages: the linears and the SiLU-mul between them.
    Int8Linears,
    /// An outlier shadow stage (float multiplies beside an INT8 stage).
    Shadow,
    /// A decode step run whole on one processor.
    Decode,
}

/// What one kind of processor does differently. The provided methods are the rules of a
/// processor that runs any shape it is given and addresses all of host memory; a kind
/// with other rules overrides them in its own file.
trait KindRules {
    /// How strongly this kind is preferred as the default home of `work`: lower first,
    /// `None` where it never is.
    fn home_rank(&self, work: HomeWork) -> Option<u8>;

    /// The tokens this kind's prefill graph runs a chunk at, where its graphs have a
    /// static shape, for chunks `chunk_len` tokens long (`None`: the tokens the chunk
    /// holds, as the executors run it).
    fn static_chunk_tokens(&self, _chunk_len: u32) -> Option<u64> {
        None
    }

    /// The rows a decode batch of sequences at `contexts` runs as, each row's context
    /// (`None`: no graph of this kind holds the batch).
    fn decode_rows(&self, contexts: &[u64]) -> Option<Vec<u64>> {
        Some(contexts.to_vec())
    }

    /// Whether every tensor a processor of this kind produces or reads must lie in its
    /// own region.
    fn hosts_tensors_it_touches(&self) -> bool {
        false
    }
}

impl ProcessorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ProcessorKind; 3] =
        [ProcessorKind::Cpu, ProcessorKind::Gpu, ProcessorKind::Npu];

    /// Lower-case name, as written in scenes.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessorKind::Cpu => "cpu",
            ProcessorKind::Gpu => "gpu",
            ProcessorKind::Npu => "npu",
        }
    }

    /// The kind named `name` as written in scenes ([`ProcessorKind::as_str`]).
    pub fn from_name(name: &str) -> Option<ProcessorKind> {
        ProcessorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    fn rules(self) -> &'static dyn KindRules {
        match self {
            ProcessorKind::Cpu => &cpu::Cpu,
            ProcessorKind::Gpu => &gpu::Gpu,
            ProcessorKind::Npu => &npu::Npu,
        }
    }

    /// Whether float work may run on this kind. A kind that runs none (the NPU) hands
    /// every stage it completes to the float processors, which is why seed 000's Eq. 6
    /// negates its stall contribution there and `balance` weighs its lanes against the
    /// float ones.
    pub fn runs_float_work(self) -> bool {
        self.rules().home_rank(HomeWork::Float).is_some()
    }

    /// The shape a stage of `ops` is priced at on a processor of this kind priced by
    /// `cost`, for a chunk that executes `executed` (the tokens it holds) of a prompt cut
    /// into chunks of `chunk_len` tokens: the roofline prices a kind of static graphs (an
    /// NPU) at its graph's shape, a fitted stage cost, measured as the executors run the
    /// chunk, and every other kind the tokens the chunk holds.
    pub fn priced_shape(
        self,
        cost: &CostModel,
        model: &ModelConfig,
        ops: &[OpDecl],
        executed: ChunkShape,
        chunk_len: u32,
    ) -> ChunkShape {
        match self.rules().static_chunk_tokens(chunk_len) {
            Some(tokens) if cost.stage_cost(model, ops).is_none() => {
                ChunkShape { tokens, ..executed }
            }
            _ => executed,
        }
    }

    /// The rows a decode batch of sequences at `contexts` (tokens each) runs as on this
    /// kind, each row's context: the batch itself, or on an NPU the batch padded up to
    /// its static shape. `None` where no graph of this kind holds the batch (an NPU's
    /// batch beyond [`NPU_DECODE_ROWS`], or none at all).
    pub fn decode_rows(self, contexts: &[u64]) -> Option<Vec<u64>> {
        self.rules().decode_rows(contexts)
    }

    /// Whether every tensor a processor of this kind produces or reads lies in its own
    /// region (an NPU, which addresses only its window; the CPU maps the same buffer).
    pub fn hosts_tensors_it_touches(self) -> bool {
        self.rules().hosts_tensors_it_touches()
    }
}

/// The lane of `kinds` (a device's processors, in lane order) that is the default home of
/// `work`: the kind ranked first for it, the earliest lane of that kind (`None`: no kind
/// of `kinds` takes it).
pub fn preferred_lane(
    kinds: impl IntoIterator<Item = ProcessorKind>,
    work: HomeWork,
) -> Option<usize> {
    kinds
        .into_iter()
        .enumerate()
        .filter_map(|(lane, kind)| Some((kind.rules().home_rank(work)?, lane)))
        .min()
        .map(|(_, lane)| lane)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProcessorKind::{Cpu, Gpu, Npu};

    #[test]
    fn default_homes_follow_each_kinds_rank() {
        let lane = |kinds: &[ProcessorKind], work| preferred_lane(kinds.iter().copied(), work);
        assert_eq!(lane(&[Npu, Gpu, Cpu], HomeWork::Float), Some(2));
        assert_eq!(lane(&[Npu, Gpu], HomeWork::Float), Some(1));
        assert_eq!(lane(&[Npu], HomeWork::Float), None);
        assert_eq!(lane(&[Gpu, Cpu, Npu], HomeWork::Int8Linears), Some(2));
        assert_eq!(lane(&[Gpu, Cpu], HomeWork::Int8Linears), Some(1));
        assert_eq!(lane(&[Gpu, Gpu], HomeWork::Int8Linears), Some(0));
        assert_eq!(lane(&[Gpu, Npu], HomeWork::Shadow), None);
        assert_eq!(lane(&[Gpu, Cpu], HomeWork::Shadow), Some(1));
        assert_eq!(lane(&[Npu, Gpu, Cpu], HomeWork::Decode), Some(2));
        assert_eq!(lane(&[Npu, Gpu], HomeWork::Decode), Some(0));
        assert_eq!(lane(&[], HomeWork::Decode), None);
    }

    #[test]
    fn only_the_npu_runs_no_float_work_and_hosts_what_it_touches() {
        for kind in ProcessorKind::ALL {
            assert_eq!(kind.runs_float_work(), kind != Npu, "{kind:?}");
            assert_eq!(kind.hosts_tensors_it_touches(), kind == Npu, "{kind:?}");
            assert_eq!(ProcessorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ProcessorKind::from_name("tpu"), None);
    }
}
