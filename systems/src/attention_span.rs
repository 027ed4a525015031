//! The keys an attention operator reads: every earlier key of its layer (causal), or at
//! most a sliding window of them (a local layer of Gemma 3, [`crate::block::SlidingWindow`]).
//!
//! A chunk of `t` tokens after `past` cached ones holds queries at positions
//! `past .. past + t`; the query at position `x` scores `x + 1` keys causally, or
//! `min(x + 1, window)` through a window of `window` keys (itself included, as the
//! executors and llama.cpp mask). Both the roofline ([`crate::model::OpDecl::work`]) and
//! the fitted stage costs ([`crate::StageCost`]) price attention by these pairs, so a
//! local layer's cost stops growing once its context passes the window.

use crate::op::{OpDecl, OpKind};

/// Shape of the chunk an operator runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkShape {
    /// Tokens in the chunk (its fixed length: a short last chunk is padded, as with
    /// pre-built fixed-length graphs).
    pub tokens: u64,
    /// Tokens before this chunk (the KV cache already filled).
    pub past: u64,
}

/// The (query, key) pairs attention scores for a chunk of `shape` through a window of
/// `window` keys (`None`: causal over every earlier key).
pub fn windowed_pairs(shape: ChunkShape, window: Option<u64>) -> f64 {
    let (t, p) = (shape.tokens, shape.past);
    // Queries whose causal keys still fit in the window: positions x < window - 1.
    let within = window.map_or(t, |w| w.saturating_sub(p).min(t));
    if within == t {
        // The causal count, in the very expression the model always used (so that a
        // model without a window is priced to the bit as before).
        let (t, p) = (t as f64, p as f64);
        return t * p + t * (t + 1.0) / 2.0;
    }
    let w = window.unwrap_or(u64::MAX) as f64;
    let (n, p) = (within as f64, p as f64);
    n * p + n * (n + 1.0) / 2.0 + (t - within) as f64 * w
}

/// The cached keys the chunk's attention reads at all (each once, for every head): from
/// the oldest key its first query's window reaches to its last query.
pub fn keys_read(shape: ChunkShape, window: Option<u64>) -> f64 {
    let span = shape.past + shape.tokens;
    match window {
        Some(w) => span.min(w.saturating_sub(1) + shape.tokens) as f64,
        None => span as f64,
    }
}

/// Whether `window` cuts keys from the chunk's attention: its last query has more
/// earlier keys than the window holds. (The executors then run a windowed kernel
/// instead of the causal one, at another cost per pair: a fitted stage cost prices the
/// two apart, [`crate::StageCost::per_window_pair_us`].)
pub fn window_cuts(shape: ChunkShape, window: Option<u64>) -> bool {
    window.is_some_and(|w| shape.past + shape.tokens > w)
}

/// The sliding window of the attention operator among `ops`, if it has one.
pub fn attention_window(ops: &[OpDecl]) -> Option<u64> {
    ops.iter()
        .find(|op| op.kind == OpKind::Attention)
        .and_then(|op| op.window)
        .map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs counted query by query.
    fn brute(shape: ChunkShape, window: Option<u64>) -> f64 {
        (shape.past..shape.past + shape.tokens)
            .map(|x| (x + 1).min(window.unwrap_or(u64::MAX)) as f64)
            .sum()
    }

    #[test]
    fn pairs_match_a_query_by_query_count() {
        for tokens in [1u64, 7, 64, 128] {
            for past in [0u64, 1, 100, 383, 384, 511, 512, 1000, 4096] {
                let shape = ChunkShape { tokens, past };
                for window in [None, Some(1), Some(64), Some(512), Some(100_000)] {
                    assert_eq!(
                        windowed_pairs(shape, window),
                        brute(shape, window),
                        "{shape:?} {window:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn past_the_window_a_chunk_scores_window_keys_per_query() {
        let shape = ChunkShape {
            tokens: 128,
            past: 4096,
        };
        assert_eq!(windowed_pairs(shape, Some(512)), 128.0 * 512.0);
        assert_eq!(keys_read(shape, Some(512)), 511.0 + 128.0);
        assert_eq!(keys_read(shape, None), 4096.0 + 128.0);
        // Inside the window, nothing changes.
        let early = ChunkShape {
            tokens: 128,
            past: 256,
        };
        assert_eq!(
            windowed_pairs(early, Some(512)),
            windowed_pairs(early, None)
        );
        assert_eq!(keys_read(early, Some(512)), keys_read(early, None));
    }
}
