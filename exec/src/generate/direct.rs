//! One decode step as a single chain of the prefill's kernels, without the scheduler:
//! the token's embedding through every layer (norm, quantize, the linears as
//! matrix-vector products split over the pool's threads, RoPE, attention of one query
//! over the KV cache, FFN), then the head. The arithmetic is the prefill's, operator for
//! operator (the same quantize rules, INT8 products, outlier shadow and dequantize), so
//! the step continues a scheduled prefill's cache exactly as a scheduled step would.
//! One choice differs where the session asks for it: a quantized head ([`QuantizedHead`]),
//! since a token's step otherwise streams the f32 head. The
//! kernels' time of each step (the linears' and attention's parallel regions) is kept
//! in [`DecodeBuffers`], so that what a step spends outside them is known.

use std::time::Instant;

use hetsched_kernels::rms_norm_fast;
use hetsched_systems::op::{Block, Projection};
use hetsched_systems::shadow::ShadowSite;

use super::attend::{Query, attend_all};
use super::gated_linears::{GatedOut, project_gated};
use super::head::QuantizedHead;
use super::linears::{self, Batch, Matrix};
use super::sequence_kv::{SequenceKv, SequenceStep};
use crate::family::{self, gated_into, norm_rows};
use crate::state::KvCache;
use crate::values::quantize_slice;
use crate::{ExecError, ExecModel, LayerWeights, QuantRule};

/// The buffers of decode steps, kept across steps so that a step allocates little: the
/// residual stream, the normed rows and the gated activation, the prepared activations
/// and the projections' outputs (`[sequences, n]` each).
#[derive(Debug, Default)]
pub struct DecodeBuffers {
    /// The residual stream, `[sequences, hidden]`.
    x: Vec<f32>,
    /// The current norm's output, `[sequences, hidden]`.
    normed: Vec<f32>,
    /// A vocabulary of logits handed back ([`DecodeBuffers::recycle_logits`]) for the
    /// next one-sequence step to write over instead of a zeroed allocation.
    spare_logits: Vec<f32>,
    /// The gated activation, `[sequences, ffn]`.
    hidden: Vec<f32>,
    input: Batch,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    out: Vec<f32>,
    /// Every sequence's attention output, `[sequences, n_heads · head_dim]`.
    attended: Vec<f32>,
    /// Wall time inside the kernels' parallel regions (the linears' products and
    /// attention), summed over steps, ns.
    kernel_ns: u64,
}

