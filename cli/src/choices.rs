//! The command line's names for the library's choices. The library's enums carry no clap
//! derive (it depends on no CLI crate); these twins do, with help text written for the
//! terminal rather than for rustdoc.

use clap::ValueEnum;
use hetsched::exec::{Importance, LinearPrecision, PrunedScale};
use hetsched::systems::PolicyRegistry;
use hetsched::systems::memory::PlanEffort;

/// Arithmetic of the linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    /// f32 weights and activations: the accuracy reference.
    F32,
    /// INT8 weights (a scale per output row) and INT8 activations (a scale per tensor),
    /// INT32 accumulation: what the Hexagon NPU runs.
    W8a8,
    /// W8A8 with outlier shadowing: the activation scale is clipped below the few
    /// outliers, which are multiplied in float and added to the INT8 result.
    #[value(name = "w8a8-shadow")]
    W8a8Shadow,
    /// 4-bit weights (a sub-scale per group of 32 inputs, a scale per output row) and
    /// INT8 activations (a scale per tensor): half the weight memory of w8a8.
    W4a8,
    /// W4A8 with the outlier shadow of w8a8-shadow (every site, no calibration).
    #[value(name = "w4a8-shadow")]
    W4a8Shadow,
    /// W4A8 with INT8 activations scaled per row and group of 32 inputs (as llama.cpp's
    /// Q8_0 blocks): the CPU lane's W4A8 (the NPU needs one scale per tensor).
    #[value(name = "w4a8-g32")]
    W4a8G32,
    /// W4A8 with INT8 activations scaled per row and group of 128 inputs: a faster
    /// kernel than w4a8-g32's (sub-scaled products add in i32 across four weight groups)
    /// at a coarser activation resolution.
    #[value(name = "w4a8-g128")]
    W4a8G128,
}

impl From<Precision> for LinearPrecision {
    fn from(p: Precision) -> Self {
        match p {
            Precision::F32 => LinearPrecision::F32,
            Precision::W8a8 => LinearPrecision::W8a8,
            Precision::W8a8Shadow => LinearPrecision::W8a8Shadow,
            Precision::W4a8 => LinearPrecision::W4a8,
            Precision::W4a8Shadow => LinearPrecision::W4a8Shadow,
            Precision::W4a8G32 => LinearPrecision::W4a8G32,
            Precision::W4a8G128 => LinearPrecision::W4a8G128,
        }
    }
}

/// The per-tensor scale a pruned site (one without the full shadow) quantizes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scale {
    /// Each tensor's own max |x| / 127: nothing saturates, the bulk loses resolution.
    Max,
    /// The calibration's percentile scale: the few values beyond saturate.
    Percentile,
    /// The max |x| outside the site's top channels, whose float rows stay resident and
    /// take the values beyond; capped at --pruned-clip-rms bulk RMS, the rare values
    /// beyond the cap reading their rows from the model file.
    #[value(name = "hot-max")]
    HotMax,
}

impl From<Scale> for PrunedScale {
    fn from(s: Scale) -> Self {
        match s {
            Scale::Max => PrunedScale::Max,
            Scale::Percentile => PrunedScale::Percentile,
            Scale::HotMax => PrunedScale::HotMax,
        }
    }
}

/// How calibration ranks the sites whose shadow is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Rank {
    /// Largest outlier / clipped scale: how much resolution the plain max scale loses.
    Ratio,
    /// The same ratio for the range a pruned site actually quantizes with (under
    /// hot-max, the max |x| outside the top channels it keeps).
    Residual,
    /// The KL divergence from f32 that pruning this one site adds to the logits,
    /// measured on calibration windows.
    Kl,
}

impl From<Rank> for Importance {
    fn from(r: Rank) -> Self {
        match r {
            Rank::Ratio => Importance::Ratio,
            Rank::Residual => Importance::Residual,
            Rank::Kl => Importance::Kl,
        }
    }
}

/// The policies a `--policies` list names, every built-in policy when it names none. The
/// one place the command line turns policy arguments into the list it runs.
pub fn policies_or_all(policies: Vec<String>) -> Vec<String> {
    if policies.is_empty() {
        PolicyRegistry::builtin()
            .names()
            .map(String::from)
            .collect()
    } else {
        policies
    }
}

/// A built-in policy's name (clap's value parser for `--policy` and `--policies`), or a
/// usage error listing the names.
pub fn policy_name(name: &str) -> Result<String, String> {
    PolicyRegistry::builtin()
        .check(name)
        .map(|()| name.to_string())
        .map_err(|e| e.to_string())
}

/// A positive byte count (`--kv-budget`): BYTES, or with a KiB, MiB or GiB suffix.
pub fn byte_count(text: &str) -> Result<u64, String> {
    match hetsched::budget::parse_bytes(text) {
        Some(0) => Err("0 bytes: give a budget above 0".into()),
        Some(bytes) => Ok(bytes),
        None => Err(format!(
            "`{text}` is not a byte count: write BYTES, e.g. 3000000000 or 512MiB"
        )),
    }
}

/// Which positions `eval` scores (`--scoring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScoringChoice {
    /// Every position of every window.
    All,
    /// As llama.cpp's llama-perplexity: the second half of each window, the window's
    /// first token replaced by BOS when the tokenizer adds one.
    #[value(name = "llama-cpp")]
    LlamaCpp,
}

/// How many offset strategies each region's memory plan tries (`simulate --memory-plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MemoryPlan {
    /// Every strategy up to 131072 buffers a region, the two sweeps (greedy by start and
    /// by end) above: near-linear in the buffers; another strategy's plan kept only where
    /// it beats the sweeps' by 0.5% of the region's lower bound.
    Scaled,
    /// Every strategy at any size (prompt 1024, chunk 1: about 3x the time).
    Exhaustive,
}

impl From<MemoryPlan> for PlanEffort {
    fn from(m: MemoryPlan) -> Self {
        match m {
            MemoryPlan::Scaled => PlanEffort::Scaled,
            MemoryPlan::Exhaustive => PlanEffort::Exhaustive,
        }
    }
}
