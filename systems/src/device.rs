//! Device profiles: the processors of a phone or desktop and their cost models.

use serde::{Deserialize, Serialize};

pub use crate::cost::ProcessorKind;
use crate::cost::{CostModel, HomeWork, StageCost, preferred_lane};
use crate::error::PlanError;

/// Smallest non-zero peak rate (GOPS) or bandwidth (GB/s) a profile may give: below it
/// modeled times leave the range of u64 nanoseconds.
pub const MIN_RATE: f64 = 1e-6;
/// Largest peak rate or bandwidth a profile may give.
pub const MAX_RATE: f64 = 1e12;
/// Largest latency (launch, per-operator overhead, measured), in microseconds: 1000 s.
pub const MAX_LATENCY_US: f64 = 1e9;
/// Largest saving per cached weight byte a profile may give, ns (a byte read from memory
/// at 1 MB/s).
pub const MAX_NS_PER_WARM_BYTE: f64 = 1e3;

/// The first cost field of `c` outside its range (non-finite, negative, or past the
/// limits above), by its name in the device file.
fn out_of_range_cost_field(c: &CostModel) -> Option<&'static str> {
    let rate_ok = |r: f64| r == 0.0 || (MIN_RATE..=MAX_RATE).contains(&r);
    let latency_ok = |us: f64| (0.0..=MAX_LATENCY_US).contains(&us);
    let rates = [
        ("peak_gops.int8", c.peak_gops.int8),
        ("peak_gops.fp16", c.peak_gops.fp16),
        ("peak_gops.fp32", c.peak_gops.fp32),
    ];
    if let Some((field, _)) = rates.iter().find(|(_, r)| !rate_ok(*r)) {
        return Some(field);
    }
    if rates.iter().all(|(_, r)| *r == 0.0) {
        return Some("peak_gops (all zero)");
    }
    if !(MIN_RATE..=MAX_RATE).contains(&c.bandwidth_gbps) {
        return Some("bandwidth_gbps");
    }
    if !latency_ok(c.launch_us) {
        return Some("launch_us");
    }
    if !latency_ok(c.op_overhead_us) {
        return Some("op_overhead_us");
    }
    if c.measured.iter().any(|m| !latency_ok(m.us)) {
        return Some("measured.us");
    }
    if c.stages
        .iter()
        .any(|s| !stage_coefficients_ok(s) || !(0.0..=1e3).contains(&s.noise))
    {
        return Some("stages (launch_us, per_token_us, per_pair_us)");
    }
    None
}

/// Whether a fitted stage cost's coefficients are finite, non-negative and within
/// [`MAX_LATENCY_US`] (a profile's stages and its one-thread pass alike).
/// `x` for a message: as written when it is short, else in scientific notation with four
/// significant digits (`-1e300` rather than 301 digits).
fn rounded(x: f64) -> String {
    if x == 0.0 || (1e-3..1e6).contains(&x.abs()) {
        format!("{}", (x * 1e4).round() / 1e4)
    } else {
        format!("{x:.3e}")
    }
}

fn stage_coefficients_ok(s: &StageCost) -> bool {
    [
        s.launch_us,
        s.per_token_us,
        s.per_pair_us,
        s.per_window_pair_us,
    ]
    .iter()
    .all(|us| (0.0..=MAX_LATENCY_US).contains(us))
}

/// One processor of a device profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSpec {
    /// Unique name, e.g. `hexagon`.
    pub name: String,
    /// Processor kind.
    pub kind: ProcessorKind,
    /// Memory this processor can address, in GiB.
    pub memory_gib: f64,
    /// Cost model.
    pub cost: CostModel,
    /// Memory bandwidth a decode step streams its weights and KV cache at, GB/s
    /// (`simulate --decode-tokens`, [`crate::estimate_decode`]); the cost model's
    /// `bandwidth_gbps` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_bandwidth_gbps: Option<f64>,
}

/// A device profile: a named set of processors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Device name, e.g. `Xiaomi 14 (Snapdragon 8 Gen 3)`.
    pub name: String,
    /// Where a measured profile's stage costs come from (`hetsched profile`); none for
    /// estimated profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<ProfileOrigin>,
    /// Processors, in lane order.
    pub processors: Vec<ProcessorSpec>,
}