impl DecodeBuffers {
    /// Takes back logits a later step superseded, for the next one-sequence step to
    /// write its logits into (a vocabulary of zeros each step otherwise: 192 KiB for
    /// SmolLM2).
    pub fn recycle_logits(&mut self, logits: Vec<f32>) {
        self.spare_logits = logits;
    }

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
/// for one more) and returns the logits of the next token, from `head` if given (a
/// [`QuantizedHead`]) or the model's f32 head. Runs on the current pool; `buffers` are
/// reused across steps. A batch of one [`decode_batch`].
pub fn decode_step(
    model: &ExecModel,
    head: Option<&QuantizedHead>,
    caches: &mut [KvCache],
    token: u32,
    position: usize,
    buffers: &mut DecodeBuffers,
) -> Result<Vec<f32>, ExecError> {
    let mut one = [SequenceStep {
        token,
        position,
        kv: SequenceKv::alone(caches),
    }];
    let mut logits = decode_batch(model, head, &mut one, buffers)?;
    Ok(logits.pop().unwrap_or_default())
}

/// One decode step of several sequences of `model` together (batched decode): each
/// linear one small GEMM over the sequences' rows (M = the sequences; the weights
/// streamed once), attention per sequence over its own cache. Returns each sequence's
/// logits in order. Every sequence's arithmetic is its step alone's (its own quantize
/// scale per activation; exact INT32 products), so an INT8 model's logits equal
/// [`decode_step`]'s for that sequence bit for bit (f32 products: up to summation order).
pub fn decode_batch(
    model: &ExecModel,
    head: Option<&QuantizedHead>,
    sequences: &mut [SequenceStep<'_>],
    buffers: &mut DecodeBuffers,
) -> Result<Vec<Vec<f32>>, ExecError> {
    let c = &model.config;
    let h = c.hidden;
    let mut x = std::mem::take(&mut buffers.x);
    x.clear();
    for s in sequences.iter() {
        let row = s.token as usize;
        let embedding =
            model
                .token_embd
                .get(row * h..(row + 1) * h)
                .ok_or(ExecError::TokenOutOfRange {
                    id: s.token,
                    vocab: c.vocab_size,
                })?;
        x.extend_from_slice(embedding);
    }
    family::scale_embeddings(c, &mut x);
    // A step that fails leaves its buffers to be allocated again by the next one.
    for (layer, w) in model.layers.iter().enumerate() {
        attention_block(model, layer, w, sequences, &mut x, buffers)?;
        ffn_block(model, layer, w, sequences, &mut x, buffers)?;
    }
    let mut normed = std::mem::take(&mut buffers.normed);
    norm_into(&x, &model.output_norm, c.norm_eps, &mut normed);
    buffers.x = x;
    let quantized = head;
    let (head, rule) = match head {
        Some(head) => (Matrix::Linear(&head.weights), &head.rule),
        None => (Matrix::F32(&model.output), &QuantRule::PassThrough),
    };
    prepare_rows(&normed, h, rule, None, sequences, &mut buffers.input)?;
    let n = head.n();
    // Every column of the head's product is written, so a recycled buffer's old values
    // never show; a batch of several sequences splits its logits into rows of their own.
    let mut logits = match sequences.len() {
        1 => std::mem::take(&mut buffers.spare_logits),
        _ => Vec::new(),
    };
    logits.resize(sequences.len() * n, 0.0);
    let (input, counters) = (&buffers.input, &model.shadow_counters);
    // The candidates' rescoring is the head's arithmetic, timed with its product.
    timed(&mut buffers.kernel_ns, || {
        linears::project_batch(input, &[head], &mut [&mut logits], counters)?;
        if let Some(quantized) = quantized {
            quantized.finish(&normed, &mut logits);
        }
        Ok::<_, ExecError>(())
    })?;
    buffers.normed = normed;
    // One sequence's logits are handed over as they are, not copied (a vocabulary each
    // token).
    let rows = match sequences.len() {
        1 => vec![logits],
        _ => logits.chunks_exact(n.max(1)).map(<[f32]>::to_vec).collect(),
    };
    rows.into_iter()
        .map(|row| crate::take_logits(&parking_lot::Mutex::new(Some(row))))
        .collect()
}

/// Quantizes each `width`-wide row of `x` under `rule` on its own into `batch` (one
/// row in place, in the batch's own buffers, where the rule allows); a non-finite row,
/// the input of `site`'s linears in `layer` (the LM head: `None`), is refused as the
/// prefill refuses it (naming the sequence's position).
fn prepare_rows(
    x: &[f32],
    width: usize,
    rule: &QuantRule,
    at: Option<(usize, ShadowSite)>,
    sequences: &[SequenceStep<'_>],
    batch: &mut Batch,
) -> Result<(), ExecError> {
    if *rule != QuantRule::PassThrough {
        for (row, sequence) in x.chunks_exact(width.max(1)).zip(sequences) {
            crate::passes::finite_quantize_input(row, at, sequence.position)?;
        }
    }
    if sequences.len() == 1 && batch.quantize_one(x, rule) {
        return Ok(());
    }
    let acts = x
        .chunks_exact(width.max(1))
        .map(|row| quantize_slice(row, rule.clone()))
        .collect();
    batch.set(acts);
    Ok(())
}

/// RMSNorm of the rows of `x` with `weight` into `out` (sized to `x`; its capacity is
/// kept across steps), by the prefill's norm kernel ([`rms_norm_fast`]).
fn norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    let cols = weight.len().max(1);
    rms_norm_fast(x, weight, eps, out, x.len() / cols, cols);
}

/// Sizes `v` to `n` values (its capacity is kept across steps).
fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    v
}

/// `x += Wo · attention(q, cache)` for layer `layer` and every sequence, after writing
/// each sequence's key and value at its position.
fn attention_block(
    model: &ExecModel,
    layer: usize,
    w: &LayerWeights,
    sequences: &mut [SequenceStep<'_>],
    x: &mut [f32],
    b: &mut DecodeBuffers,
) -> Result<(), ExecError> {
    let c = &model.config;
    let (m, kv_dim) = (sequences.len(), c.kv_dim());
    norm_into(x, &w.attn_norm, c.norm_eps, &mut b.normed);
    prepare_rows(
        &b.normed,
        c.hidden,
        &w.quant[ShadowSite::Qkv.index()],
        Some((layer, ShadowSite::Qkv)),
        sequences,
        &mut b.input,
    )?;
    let counters = &model.shadow_counters;
    let [q, k, v, o] = [Projection::Q, Projection::K, Projection::V, Projection::O]
        .map(|p| Matrix::Linear(w.projection(p)));
    let (q_n, k_n, v_n) = (q.n(), k.n(), v.n());
    let mut outs = [
        sized(&mut b.q, m * q_n),
        sized(&mut b.k, m * k_n),
        sized(&mut b.v, m * v_n),
    ];
    timed(&mut b.kernel_ns, || {
        linears::project_batch(&b.input, &[q, k, v], &mut outs, counters)
    })?;
    if k_n != kv_dim || v_n != kv_dim {
        return Err(ExecError::Kernel(format!(
            "layer {layer}'s K and V produce {k_n} and {v_n} values; the KV cache holds {kv_dim}"
        )));
    }
    for (r, s) in sequences.iter_mut().enumerate() {
        let (qr, kr, vr) = (
            &mut b.q[r * q_n..(r + 1) * q_n],
            &mut b.k[r * kv_dim..(r + 1) * kv_dim],
            &mut b.v[r * kv_dim..(r + 1) * kv_dim],
        );
        rotate_and_cache(model, layer, s, qr, kr, vr)?;
    }
    let attended = attend_sequences(model, layer, sequences, b, q_n);
    let prepared = prepare_rows(
        &attended,
        q_n,
        &w.quant[ShadowSite::O.index()],
        Some((layer, ShadowSite::O)),
        sequences,
        &mut b.input,
    );
    b.attended = attended;
    prepared?;
    let out = sized(&mut b.out, m * o.n());
    timed(&mut b.kernel_ns, || {
        linears::project_batch(&b.input, &[o], &mut [out], counters)
    })?;
    let delta = post_normed(model, w, Block::Attention, std::mem::take(&mut b.out));
    let added = add_finite(x, &delta, layer, "attention", sequences);
    b.out = delta;
    added
}

/// Every sequence's rotated queries (`q_n` values each, in `b.q`) attended over its
/// KV cache of layer `layer` up to its position, in `b.attended`'s buffer, taken out
/// (the caller hands it back).
fn attend_sequences(
    model: &ExecModel,
    layer: usize,
    sequences: &[SequenceStep<'_>],
    b: &mut DecodeBuffers,
    q_n: usize,
) -> Vec<f32> {
    let queries: Vec<Query<'_>> = sequences
        .iter()
        .zip(b.q.chunks_exact(q_n.max(1)))
        .map(|(s, q)| Query {
            q,
            cache: s.kv.rows(layer),
            kv_len: s.position + 1,
        })
        .collect();
    let mut attended = std::mem::take(&mut b.attended);
    attended.clear();
    attended.resize(sequences.len() * q_n, 0.0);
    let window = model.config.window_of(layer);
    timed(&mut b.kernel_ns, || {
        attend_all(model, &queries, window, &mut attended)
    });
    attended
}

/// Finishes and rotates one sequence's query `q` and key `k` of layer `layer` at its
/// position, then writes the key and the value `v` there in the sequence's own KV cache.
fn rotate_and_cache(
    model: &ExecModel,
    layer: usize,
    s: &mut SequenceStep<'_>,
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
) -> Result<(), ExecError> {
    let kv_dim = model.config.kv_dim();
    let position = s.position;
    let here = position..position + 1;
    family::finish_queries(model, layer, q);
    model
        .rope_of(layer)
        .apply(q, here.clone(), model.config.n_heads);
    family::finish_keys(model, layer, k, v, here);
    let own = position.checked_sub(s.kv.shared_len).ok_or_else(|| {
        ExecError::Kernel(format!(
            "position {position} lies inside the {} shared positions of the cache",
            s.kv.shared_len
        ))
    })?;
    let cache = &mut s.kv.own[layer];
    let span = own * kv_dim..(own + 1) * kv_dim;
    let room = cache.k.len().min(cache.v.len());
    if span.end > room {
        return Err(ExecError::Kernel(format!(
            "the KV cache of layer {layer} holds {} positions; position {position} needs more",
            s.kv.shared_len + room / kv_dim.max(1)
        )));
    }
    cache.k[span.clone()].copy_from_slice(k);
    cache.v[span].copy_from_slice(v);
    Ok(())
}

/// `x += Wdown · (SiLU(Wgate · h) ⊙ Wup · h)` with `h` the FFN-normed `x`, every sequence.
fn ffn_block(
    model: &ExecModel,
    layer: usize,
    w: &LayerWeights,
    sequences: &[SequenceStep<'_>],
    x: &mut [f32],
    b: &mut DecodeBuffers,
) -> Result<(), ExecError> {
    let c = &model.config;
    let m = sequences.len();
    norm_into(x, &w.ffn_norm, c.norm_eps, &mut b.normed);
    prepare_rows(
        &b.normed,
        c.hidden,
        &w.quant[ShadowSite::GateUp.index()],
        Some((layer, ShadowSite::GateUp)),
        sequences,
        &mut b.input,
    )?;
    let counters = &model.shadow_counters;
    let [gate, up, down] = [Projection::Gate, Projection::Up, Projection::Down]
        .map(|p| Matrix::Linear(w.projection(p)));
    let ffn = gate.n();
    let fused = GatedOut {
        gate: sized(&mut b.gate, m * ffn),
        up: sized(&mut b.up, m * up.n()),
        hidden: sized(&mut b.hidden, m * ffn),
    };
    let activation = c.family.activation;
    let fused = timed(&mut b.kernel_ns, || {
        project_gated(&b.input, [gate, up], activation, fused)
    })?;
    if !fused {
        let mut outs = [&mut b.gate[..], &mut b.up[..]];
        timed(&mut b.kernel_ns, || {
            linears::project_batch(&b.input, &[gate, up], &mut outs, counters)
        })?;
        gated_into(activation, &b.gate, &b.up, &mut b.hidden);
    }
    prepare_rows(
        &b.hidden,
        ffn,
        &w.quant[ShadowSite::Down.index()],
        Some((layer, ShadowSite::Down)),
        sequences,
        &mut b.input,
    )?;
    let out = sized(&mut b.out, m * down.n());
    timed(&mut b.kernel_ns, || {
        linears::project_batch(&b.input, &[down], &mut [out], counters)
    })?;
    let delta = post_normed(model, w, Block::FeedForward, std::mem::take(&mut b.out));
    let added = add_finite(x, &delta, layer, "feed-forward", sequences);
    b.out = delta;
    added
}

/// Every sequence's block output RMS-normalized with its post-norm weight, for a family
/// that has post-norms (Gemma); as it is otherwise.
fn post_normed(model: &ExecModel, w: &LayerWeights, block: Block, delta: Vec<f32>) -> Vec<f32> {
    match w.family.post_norm(block) {
        Some(weight) => norm_rows(&delta, weight, model.config.norm_eps),
        None => delta,
    }
}

/// The residual add of every sequence, refusing a non-finite block output as the prefill
/// does (naming the sequence's position).
fn add_finite(
    x: &mut [f32],
    delta: &[f32],
    layer: usize,
    block: &'static str,
    sequences: &[SequenceStep<'_>],
) -> Result<(), ExecError> {
    if let Some(index) = crate::passes::first_non_finite(delta) {
        let width = delta.len() / sequences.len().max(1);
        let row = index / width.max(1);
        return Err(ExecError::NonFiniteActivation {
            layer,
            block,
            chunk: sequences.get(row).map_or(0, |s| s.position),
            index: index % width.max(1),
            value: delta[index],
        });
    }
    for (x, d) in x.iter_mut().zip(delta) {
        *x += d;
    }
    Ok(())
}
