//! RoPE with precomputed rotations.
//!
//! [`crate::reference::rope()`] evaluates `powf` and `sin_cos` in f64 for every
//! element: exact, but it costs more than the attention it feeds at prefill
//! sizes. A [`RopeTable`] computes each `(cos, sin)` once per position and
//! frequency (in f64, rounded to f32) and applies them with two multiply-adds
//! per pair.

use std::ops::Range;

use crate::reference::RopeStyle;

/// Rotations are precomputed for at most this many positions (2 MiB for a head of 64):
/// a model's context can reach 2^20 positions, and a table that large would cost 256 MiB
/// before the first token. Positions past it are computed when applied.
pub const PRECOMPUTED_POSITIONS: usize = 8192;

/// Rotations for positions `0..max_positions` of one head layout.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    head_dim: usize,
    style: RopeStyle,
    /// Positions the table answers for.
    max_positions: usize,
    /// `[head_dim / 2]` frequencies, for positions past the precomputed ones.
    freqs: Vec<f64>,
    /// `[min(max_positions, PRECOMPUTED_POSITIONS), head_dim / 2]` cosines.
    cos: Vec<f32>,
    /// Sines, laid out as `cos`.
    sin: Vec<f32>,
}

impl RopeTable {
    /// Rotations of frequency `theta_base^(-2i / head_dim)` for every position below
    /// `max_positions`, the same angles as [`crate::reference::rope()`]; the first
    /// [`PRECOMPUTED_POSITIONS`] are computed here.
    ///
    /// # Panics
    /// If `head_dim` is odd.
    pub fn new(head_dim: usize, theta_base: f32, style: RopeStyle, max_positions: usize) -> Self {
        assert_eq!(head_dim % 2, 0, "head_dim must be even");
        let base = f64::from(theta_base);
        let freqs: Vec<f64> = (0..head_dim / 2)
            .map(|i| base.powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        Self::from_frequencies(head_dim, freqs, style, max_positions)
    }

    /// Rotations of pair `i` by `position · freqs[i]`: any frequencies, such as a scaled
    /// RoPE's (linear scaling, Llama-3's per-frequency factors), which [`RopeTable::new`]
    /// computes from a base alone.
    ///
    /// # Panics
    /// If `head_dim` is odd or `freqs` does not hold `head_dim / 2` frequencies.
    pub fn from_frequencies(
        head_dim: usize,
        freqs: Vec<f64>,
        style: RopeStyle,
        max_positions: usize,
    ) -> Self {
        assert_eq!(head_dim % 2, 0, "head_dim must be even");
        let half = head_dim / 2;
        assert_eq!(freqs.len(), half, "one frequency per pair");
        let precomputed = max_positions.min(PRECOMPUTED_POSITIONS);
        let mut cos = Vec::with_capacity(precomputed * half);
        let mut sin = Vec::with_capacity(precomputed * half);
        for pos in 0..precomputed {
            for &freq in &freqs {
                let (s, c) = (pos as f64 * freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        Self {
            head_dim,
            style,
            max_positions,
            freqs,
            cos,
            sin,
        }
    }

    /// Positions the table covers.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The `(cos, sin)` of position `pos`: precomputed, or computed into `scratch`.
    fn rotation<'a>(
        &'a self,
        pos: usize,
        scratch: &'a mut (Vec<f32>, Vec<f32>),
    ) -> (&'a [f32], &'a [f32]) {
        let half = self.head_dim / 2;
        if (pos + 1) * half <= self.cos.len() {
            return (
                &self.cos[pos * half..(pos + 1) * half],
                &self.sin[pos * half..(pos + 1) * half],
            );
        }
        let (cos, sin) = scratch;
        cos.clear();
        sin.clear();
        for &freq in &self.freqs {
            let (s, c) = (pos as f64 * freq).sin_cos();
            cos.push(c as f32);
            sin.push(s as f32);
        }
        (cos, sin)
    }

    /// Rotates `x`, row-major `[positions.len(), n_heads, head_dim]`, token `t` sitting
    /// at absolute position `positions.start + t`.
    ///
    /// # Panics
    /// If `x` does not have that shape or a position is beyond the table.
    pub fn apply(&self, x: &mut [f32], positions: Range<usize>, n_heads: usize) {
        let d = self.head_dim;
        assert_eq!(
            x.len(),
            positions.len() * n_heads * d,
            "x must be [tokens, n_heads, head_dim]"
        );
        assert!(
            positions.end <= self.max_positions(),
            "position {} beyond the table's {}",
            positions.end,
            self.max_positions()
        );
        if d == 0 || n_heads == 0 {
            return;
        }
        let half = d / 2;
        let mut scratch = (Vec::new(), Vec::new());
        for (token, pos) in x.chunks_exact_mut(n_heads * d).zip(positions) {
            let (cos, sin) = self.rotation(pos, &mut scratch);
            for head in token.chunks_exact_mut(d) {
                match self.style {
                    RopeStyle::Adjacent => {
                        for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * c - b * s;
                            pair[1] = a * s + b * c;
                        }
                    }
                    RopeStyle::HalfSplit => {
                        let (lo, hi) = head.split_at_mut(half);
                        for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
                            let (x0, x1) = (*a, *b);
                            *a = x0 * c - x1 * s;
                            *b = x0 * s + x1 * c;
                        }
                    }
                }
            }
        }
    }
}
