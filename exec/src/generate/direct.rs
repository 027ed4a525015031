//! One decode step as a single chain of the prefill's kernels, without the scheduler:
//! the token's embedding through every layer (norm, quantize, the linears as
//! matrix-vector products split over the pool's threads, RoPE, attention of one query
//! over the KV cache, FFN), then the head. The arithmetic is the prefill's, operator for
//! operator (the same quantize rules, INT8 products, outlier shadow and dequantize), so
//! the step continues a scheduled prefill's cache exactly as a scheduled step would.
//! One choice differs where the session asks for it: a quantized head ([`QuantizedHead`]:
//! INT8, or 4-bit for W4A8 models on request), since a token's step otherwise streams
//! the f32 head (as many bytes as every INT8 layer together). The
//! kernels' time of each step (the linears' and attention's parallel regions) is kept
//! in [`DecodeBuffers`], so that what a step spends outside them is known.

use std::time::Instant;

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedI8Weights, PackedW4Weights, rms_norm};
use hetsched_systems::op::{Block, Projection};
use hetsched_systems::shadow::ShadowSite;
use rayon::prelude::*;

use super::linears::{self, Input, Matrix};
use crate::family::{self, gated, norm_rows};
use crate::state::KvCache;
use crate::values::quantize;
use crate::{ExecError, ExecModel, LayerWeights, LinearPrecision, LinearWeights, QuantRule};

/// The LM head quantized for direct decode steps, and how its input is quantized.
#[derive(Debug)]
pub struct QuantizedHead {
    /// The head's weights.
    pub weights: LinearWeights,
    /// The quantization of the final-normed hidden state it multiplies.
    pub rule: QuantRule,
}

impl QuantizedHead {
    /// The head as a W8A8 linear (INT8 weights with a scale per vocabulary row, the
    /// activation quantized per tensor), the arithmetic the model's other linears use.
    pub fn int8(model: &ExecModel) -> Self {
        let (n, k) = (model.output.n(), model.output.k());
        let (q, scales) = quantize_weights_per_row(&model.output.to_rows(), n, k);
        Self {
            weights: LinearWeights::Int8 {
                packed: PackedI8Weights::pack(&q, n, k),
                scales,
                shadow: None,
            },
            rule: QuantRule::MaxAbs,
        }
    }

    /// The head at the model's own width: 4-bit for the W4A8 precisions (the weights
    /// quantized as every other W4 linear, the activation as the precision quantizes its
    /// linears' inputs: per group of 32, of 128, or per tensor), INT8 for W8A8 ones,
    /// `None` for f32 (whose head stays f32).
    pub fn own_width(model: &ExecModel) -> Option<Self> {
        let (n, k) = (model.output.n(), model.output.k());
        let rule = match model.precision {
            LinearPrecision::F32 => return None,
            LinearPrecision::W8a8 | LinearPrecision::W8a8Shadow => return Some(Self::int8(model)),
            LinearPrecision::W4a8G32 => QuantRule::Groups,
            LinearPrecision::W4a8G128 => QuantRule::Groups128 { width: k },
            LinearPrecision::W4a8 | LinearPrecision::W4a8Shadow => QuantRule::MaxAbs,
        };
        let weights = LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&model.output.to_rows(), n, k),
            shadow: None,
        };
        Some(Self { weights, rule })
    }

    /// Bytes of the weights a step reads.
    pub fn bytes(&self) -> u64 {
        self.weights.bytes()
    }
}

/// The buffers of decode steps, kept across steps so that a step allocates little: the
/// prepared activations and the projections' outputs.
#[derive(Debug, Default)]
pub struct DecodeBuffers {
    input: Input,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    out: Vec<f32>,
    /// Wall time inside the kernels' parallel regions (the linears' products and
    /// attention), summed over steps, ns.
    kernel_ns: u64,
}

impl DecodeBuffers {
    /// Wall time the steps run with these buffers spent inside the kernels' parallel
    /// regions (the linears and attention, fork and join included), ns.
    pub fn kernel_ns(&self) -> u64 {
        self.kernel_ns
    }
}

/// `f()`, its wall time added to `kernel_ns`.
fn timed<T>(kernel_ns: &mut u64, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    *kernel_ns += started.elapsed().as_nanos() as u64;
    out
}