/// What a measured profile was measured on: the model and the host, so that a profile
/// carried to another model or machine is refused or warned about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileOrigin {
    /// The model's name.
    pub model: String,
    /// The model's shape (`layers 30, hidden 576, ...`): stage costs hold for it only.
    pub model_shape: String,
    /// Precisions profiled (`w8a8`, `f32`, `w8a8-shadow`).
    pub precisions: Vec<String>,
    /// The host CPU's model name.
    pub cpu: String,
    /// The host CPU's SIMD features the kernels choose from at run time.
    pub cpu_features: Vec<String>,
    /// Compute threads the samples ran with.
    pub threads: usize,
    /// Processor queues the samples ran on (`cpu,npu`).
    pub backends: String,
    /// The raw samples, a CSV file beside the profile.
    pub samples: String,
    /// Median time between one job's end and the next one's start on the real queues
    /// (thread hand-offs, the scheduler's tick), per job, in microseconds; `run
    /// --predict` adds it before each simulated job.
    #[serde(default)]
    pub job_gap_us: f64,
    /// The same gap measured per precision (the f32 path's hand-offs are longer than the
    /// INT8 path's: 1.25-1.6x in a quiet grid, docs/calibration.md); a precision without an entry takes
    /// `job_gap_us`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub job_gaps: Vec<PrecisionGap>,
    /// Rate of each of two jobs sharing the worker pool at once, relative to one job
    /// alone (1/2: no gain, as one after the other; measured by `hetsched profile` from
    /// an `inorder` and a `balance` run of one plan; 0: not measured).
    #[serde(default)]
    pub two_job_rate: f64,
    /// Stage costs measured on one compute thread (`hetsched profile`'s one-thread
    /// pass): beside the costs on `threads`, each stage's speed-up, which says how jobs
    /// share the worker pool (`run --predict`; empty in older profiles, which predict
    /// with `two_job_rate` alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub one_thread: Vec<OneThreadCost>,
    /// Stage costs scaled to the machine's recent runs (`run --adapt`: the median ratio
    /// of a run history's recent measured durations to the profile's costs); empty when
    /// the costs are the profile's as fitted. Not written by `profile`: a run fills it in
    /// for its own plan, and its report lists it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapted: Vec<CostAdaptation>,
    /// The host's last-level cache, bytes (0: not known): a job whose weights other jobs
    /// have not pushed out of it since its stage last ran reads them from the cache.
    #[serde(default)]
    pub cache_bytes: u64,
    /// What a job saves per weight byte when its weights are still cached, per precision
    /// (measured by `hetsched profile` from `layerwise` runs: each stage's first chunk
    /// reads its weights from memory, the later ones from the cache; the profile's
    /// `inorder` samples are all cold). Empty: every job priced as measured (older
    /// profiles).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_weights: Vec<PrecisionWarm>,
}

/// What one precision's jobs save per weight byte when the weights are still cached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrecisionWarm {
    /// The precision (`w8a8`, `f32`, `w8a8-shadow`).
    pub precision: String,
    /// Nanoseconds saved per weight byte (the median over the profile's stage kinds,
    /// chunk sizes and lanes).
    pub ns_per_byte: f64,
}

/// The hand-off gap between jobs of one precision's prefills.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrecisionGap {
    /// The precision (`w8a8`, `f32`, `w8a8-shadow`).
    pub precision: String,
    /// Median gap per hand-off, in microseconds.
    pub us: f64,
}

/// One stage kind's cost scaled to recent measurements (`run --adapt`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostAdaptation {
    /// The stage kind.
    pub stage: String,
    /// The processor whose cost was scaled.
    pub processor: String,
    /// The precision of the cost.
    pub precision: String,
    /// The factor every coefficient was multiplied by (measured / profile, median).
    pub factor: f64,
    /// Recent records the factor is the median over.
    pub records: usize,
}

