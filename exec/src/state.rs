//! Everything a prefill writes: each chunk's activations, the in-place KV cache, and
//! the logits.
//!
//! Concurrency: the scheduler runs at most one stage of a chunk at a time (a chunk's
//! stages form a chain), so each chunk's values sit behind their own mutex, uncontended
//! in practice. The exception is an outlier shadow stage, which runs beside its INT8
//! stage: it never takes the chunk's values, only the chunk's [`ShadowSlot`] (the
//! outliers handed to it and the results it hands to the merge). The KV cache is one preallocated `[prompt, kv_dim]` buffer per layer for
//! keys and one for values; every chunk writes its rows in place, at its offset.
//!
//! A continuation ([`PrefillState::continuing`]: a later turn, or one decode step) runs
//! the tokens after position `pos0` over a cache that already holds positions
//! `0..pos0`, and hands the cache back ([`PrefillState::into_caches`]) without a copy.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::activation::{Act, Outliers};
use super::recorder::ActivationRecorder;
use super::values::LinearOut;
use hetsched_systems::op::Projection;
use hetsched_systems::shadow::ShadowSite;

/// The values one chunk carries between operators. Each is taken by the operator that
/// consumes it, so a missing value shows a broken dependency instead of stale data.
#[derive(Debug, Default)]
pub struct ChunkValues {
    /// The residual stream, `[tokens, hidden]`.
    pub x: Vec<f32>,
    /// Normalised residual.
    pub normed: Option<Vec<f32>>,
    /// Input of the next projections (read by several).
    pub act: Option<Act>,
    /// Query projection output.
    pub q_raw: Option<LinearOut>,
    /// Dequantized queries, `[tokens, heads, head_dim]`.
    pub q: Option<Vec<f32>>,
    /// Attention output.
    pub attn: Option<Vec<f32>>,
    /// Attention output projection.
    pub o_raw: Option<LinearOut>,
    /// What the next residual add adds.
    pub delta: Option<Vec<f32>>,
    /// FFN gate projection.
    pub gate_raw: Option<LinearOut>,
    /// FFN up projection.
    pub up_raw: Option<LinearOut>,
    /// FFN down projection.
    pub down_raw: Option<LinearOut>,
}

/// What a chunk's outlier shadow passes between stages: the quantize operator leaves the
/// outliers of a shadowed site, the shadow stage takes them and leaves one float result
/// per linear, and the merge (the dequantize reading that linear) takes those.
#[derive(Debug, Default)]
pub struct ShadowSlot {
    /// The site whose shadow has not run yet, and its outliers (flat index into the
    /// `[rows, k]` activation, and what the INT8 value misses).
    pub pending: Option<(ShadowSite, Arc<Outliers>)>,
    /// The shadow's result `[rows, n]` per linear, by [`Projection::index`].
    pub results: [Option<Vec<f32>>; Projection::COUNT],
}

/// A chunk's rows of one layer's KV cache.
#[derive(Debug, Default)]
pub enum KvRows {
    /// The projections have not run yet.
    #[default]
    Missing,
    /// Projected, not yet rotated and written (the first stage that needs them does it).
    Pending {
        /// Key projection output.
        k: Option<LinearOut>,
        /// Value projection output.
        v: Option<LinearOut>,
    },
    /// In the cache.
    Written,
}

/// One layer's KV cache: `[positions, kv_dim]` keys and values (a generation session's
/// buffers hold more positions than are written yet).
#[derive(Debug, Default)]
pub struct KvCache {
    /// Keys after RoPE.
    pub k: Vec<f32>,
    /// Values.
    pub v: Vec<f32>,
}

/// One layer's cache and the state of each chunk's rows in it.
#[derive(Debug)]
pub struct LayerKv {
    /// The buffers.
    pub cache: RwLock<KvCache>,
    /// Per chunk.
    pub rows: Vec<Mutex<KvRows>>,
}

/// The shared state of one prefill.
#[derive(Debug)]
pub struct PrefillState {
    /// Every token from position 0: the ones already in the cache, then the ones this run
    /// computes (from [`Self::pos0`]).
    pub tokens: Vec<u32>,
    /// The first position this run computes (0 for a prefill from scratch).
    pub pos0: usize,
    /// Tokens per chunk (the last chunk may be shorter).
    pub chunk_len: usize,
    /// Per chunk.
    pub chunks: Vec<Mutex<ChunkValues>>,
    /// Per chunk: the outlier shadow's hand-offs.
    pub shadow: Vec<Mutex<ShadowSlot>>,
    /// Per layer.
    pub kv: Vec<LayerKv>,
    /// Next-token logits, once the head has run: `[vocab]`, or `[last chunk's tokens,
    /// vocab]` with `all_logits`.
    pub logits: Mutex<Option<Vec<f32>>>,
    /// Compute the head for every token of the last chunk (evaluation), not just the last.
    pub all_logits: bool,
    /// Sees every activation before it is quantized (calibration runs).
    pub recorder: Option<Arc<ActivationRecorder>>,
}