/// Feeds `token` at `position` (the caches hold positions `0..position` and have room
/// for one more) and returns the logits of the next token, from `head` if given or the
/// model's f32 head. Runs on the current pool; `buffers` are reused across steps.
pub fn decode_step(
    model: &ExecModel,
    head: Option<&QuantizedHead>,
    caches: &mut [KvCache],
    token: u32,
    position: usize,
    buffers: &mut DecodeBuffers,
) -> Result<Vec<f32>, ExecError> {
    let c = &model.config;
    let h = c.hidden;
    let row = token as usize;
    let mut x = model
        .token_embd
        .get(row * h..(row + 1) * h)
        .ok_or(ExecError::TokenOutOfRange {
            id: token,
            vocab: c.vocab_size,
        })?
        .to_vec();
    family::scale_embeddings(c, &mut x);
    for (layer, (w, cache)) in model.layers.iter().zip(caches.iter_mut()).enumerate() {
        attention_block(model, layer, w, cache, &mut x, position, buffers)?;
        ffn_block(model, layer, w, &mut x, position, buffers)?;
    }
    let normed = norm(model, &x, &model.output_norm);
    let (head, rule) = match head {
        Some(head) => (Matrix::Linear(&head.weights), head.rule.clone()),
        None => (Matrix::F32(&model.output), QuantRule::PassThrough),
    };
    buffers.input.set(quantize(normed, rule));
    let mut logits = vec![0f32; head.n()];
    let (input, counters) = (&buffers.input, &model.shadow_counters);
    timed(&mut buffers.kernel_ns, || {
        linears::project(input, &[head], &mut [&mut logits], counters)
    })?;
    crate::take_logits(&parking_lot::Mutex::new(Some(logits)))
}

/// RMSNorm of one row.
fn norm(model: &ExecModel, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rms_norm(x, weight, model.config.norm_eps, &mut out, 1, x.len());
    out
}

/// Quantizes `x` under `layer`'s rule for `site` into `buffers.input`.
fn prepare(model: &ExecModel, layer: usize, site: ShadowSite, x: Vec<f32>, b: &mut DecodeBuffers) {
    b.input.set(quantize(x, model.quant_rule(layer, site)));
}

/// Sizes `v` to `n` values (its capacity is kept across steps).
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    v
}

/// `x += Wo · attention(q, cache)` for layer `layer`, after writing the token's key and
/// value at `position`.
fn attention_block(
    model: &ExecModel,
    layer: usize,
    w: &LayerWeights,
    cache: &mut KvCache,
    x: &mut [f32],
    position: usize,
    b: &mut DecodeBuffers,
) -> Result<(), ExecError> {
    let c = &model.config;
    let kv_dim = c.kv_dim();
    prepare(
        model,
        layer,
        ShadowSite::Qkv,
        norm(model, x, &w.attn_norm),
        b,
    );
    let counters = &model.shadow_counters;
    let [q, k, v, o] = [Projection::Q, Projection::K, Projection::V, Projection::O]
        .map(|p| Matrix::Linear(w.projection(p)));
    let mut outs = [
        sized(&mut b.q, q.n()),
        sized(&mut b.k, k.n()),
        sized(&mut b.v, v.n()),
    ];
    timed(&mut b.kernel_ns, || {
        linears::project(&b.input, &[q, k, v], &mut outs, counters)
    })?;
    let here = position..position + 1;
    family::finish_queries(model, layer, &mut b.q);
    model
        .rope_of(layer)
        .apply(&mut b.q, here.clone(), c.n_heads);
    family::finish_keys(model, layer, &mut b.k, &mut b.v, here);
    let span = position * kv_dim..(position + 1) * kv_dim;
    let room = cache.k.len().min(cache.v.len());
    if span.end > room || b.k.len() != kv_dim || b.v.len() != kv_dim {
        return Err(ExecError::Kernel(format!(
            "the KV cache of layer {layer} holds {} positions; position {position} needs more",
            room / kv_dim.max(1)
        )));
    }
    cache.k[span.clone()].copy_from_slice(&b.k);
    cache.v[span].copy_from_slice(&b.v);
    let window = c.window_of(layer);
    let attn = timed(&mut b.kernel_ns, || {
        attend(model, &b.q, cache, position + 1, window)
    });
    prepare(model, layer, ShadowSite::O, attn, b);
    let out = sized(&mut b.out, o.n());
    timed(&mut b.kernel_ns, || {
        linears::project(&b.input, &[o], &mut [out], counters)
    })?;
    let delta = post_normed(model, w, Block::Attention, std::mem::take(&mut b.out));
    let added = add_finite(x, &delta, layer, "attention", position);
    b.out = delta;
    added
}

