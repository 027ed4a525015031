//! One decode step as a single chain of the prefill's kernels, without the scheduler:
//! the token's embedding through every layer (norm, quantize, the linears as
//! matrix-vector products split over the pool's threads, RoPE, attention of one query
//! over the KV cache, FFN), then the head. The arithmetic is the prefill's, operator for
//! operator (the same quantize rules, INT8 products, outlier shadow and dequantize), so
//! the step continues a scheduled prefill's cache exactly as a scheduled step would.
//! One choice differs where the session asks for it: the head as an INT8 linear
//! ([`int8_head`]) for INT8 models, since a token's step otherwise streams the f32 head
//! (as many bytes as every INT8 layer together).

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedI8Weights, rms_norm};
use hetsched_systems::op::{Block, Projection};
use hetsched_systems::shadow::ShadowSite;
use rayon::prelude::*;

use crate::family::{self, gated, norm_rows};
use crate::state::KvCache;
use crate::values::{
    Act, LinearOut, Outliers, dequantize, linear, matmul_rows, quantize, shadow_product,
};
use crate::{ExecError, ExecModel, LayerWeights, LinearWeights, QuantRule};

/// The LM head as a W8A8 linear (INT8 weights with a scale per vocabulary row, the
/// activation quantized per tensor), the arithmetic the model's other linears use.
pub fn int8_head(model: &ExecModel) -> LinearWeights {
    let (n, k) = (model.output.n(), model.output.k());
    let (q, scales) = quantize_weights_per_row(&model.output.to_rows(), n, k);
    LinearWeights::Int8 {
        packed: PackedI8Weights::pack(&q, n, k),
        scales,
        shadow: None,
    }
}

/// Feeds `token` at `position` (the caches hold positions `0..position` and have room
/// for one more) and returns the logits of the next token, from `head` if given (an
/// [`int8_head`]) or the model's f32 head. Runs on the current pool.
pub fn decode_step(
    model: &ExecModel,
    head: Option<&LinearWeights>,
    caches: &mut [KvCache],
    token: u32,
    position: usize,
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
        attention_block(model, layer, w, cache, &mut x, position)?;
        ffn_block(model, layer, w, &mut x, position)?;
    }
    let normed = norm(model, &x, &model.output_norm);
    let logits = match head {
        Some(head) => {
            let act = quantize(normed, QuantRule::MaxAbs);
            dequantize(linear(&act, 1, head)?, head)?
        }
        None => matmul_rows(&normed, &model.output),
    };
    crate::take_logits(&parking_lot::Mutex::new(Some(logits)))
}

/// RMSNorm of one row.
fn norm(model: &ExecModel, x: &[f32], weight: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    rms_norm(x, weight, model.config.norm_eps, &mut out, 1, x.len());
    out
}

/// An activation quantized under `layer`'s rule for `site`, and its outliers (shadowed
/// sites only).
fn quantized(model: &ExecModel, layer: usize, site: ShadowSite, x: Vec<f32>) -> (Act, Outliers) {
    let mut act = quantize(x, model.quant_rule(layer, site));
    let outliers = match &mut act {
        Act::Int8 { outliers, .. } => std::mem::take(outliers),
        Act::F32(_) => Vec::new(),
    };
    (act, outliers)
}

/// Projection `p` of one row: the linear, its outlier shadow merged, dequantized.
fn project(
    model: &ExecModel,
    w: &LayerWeights,
    p: Projection,
    (act, outliers): &(Act, Outliers),
) -> Result<Vec<f32>, ExecError> {
    let weights = w.projection(p);
    let mut out = linear(act, 1, weights)?;
    if !outliers.is_empty()
        && let LinearOut::Int32 { shadow, .. } = &mut out
    {
        *shadow = Some(shadow_product(
            outliers,
            1,
            weights,
            &model.shadow_counters,
        )?);
    }
    Ok(dequantize(out, weights)?)
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
) -> Result<(), ExecError> {
    let c = &model.config;
    let act = quantized(model, layer, ShadowSite::Qkv, norm(model, x, &w.attn_norm));
    let mut q = project(model, w, Projection::Q, &act)?;
    let mut k = project(model, w, Projection::K, &act)?;
    let mut v = project(model, w, Projection::V, &act)?;
    let here = position..position + 1;
    family::finish_queries(model, layer, &mut q);
    model.rope_of(layer).apply(&mut q, here.clone(), c.n_heads);
    family::finish_keys(model, layer, &mut k, &mut v, here);
    let kv_dim = c.kv_dim();
    let span = position * kv_dim..(position + 1) * kv_dim;
    let room = cache.k.len().min(cache.v.len());
    if span.end > room {
        return Err(ExecError::Kernel(format!(
            "the KV cache of layer {layer} holds {} positions; position {position} needs more",
            room / kv_dim.max(1)
        )));
    }
    cache.k[span.clone()].copy_from_slice(&k);
    cache.v[span].copy_from_slice(&v);
    let attn = attend(model, &q, cache, position + 1, c.window_of(layer));
    let act = quantized(model, layer, ShadowSite::O, attn);
    let o = project(model, w, Projection::O, &act)?;
    let o = post_normed(model, w, Block::Attention, o);
    add_finite(x, &o, layer, "attention", position)
}

/// `x += Wdown · (SiLU(Wgate · h) ⊙ Wup · h)` with `h` the FFN-normed `x`.
fn ffn_block(
    model: &ExecModel,
    layer: usize,
    w: &LayerWeights,
    x: &mut [f32],
    position: usize,
) -> Result<(), ExecError> {
    let act = quantized(
        model,
        layer,
        ShadowSite::GateUp,
        norm(model, x, &w.ffn_norm),
    );
    let gate = project(model, w, Projection::Gate, &act)?;
    let up = project(model, w, Projection::Up, &act)?;
    let hidden = gated(model.config.family.activation, &gate, &up);
    let act = quantized(model, layer, ShadowSite::Down, hidden);
    let down = project(model, w, Projection::Down, &act)?;
    let down = post_normed(model, w, Block::FeedForward, down);
    add_finite(x, &down, layer, "feed-forward", position)
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
