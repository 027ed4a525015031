//! The modelled cost of decoding after a prefill (`simulate --decode-tokens N`).
//!
//! A decode step feeds one token, so it is bound by memory bandwidth, not arithmetic:
//! every linear weight (and the LM head) is read once per step, and attention reads the
//! KV cache of the whole context. A step on processor `p` is modelled as
//!
//! ```text
//! t(step i) = launch_us + (weight_bytes + Σ_layers min(prompt_len + i + 1, window_l) · kv_bytes) / bandwidth
//! ```
//!
//! with `weight_bytes` from the model's shape at its weight precision (Q, K, V, O, gate,
//! up, down per layer, and the head), `kv_bytes = 2 · kv_heads · head_dim` at the float
//! precision per layer and cached token, `window_l` a local layer's sliding window (no
//! bound for a global layer: every layer of a llama model, where the sum is
//! `(prompt_len + i + 1) · kv_bytes_per_token`), and `bandwidth` the processor's
//! `decode_bandwidth_gbps` if the device profile gives one, else its roofline
//! `bandwidth_gbps`. Decode runs on the first CPU processor, as in seed 000 (which decodes
//! on the CPU backend), or the first processor of a device without a CPU.

use serde::Serialize;

use crate::cost::HomeWork;
use crate::device::{DeviceProfile, ProcessorSpec};
use crate::error::PlanError;
use crate::model::ModelConfig;

/// What a decode of `tokens` steps costs on one processor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecodeEstimate {
    /// Decode steps (tokens generated after the prefill's first one).
    pub tokens: u32,
    /// Processor the steps run on.
    pub processor: String,
    /// Bandwidth used, GB/s.
    pub bandwidth_gbps: f64,
    /// Whether the device profile gave `decode_bandwidth_gbps` (else the roofline's
    /// `bandwidth_gbps` was used).
    pub bandwidth_given: bool,
    /// Weight bytes read per step.
    pub weight_bytes_per_step: u64,
    /// KV-cache bytes per context token (every layer; a local layer reads at most its
    /// window of them per step).
    pub kv_bytes_per_token: u64,
    /// Time of the first step, ns.
    pub first_step_ns: u64,
    /// Time of every step together, ns.
    pub decode_ns: u64,
}

/// Models a decode of `tokens` steps after a prompt of `prompt_len` tokens.
///
/// # Errors
/// [`PlanError::NoProcessor`] for a device without processors or with a bandwidth that is
/// not positive; [`PlanError::InvalidWorkload`] when the prompt plus the steps exceed the
/// model's context.
pub fn estimate_decode(
    model: &ModelConfig,
    device: &DeviceProfile,
    prompt_len: u32,
    tokens: u32,
) -> Result<DecodeEstimate, PlanError> {
    let processor = decode_processor(device)?;
    let (bandwidth_gbps, given) = decode_bandwidth(processor)?;
    if u64::from(prompt_len) + u64::from(tokens) > u64::from(model.context) {
        return Err(PlanError::InvalidWorkload(format!(
            "a prompt of {prompt_len} tokens and {tokens} decode steps exceed the context of \
             {} tokens",
            model.context
        )));
    }
    let weight_bytes_per_step = weight_bytes(model);
    let kv_bytes_per_layer =
        2 * u64::from(model.kv_heads) * u64::from(model.head_dim()) * model.float_precision.bytes();
    let kv_bytes_per_token = u64::from(model.layers) * kv_bytes_per_layer;
    let bytes_per_ns = bandwidth_gbps; // 1 GB/s = 1 byte/ns
    let launch_ns = (processor.cost.launch_us * 1e3).max(0.0);
    let step_ns = |i: u32| {
        let context = u64::from(prompt_len) + u64::from(i) + 1;
        let bytes = weight_bytes_per_step + cached_keys_read(model, context) * kv_bytes_per_layer;
        (launch_ns + bytes as f64 / bytes_per_ns).round() as u64
    };
    Ok(DecodeEstimate {
        tokens,
        processor: processor.name.clone(),
        bandwidth_gbps,
        bandwidth_given: given,
        weight_bytes_per_step,
        kv_bytes_per_token,
        first_step_ns: if tokens > 0 { step_ns(0) } else { 0 },
        decode_ns: (0..tokens).map(step_ns).sum(),
    })
}