/// `x += Wdown · (SiLU(Wgate · h) ⊙ Wup · h)` with `h` the FFN-normed `x`.
fn ffn_block(
    model: &ExecModel,
    layer: usize,
    w: &LayerWeights,
    x: &mut [f32],
    position: usize,
    b: &mut DecodeBuffers,
) -> Result<(), ExecError> {
    prepare(
        model,
        layer,
        ShadowSite::GateUp,
        norm(model, x, &w.ffn_norm),
        b,
    );
    let counters = &model.shadow_counters;
    let [gate, up, down] = [Projection::Gate, Projection::Up, Projection::Down]
        .map(|p| Matrix::Linear(w.projection(p)));
    let mut outs = [sized(&mut b.gate, gate.n()), sized(&mut b.up, up.n())];
    timed(&mut b.kernel_ns, || {
        linears::project(&b.input, &[gate, up], &mut outs, counters)
    })?;
    let hidden = gated(model.config.family.activation, &b.gate, &b.up);
    prepare(model, layer, ShadowSite::Down, hidden, b);
    let out = sized(&mut b.out, down.n());
    timed(&mut b.kernel_ns, || {
        linears::project(&b.input, &[down], &mut [out], counters)
    })?;
    let delta = post_normed(model, w, Block::FeedForward, std::mem::take(&mut b.out));
    let added = add_finite(x, &delta, layer, "feed-forward", position);
    b.out = delta;
    added
}

/// A block's output RMS-normalized with its post-norm weight, for a family that has
/// post-norms (Gemma); as it is otherwise.
fn post_normed(model: &ExecModel, w: &LayerWeights, block: Block, delta: Vec<f32>) -> Vec<f32> {
    match w.family.post_norm(block) {
        Some(weight) => norm_rows(&delta, weight, model.config.norm_eps),
        None => delta,
    }
}

/// The residual add, refusing a non-finite block output as the prefill does.
fn add_finite(
    x: &mut [f32],
    delta: &[f32],
    layer: usize,
    block: &'static str,
    position: usize,
) -> Result<(), ExecError> {
    if let Some(index) = delta.iter().position(|v| !v.is_finite()) {
        return Err(ExecError::NonFiniteActivation {
            layer,
            block,
            chunk: position,
            index,
            value: delta[index],
        });
    }
    for (x, d) in x.iter_mut().zip(delta) {
        *x += d;
    }
    Ok(())
}

/// Causal GQA attention of one query (`[n_heads, head_dim]`, RoPE applied) over the
/// first `kv_len` positions of `cache`, or only the last `window` of them (a
/// sliding-window layer; `usize::MAX`: all), heads split over the pool.
pub fn attend(
    model: &ExecModel,
    q: &[f32],
    cache: &KvCache,
    kv_len: usize,
    window: usize,
) -> Vec<f32> {
    let first = kv_len.saturating_sub(window);
    let c = &model.config;
    let (d, kv_dim) = (c.head_dim, c.kv_dim());
    let group = c.n_heads / c.n_kv_heads.max(1);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(d)
        .zip(q.par_chunks(d))
        .enumerate()
        .for_each(|(head, (out, q))| {
            let offset = (head / group.max(1)) * d;
            let key = |j: usize| &cache.k[j * kv_dim + offset..j * kv_dim + offset + d];
            let mut scores: Vec<f32> = (first..kv_len)
                .map(|j| scale * key(j).iter().zip(q).map(|(k, q)| k * q).sum::<f32>())
                .collect();
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let mut total = 0f32;
            for s in &mut scores {
                *s = (*s - max).exp();
                total += *s;
            }
            for (j, p) in (first..).zip(&scores) {
                let value = &cache.v[j * kv_dim + offset..j * kv_dim + offset + d];
                for (o, v) in out.iter_mut().zip(value) {
                    *o += p / total * v;
                }
            }
        });
    out
}