/// A stage's cost on one compute thread, on one processor's queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OneThreadCost {
    /// The processor whose queue ran it.
    pub processor: String,
    /// The fitted cost.
    pub cost: StageCost,
}

impl ProfileOrigin {
    /// The hand-off gap per job of `precision`'s prefills, in microseconds: its own when
    /// measured, else the profile's.
    pub fn job_gap_us_of(&self, precision: &str) -> f64 {
        self.job_gaps
            .iter()
            .find(|g| g.precision == precision)
            .map_or(self.job_gap_us, |g| g.us)
    }

    /// Nanoseconds a job of `precision` saves per weight byte still cached, if measured:
    /// its own, else for w8a8-shadow (a profile that measured none of its own) that of
    /// the precision its linears run in, w8a8.
    pub fn warm_ns_per_byte_of(&self, precision: &str) -> Option<f64> {
        let of = |p: &str| self.warm_weights.iter().find(|w| w.precision == p);
        of(precision)
            .or_else(|| (precision == "w8a8-shadow").then(|| of("w8a8")).flatten())
            .map(|w| w.ns_per_byte)
    }

    /// The one-thread cost of `stage` at `precision` on `processor`, if measured.
    pub fn one_thread_cost(
        &self,
        processor: &str,
        precision: &str,
        stage: &str,
    ) -> Option<&StageCost> {
        self.one_thread
            .iter()
            .find(|c| {
                c.processor == processor && c.cost.precision == precision && c.cost.stage == stage
            })
            .map(|c| &c.cost)
    }
}

impl ProfileOrigin {
    /// The shape line of `model` that a profile records and a run compares.
    pub fn shape_of(model: &crate::model::ModelConfig) -> String {
        let shape = format!(
            "layers {}, hidden {}, heads {}, kv_heads {}, head_dim {}, ffn {}, vocab {}",
            model.layers,
            model.hidden,
            model.heads,
            model.kv_heads,
            model.head_dim(),
            model.ffn,
            model.vocab
        );
        // A family other than llama is part of the shape (its layer has other operators).
        match &model.block {
            Some(block) => format!("{shape}, family {}", block.family),
            None => shape,
        }
    }
}

impl DeviceProfile {
    /// Checks names are unique and rates are usable.
    pub fn validate(&self) -> Result<(), PlanError> {
        let bad = |what: String| Err(PlanError::InvalidDevice(format!("{}: {what}", self.name)));
        if self.processors.is_empty() {
            return bad("no processors; add at least one [[processors]] entry".into());
        }
        for (i, p) in self.processors.iter().enumerate() {
            if self.processors[..i].iter().any(|q| q.name == p.name) {
                return bad(format!("processor name `{}` is used twice", p.name));
            }
            let c = &p.cost;
            if let Some(field) = out_of_range_cost_field(c) {
                return bad(format!(
                    "processor `{}`: `{field}` is out of range (rates 0 or {MIN_RATE}..={MAX_RATE}, not all zero; bandwidth_gbps {MIN_RATE}..={MAX_RATE}; latencies 0..={MAX_LATENCY_US} us); fix the device file",
                    p.name
                ));
            }
            if p.decode_bandwidth_gbps
                .is_some_and(|b| !(MIN_RATE..=MAX_RATE).contains(&b))
            {
                return bad(format!(
                    "processor `{}`: `decode_bandwidth_gbps` is out of range ({MIN_RATE}..={MAX_RATE})",
                    p.name
                ));
            }
            if !(p.memory_gib.is_finite() && p.memory_gib > 0.0) {
                return bad(format!(
                    "processor `{}` needs a positive memory_gib",
                    p.name
                ));
            }
        }
        if let Some(m) = &self.measured {
            let rate_ok = m.two_job_rate == 0.0 || (0.5..=1.0).contains(&m.two_job_rate);
            let gap_ok = std::iter::once(m.job_gap_us)
                .chain(m.job_gaps.iter().map(|g| g.us))
                .all(|us| (0.0..=MAX_LATENCY_US).contains(&us));
            if !m.one_thread.iter().all(|o| stage_coefficients_ok(&o.cost)) {
                return bad(
                    "[[measured.one_thread]]: a cost is negative, not finite or out of range; fix the device file or profile again".into(),
                );
            }
            if !m.warm_weights.iter().all(|w| {
                w.ns_per_byte.is_finite() && (0.0..=MAX_NS_PER_WARM_BYTE).contains(&w.ns_per_byte)
            }) {
                return bad(format!(
                    "[[measured.warm_weights]]: ns_per_byte must be within 0..={MAX_NS_PER_WARM_BYTE}; fix the device file or profile again"
                ));
            }
            if !(rate_ok && gap_ok) {
                return bad(format!(
                    "[measured] two_job_rate {} must be 0 (not measured) or within 0.5..=1, and job_gap_us {} (and every job_gaps entry) within 0..={MAX_LATENCY_US}; fix the device file",
                    rounded(m.two_job_rate),
                    rounded(m.job_gap_us)
                ));
            }
        }
        Ok(())
    }