/// The lane decode steps run on: the first CPU, or the first processor of a device
/// without one (`None`: no processor).
pub fn decode_lane(device: &DeviceProfile) -> Option<usize> {
    device.preferred_lane(HomeWork::Decode)
}

fn decode_processor(device: &DeviceProfile) -> Result<&ProcessorSpec, PlanError> {
    decode_lane(device)
        .map(|lane| &device.processors[lane])
        .ok_or_else(|| PlanError::NoProcessor("the device has no processor to decode on".into()))
}

/// The bandwidth a decode step reads at on `processor`, GB/s, and whether the profile
/// gave it for decode (`decode_bandwidth_gbps`; else the roofline's).
fn decode_bandwidth(processor: &ProcessorSpec) -> Result<(f64, bool), PlanError> {
    let given = processor.decode_bandwidth_gbps;
    let bandwidth_gbps = given.unwrap_or(processor.cost.bandwidth_gbps);
    if !(bandwidth_gbps.is_finite() && bandwidth_gbps > 0.0) {
        return Err(PlanError::NoProcessor(format!(
            "processor {} has no positive bandwidth to decode with ({bandwidth_gbps} GB/s)",
            processor.name
        )));
    }
    Ok((bandwidth_gbps, given.is_some()))
}

/// Sequences one batched decode step holds at most (the samples of one request and the
/// other requests decoding beside it together).
pub const MAX_DECODE_BATCH: usize = 64;

/// The modelled time of one decode step of `contexts.len()` sequences run together on
/// the decode processor ([`decode_lane`]), sequence `s` at `contexts[s]` tokens (its
/// cache and the token fed). The GEMVs of single-sequence decode become one small GEMM:
/// every weight is read once for the batch, every sequence reads its own cache, and the
/// arithmetic grows with the batch:
///
/// ```text
/// t = launch_us + max((weight_bytes + Σ_s kv_read(contexts[s])) / bandwidth,
///                     Σ_s (2 · weights + 4 · Σ_layers kv_read_l · heads · head_dim) / rate)
/// ```
///
/// with the bandwidth of [`estimate_decode`] and `rate` the processor's peak at the
/// model's weight precision (no arithmetic bound where it gives none). One sequence that
/// is bound by its bytes costs exactly [`estimate_decode`]'s step at its context. The
/// batch runs as its processor's kind runs it ([`crate::ProcessorKind::decode_rows`]: on
/// an NPU padded up to the next of [`crate::NPU_DECODE_ROWS`]).
///
/// # Errors
/// [`PlanError::NoProcessor`] as [`estimate_decode`]; [`PlanError::InvalidWorkload`] for
/// no sequence, more than [`MAX_DECODE_BATCH`], or a context of 0 or beyond the model's.
pub fn batched_decode_step_ns(
    model: &ModelConfig,
    device: &DeviceProfile,
    contexts: &[u64],
) -> Result<u64, PlanError> {
    let processor = decode_processor(device)?;
    let (bandwidth_gbps, _) = decode_bandwidth(processor)?;
    if contexts.is_empty() || contexts.len() > MAX_DECODE_BATCH {
        return Err(PlanError::InvalidWorkload(format!(
            "a decode batch of {} sequences; give 1 to {MAX_DECODE_BATCH}",
            contexts.len()
        )));
    }
    if let Some(c) = contexts
        .iter()
        .find(|&&c| c == 0 || c > u64::from(model.context))
    {
        return Err(PlanError::InvalidWorkload(format!(
            "a decode step at {c} tokens: give 1 to the context of {} tokens",
            model.context
        )));
    }
    let kv_bytes_per_layer =
        2 * u64::from(model.kv_heads) * u64::from(model.head_dim()) * model.float_precision.bytes();
    let padded = processor
        .kind
        .decode_rows(contexts)
        .unwrap_or_else(|| contexts.to_vec());
    let keys: u64 = padded.iter().map(|&c| cached_keys_read(model, c)).sum();
    let bytes = weight_bytes(model) + keys * kv_bytes_per_layer;
    let memory_ns = bytes as f64 / bandwidth_gbps;
    let rate = processor.cost.peak_gops.ops_per_s(model.weight_precision);
    let weights = weight_bytes(model) / model.weight_precision.bytes().max(1);
    let attention_ops = 4 * keys * u64::from(model.heads) * u64::from(model.head_dim());
    let ops = 2 * weights * padded.len() as u64 + attention_ops;
    let compute_ns = if rate > 0.0 {
        ops as f64 / rate * 1e9
    } else {
        0.0
    };
    let launch_ns = (processor.cost.launch_us * 1e3).max(0.0);
    Ok((launch_ns + memory_ns.max(compute_ns)).round() as u64)
}