impl PrefillState {
    /// Empty state for `tokens` cut into chunks of `chunk_len`, with a KV cache of
    /// `layers` × `[tokens, kv_dim]`.
    pub fn new(tokens: Vec<u32>, chunk_len: usize, layers: usize, kv_dim: usize) -> Self {
        let caches = (0..layers)
            .map(|_| KvCache {
                k: vec![0f32; tokens.len() * kv_dim],
                v: vec![0f32; tokens.len() * kv_dim],
            })
            .collect();
        Self::continuing(tokens, 0, chunk_len, caches)
    }

    /// State for computing `tokens[pos0..]` over `caches` (one per layer), which already
    /// hold the keys and values of positions `0..pos0` and have room for every token.
    /// The caches are moved in, not copied; [`Self::into_caches`] moves them out again.
    pub fn continuing(
        tokens: Vec<u32>,
        pos0: usize,
        chunk_len: usize,
        caches: Vec<KvCache>,
    ) -> Self {
        let chunk_count = tokens.len().saturating_sub(pos0).div_ceil(chunk_len.max(1));
        let kv = caches
            .into_iter()
            .map(|cache| LayerKv {
                cache: RwLock::new(cache),
                rows: (0..chunk_count).map(|_| Mutex::default()).collect(),
            })
            .collect();
        Self {
            chunks: (0..chunk_count).map(|_| Mutex::default()).collect(),
            shadow: (0..chunk_count).map(|_| Mutex::default()).collect(),
            tokens,
            pos0,
            chunk_len,
            kv,
            logits: Mutex::new(None),
            all_logits: false,
            recorder: None,
        }
    }

    /// Re-arms this state for another continuation (the next decode step): `tokens[pos0..]`
    /// computed over `caches`, as [`Self::continuing`] would build it, but reusing the
    /// per-chunk and per-layer slots when the chunk count is unchanged (a decode step's
    /// state is one chunk each time), so a step allocates nothing here.
    pub fn restart(&mut self, tokens: Vec<u32>, pos0: usize, caches: Vec<KvCache>) {
        let chunk_count = tokens
            .len()
            .saturating_sub(pos0)
            .div_ceil(self.chunk_len.max(1));
        if chunk_count != self.chunks.len() || caches.len() != self.kv.len() {
            let fresh = Self::continuing(tokens, pos0, self.chunk_len, caches);
            let (all_logits, recorder) = (self.all_logits, self.recorder.take());
            *self = Self {
                all_logits,
                recorder,
                ..fresh
            };
            return;
        }
        for chunk in &mut self.chunks {
            *chunk.get_mut() = ChunkValues::default();
        }
        for slot in &mut self.shadow {
            *slot.get_mut() = ShadowSlot::default();
        }
        for (layer, cache) in self.kv.iter_mut().zip(caches) {
            *layer.cache.get_mut() = cache;
            for rows in &mut layer.rows {
                *rows.get_mut() = KvRows::Missing;
            }
        }
        *self.logits.get_mut() = None;
        self.tokens = tokens;
        self.pos0 = pos0;
    }

    /// The KV cache of every layer moved out, leaving empty caches (for [`Self::restart`]).
    pub fn take_caches(&mut self) -> Vec<KvCache> {
        self.kv
            .iter_mut()
            .map(|layer| std::mem::take(layer.cache.get_mut()))
            .collect()
    }

    /// Absolute positions of chunk `chunk`'s tokens.
    pub fn positions(&self, chunk: usize) -> Range<usize> {
        let start = (self.pos0 + chunk * self.chunk_len).min(self.tokens.len());
        start..(start + self.chunk_len).min(self.tokens.len())
    }

    /// The KV cache of every layer, moved out (positions `0..tokens.len()` written once
    /// the run finished).
    pub fn into_caches(self) -> Vec<KvCache> {
        self.kv
            .into_iter()
            .map(|layer| layer.cache.into_inner())
            .collect()
    }
}