    /// The processors' names, comma-separated (for error messages).
    pub fn processor_names(&self) -> String {
        self.processors
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Index of the first processor of `kind`.
    pub fn first_of(&self, kind: ProcessorKind) -> Option<usize> {
        self.processors.iter().position(|p| p.kind == kind)
    }

    /// The default home lane of `work`: the first processor of the kind ranked first for
    /// it ([`crate::cost`]'s kind rules; `None`: no processor takes it).
    pub(crate) fn preferred_lane(&self, work: HomeWork) -> Option<usize> {
        preferred_lane(self.processors.iter().map(|p| p.kind), work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bare_profile_origin, tiny_device};

    /// `tiny_device` with `origin` as its measured origin, validated.
    fn validated(origin: ProfileOrigin) -> Result<(), String> {
        let mut device = tiny_device();
        device.measured = Some(origin);
        device.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn absurd_figures_print_rounded() {
        assert_eq!(rounded(-1e300), "-1.000e300");
        assert_eq!(rounded(50.0), "50");
        assert_eq!(rounded(0.123456), "0.1235");
        let mut origin = bare_profile_origin("tiny", 2);
        origin.job_gap_us = -1e300;
        let err = validated(origin).unwrap_err();
        assert!(
            err.contains("job_gap_us -1.000e300") && err.len() < 400,
            "{err}"
        );
    }

    #[test]
    fn a_precision_takes_its_own_gap_else_the_profiles() {
        let mut origin = bare_profile_origin("tiny", 2);
        origin.job_gap_us = 50.0;
        origin.job_gaps = vec![PrecisionGap {
            precision: "f32".into(),
            us: 80.0,
        }];
        assert_eq!(origin.job_gap_us_of("f32"), 80.0);
        assert_eq!(origin.job_gap_us_of("w8a8"), 50.0);
        assert!(validated(origin.clone()).is_ok());
        origin.job_gaps[0].us = -1.0;
        let err = validated(origin).unwrap_err();
        assert!(err.contains("job_gaps"), "{err}");
    }

    #[test]
    fn w8a8_shadow_takes_w8a8s_warm_saving_and_a_negative_one_is_refused() {
        let mut origin = bare_profile_origin("tiny", 2);
        assert_eq!(origin.warm_ns_per_byte_of("w8a8"), None);
        let warm = |precision: &str, ns_per_byte| PrecisionWarm {
            precision: precision.into(),
            ns_per_byte,
        };
        origin.warm_weights = vec![warm("w8a8", 0.04), warm("f32", 0.05)];
        assert_eq!(origin.warm_ns_per_byte_of("w8a8-shadow"), Some(0.04));
        assert_eq!(origin.warm_ns_per_byte_of("f32"), Some(0.05));
        origin.warm_weights.push(warm("w8a8-shadow", 0.08));
        assert_eq!(origin.warm_ns_per_byte_of("w8a8-shadow"), Some(0.08));
        assert!(validated(origin.clone()).is_ok());
        origin.warm_weights[0].ns_per_byte = -0.1;
        let err = validated(origin).unwrap_err();
        assert!(err.contains("warm_weights"), "{err}");
    }
}