/// Bytes of one request's KV caches at the model's float precision: the prompt's cache,
/// shared by its `samples`, and each sample's own positions after it (every generated
/// token but the last is fed back; at least one).
pub fn kv_cache_bytes(model: &ModelConfig, prompt_len: u32, max_tokens: u32, samples: u32) -> u64 {
    let per_position = u64::from(model.layers)
        * 2
        * u64::from(model.kv_heads)
        * u64::from(model.head_dim())
        * model.float_precision.bytes();
    let own = u64::from(max_tokens.saturating_sub(1).max(1));
    per_position.saturating_mul(u64::from(prompt_len) + u64::from(samples) * own)
}

/// The cached tokens a step at `context` tokens reads, summed over the layers: each
/// local layer reads its window at most.
fn cached_keys_read(model: &ModelConfig, context: u64) -> u64 {
    (0..model.layers)
        .map(|l| {
            model
                .attention_window(l)
                .map_or(context, |w| context.min(w.into()))
        })
        .sum()
}

/// Bytes of every linear weight and the head at the model's weight precision.
fn weight_bytes(m: &ModelConfig) -> u64 {
    let (h, q) = (u64::from(m.hidden), u64::from(m.heads * m.head_dim()));
    let kv = u64::from(m.kv_heads * m.head_dim());
    let per_layer = h * q * 2 + h * kv * 2 + 3 * h * u64::from(m.ffn);
    let head = h * u64::from(m.vocab);
    (u64::from(m.layers) * per_layer + head) * m.weight_precision.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ProcessorKind;
    use crate::testing::{tiny_device, tiny_model};

    #[test]
    fn steps_cost_their_bytes_over_the_bandwidth() {
        let model = tiny_model(2);
        let mut device = tiny_device();
        let est = estimate_decode(&model, &device, 8, 4).unwrap();
        let cpu = device
            .processors
            .iter()
            .find(|p| p.kind == ProcessorKind::Cpu)
            .unwrap()
            .clone();
        assert_eq!(est.processor, cpu.name);
        assert!(!est.bandwidth_given);
        let launch = cpu.cost.launch_us * 1e3;
        let bytes = |ctx: u64| (est.weight_bytes_per_step + ctx * est.kv_bytes_per_token) as f64;
        let want: f64 = (9..13)
            .map(|c| launch + bytes(c) / cpu.cost.bandwidth_gbps)
            .sum();
        assert!(
            (est.decode_ns as f64 - want).abs() <= 4.0,
            "{} vs {want}",
            est.decode_ns
        );
        // Twice the bandwidth, given for decode: the bytes take half the time.
        let index = device
            .processors
            .iter()
            .position(|p| p.kind == ProcessorKind::Cpu);
        device.processors[index.unwrap()].decode_bandwidth_gbps =
            Some(2.0 * cpu.cost.bandwidth_gbps);
        let fast = estimate_decode(&model, &device, 8, 4).unwrap();
        assert!(fast.bandwidth_given);
        let want_fast: f64 = (9..13)
            .map(|c| launch + bytes(c) / 2.0 / cpu.cost.bandwidth_gbps)
            .sum();
        assert!((fast.decode_ns as f64 - want_fast).abs() <= 4.0);
        // A longer context costs more per step.
        let long = estimate_decode(&model, &device, 64, 1).unwrap();
        assert!(long.first_step_ns > fast.first_step_ns);
    }

    #[test]
    fn a_local_layer_reads_at_most_its_window_per_step() {
        use crate::block::{BlockVariant, SlidingWindow};
        let plain = tiny_model(6);
        let windowed = ModelConfig {
            block: Some(BlockVariant {
                sliding_window: Some(SlidingWindow {
                    keys: 16,
                    period: 3,
                }),
                ..BlockVariant::default()
            }),
            ..plain.clone()
        };
        let device = tiny_device();
        let step = |model: &ModelConfig, prompt| {
            estimate_decode(model, &device, prompt, 1)
                .unwrap()
                .first_step_ns
        };
        // Inside the window (15 cached tokens and the new one): the same bytes.
        assert_eq!(step(&windowed, 15), step(&plain, 15));
        // Past it, 4 of 6 layers read 16 tokens: the step grows by 2 layers' KV only.
        let per_layer = windowed_kv_bytes_per_layer(&windowed);
        let grown = step(&windowed, 1000) - step(&windowed, 100);
        // 10 GB/s: 10 bytes a ns; each step is rounded to the ns.
        assert!(
            (grown as f64 - 2.0 * 900.0 * per_layer / 10.0).abs() <= 1.0,
            "{grown}"
        );
        assert!(step(&windowed, 1000) < step(&plain, 1000));
        assert_eq!(
            cached_keys_read(&windowed, 1001),
            4 * 16 + 2 * 1001,
            "layers 2 and 5 are global"
        );
    }

    fn windowed_kv_bytes_per_layer(model: &ModelConfig) -> f64 {
        (2 * model.kv_heads * model.head_dim()) as f64 * model.float_precision.bytes() as f64
    }

    #[test]
    fn a_batch_reads_the_weights_once_and_one_sequence_costs_a_step() {
        let model = tiny_model(2);
        let mut device = tiny_device();
        // Bound by bytes: a lone sequence costs estimate_decode's step at its context.
        let lane = decode_lane(&device).unwrap();
        device.processors[lane].cost.peak_gops.int8 = 1e6;
        device.processors[lane].cost.peak_gops.fp16 = 1e6;
        device.processors[lane].cost.peak_gops.fp32 = 1e6;
        let one = batched_decode_step_ns(&model, &device, &[9]).unwrap();
        assert_eq!(
            one,
            estimate_decode(&model, &device, 8, 1)
                .unwrap()
                .first_step_ns
        );
        // Eight sequences read the weights once: far less than eight steps, more than one.
        let eight = batched_decode_step_ns(&model, &device, &[9; 8]).unwrap();
        assert!(eight > one && eight < 2 * one, "{eight} vs {one}");
        // Arithmetic-bound: the batch costs its GEMM.
        device.processors[lane].cost.peak_gops.int8 = 1e-3;
        device.processors[lane].cost.peak_gops.fp16 = 1e-3;
        device.processors[lane].cost.peak_gops.fp32 = 1e-3;
        let launch = (device.processors[lane].cost.launch_us * 1e3).round();
        let slow_one = batched_decode_step_ns(&model, &device, &[9]).unwrap() as f64 - launch;
        let slow_eight = batched_decode_step_ns(&model, &device, &[9; 8]).unwrap() as f64 - launch;
        assert!(
            (slow_eight / slow_one - 8.0).abs() < 0.01,
            "{slow_eight} vs {slow_one}"
        );
        for bad in [&[][..], &[0][..], &[u64::from(model.context) + 1][..]] {
            assert!(matches!(
                batched_decode_step_ns(&model, &device, bad),
                Err(PlanError::InvalidWorkload(_))
            ));
        }
        let too_many = vec![9; MAX_DECODE_BATCH + 1];
        assert!(batched_decode_step_ns(&model, &device, &too_many).is_err());
    }

    #[test]
    fn samples_share_the_prompts_cache() {
        let model = tiny_model(2);
        let per =
            2 * 2 * u64::from(model.kv_heads * model.head_dim()) * model.float_precision.bytes();
        assert_eq!(kv_cache_bytes(&model, 100, 11, 1), per * 110);
        assert_eq!(kv_cache_bytes(&model, 100, 11, 8), per * 180);
        assert_eq!(kv_cache_bytes(&model, 100, 1, 1), per * 101);
    }

    #[test]
    fn refuses_beyond_the_context_and_a_bandwidth_of_zero() {
        let model = tiny_model(2);
        let mut device = tiny_device();
        let context = model.context;
        assert!(matches!(
            estimate_decode(&model, &device, context, 1),
            Err(PlanError::InvalidWorkload(_))
        ));
        for p in &mut device.processors {
            p.decode_bandwidth_gbps = Some(0.0);
        }
        assert!(matches!(
            estimate_decode(&model, &device, 8, 1),
            Err(PlanError::NoProcessor(_))
        ));
    }
}
