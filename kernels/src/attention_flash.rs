//! Causal grouped-query attention in one pass over the keys (flash-style), AVX-512.
//!
//! The GEMM-based kernel ([`crate::attention_causal_gqa_gemm`]) packs every key and every
//! transposed value of the context per call and materialises a score and a probability
//! row over the whole visible context for each query row: at 4096 tokens those buffers
//! (48 rows × 4096 × 4 bytes, twice) leave the L2 cache and the packing costs as much as
//! the products. Here the keys are only transposed into tiles of [`KEYS_PER_TILE`]
//! ([`FlashKeys`], one pass over the cache), the values are read in place from the
//! cache, and each group of `ROWS` query rows walks the key tiles once with an online
//! softmax (running maximum and sum, the output rescaled when the maximum grows), so the
//! working set of a step is one tile of keys and values. The query heads of a KV group
//! are rows of the same walk, so each key and value load serves all of them (GQA).
//!
//! Numerics: f32 with FMA; the scores are scaled through the queries (`q · scale`), the
//! exponentials are [`crate::exp_approx`]'s; the result differs from the scalar f64
//! reference by rounding (tested to the GEMM kernel's tolerance in
//! `tests/attention_and_rope.rs`). Needs AVX-512F and a head dimension that is a
//! multiple of [`DIM_STEP`] ([`flash_supported`]); the caller keeps the GEMM kernel
//! otherwise.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::reference::AttentionShape;

/// Keys per tile: two 512-bit vectors of scores per query row.
pub const KEYS_PER_TILE: usize = 32;
/// Query rows walked together: each key or value vector loaded serves all of them.
const ROWS: usize = 6;
/// Head dimensions are processed in steps of four 512-bit vectors.
pub const DIM_STEP: usize = 64;

/// Whether [`attention_causal_gqa_flash`] runs on this CPU for heads of `head_dim`.
pub fn flash_supported(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(DIM_STEP) && crate::widest::avx512_available()
}

/// The keys of every KV head transposed into tiles: tile `t` of head `g` holds, for each
/// dimension `e`, the [`KEYS_PER_TILE`] keys `t * KEYS_PER_TILE..` side by side (zero past
/// the last position), so one vector load holds one dimension of 16 keys.
#[derive(Clone, Debug)]
pub struct FlashKeys {
    kv_len: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// The first tile gathered: keys before it are outside every query's window.
    first_tile: usize,
    tiles: usize,
    data: Vec<f32>,
}

impl FlashKeys {
    /// Transposes the first `kv_len` positions of `k_cache` (row-major
    /// `[≥ kv_len, n_kv_heads, head_dim]`).
    ///
    /// # Panics
    /// If the cache holds fewer than `kv_len` positions.
    pub fn gather(k_cache: &[f32], kv_len: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        Self::gather_from(k_cache, 0, kv_len, n_kv_heads, head_dim)
    }

    /// Transposes positions `from..kv_len` of `k_cache` (from the tile holding `from`):
    /// the keys a sliding window can reach, when no query sees a key before `from`.
    ///
    /// # Panics
    /// If the cache holds fewer than `kv_len` positions.
    pub fn gather_from(
        k_cache: &[f32],
        from: usize,
        kv_len: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let row = n_kv_heads * head_dim;
        assert!(k_cache.len() >= kv_len * row, "k_cache shorter than kv_len");
        let first_tile = from.min(kv_len) / KEYS_PER_TILE;
        let start = first_tile * KEYS_PER_TILE;
        let tiles = kv_len.div_ceil(KEYS_PER_TILE) - first_tile;
        let tile_len = head_dim * KEYS_PER_TILE;
        let mut data = vec![0f32; n_kv_heads * tiles * tile_len];
        for (i, key_row) in k_cache[start * row..kv_len * row]
            .chunks_exact(row.max(1))
            .enumerate()
        {
            let (t, j) = (i / KEYS_PER_TILE, i % KEYS_PER_TILE);
            for (g, key) in key_row.chunks_exact(head_dim.max(1)).enumerate() {
                let tile = &mut data[(g * tiles + t) * tile_len..][..tile_len];
                for (e, &v) in key.iter().enumerate() {
                    tile[e * KEYS_PER_TILE + j] = v;
                }
            }
        }
        Self {
            kv_len,
            n_kv_heads,
            head_dim,
            first_tile,
            tiles,
            data,
        }
    }

    /// Positions gathered.
    pub fn kv_len(&self) -> usize {
        self.kv_len
    }

    /// Tile `t` (counted from position 0) of KV head `g`: `[head_dim, KEYS_PER_TILE]`.
    ///
    /// # Panics
    /// If `t` is before the first tile gathered.
    fn tile(&self, g: usize, t: usize) -> &[f32] {
        let len = self.head_dim * KEYS_PER_TILE;
        let t = t
            .checked_sub(self.first_tile)
            .expect("a key tile before the gathered range");
        &self.data[(g * self.tiles + t) * len..][..len]
    }
}

/// Same contract as [`crate::attention_causal_gqa_gemm`], with the keys transposed in
/// `keys` and the values read from `v_cache` (row-major `[≥ kv_len, n_kv_heads,
/// head_dim]`). Callers split the queries into token blocks across threads and share
/// `keys` and the cache.
///
/// # Panics
/// If the shapes disagree, or [`flash_supported`] is false for `shape.head_dim`.
pub fn attention_causal_gqa_flash(
    q: &[f32],
    keys: &FlashKeys,
    v_cache: &[f32],
    out: &mut [f32],
    shape: &AttentionShape,
) {
    attention_windowed_gqa_flash(q, keys, v_cache, out, shape, usize::MAX);
}

/// [`attention_causal_gqa_flash`] with a sliding window (llama.cpp's, Gemma 3's local
/// layers): the query at position `p` sees keys `max(0, p + 1 - window) ..= p`; the walk
/// starts at the first tile any query of the block sees. `keys` may start there
/// ([`FlashKeys::gather_from`]).
///
/// # Panics
/// As [`attention_causal_gqa_flash`]; also if `window` is 0 or `keys` start after a key
/// a query sees.
pub fn attention_windowed_gqa_flash(
    q: &[f32],
    keys: &FlashKeys,
    v_cache: &[f32],
    out: &mut [f32],
    shape: &AttentionShape,
    window: usize,
) {
    assert!(window > 0, "a sliding window of no keys");
    assert_eq!(
        shape.kv_len, keys.kv_len,
        "shape.kv_len must match the keys"
    );
    assert_eq!(shape.n_kv_heads, keys.n_kv_heads, "n_kv_heads mismatch");
    assert_eq!(shape.head_dim, keys.head_dim, "head_dim mismatch");
    let row = shape.n_kv_heads * shape.head_dim;
    assert!(
        v_cache.len() >= shape.kv_len * row,
        "v_cache shorter than kv_len"
    );
    shape.validate_queries(q.len(), out.len());
    assert!(
        flash_supported(shape.head_dim),
        "flash attention needs avx512f and a head dimension that is a multiple of {DIM_STEP}"
    );
    if shape.n_tokens == 0 {
        return;
    }
    assert!(
        keys.first_tile * KEYS_PER_TILE <= (shape.pos0 + 1).saturating_sub(window),
        "the keys start after the first key the block's first query sees"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `flash_supported` checked the CPU features; the shapes were checked above.
    unsafe {
        flash(q, keys, v_cache, out, shape, window);
    }
}

/// Running softmax state and output of one group of [`ROWS`] query rows.
struct RowGroup {
    /// Scaled queries, `[ROWS, head_dim]` (rows past the block are zero).
    q: Vec<f32>,
    /// First visible key position of each row.
    first: [usize; ROWS],
    /// Last visible key position of each row.
    last: [usize; ROWS],
    /// Running maximum of each row's scaled scores.
    max: [f32; ROWS],
    /// Running sum of each row's exponentials.
    sum: [f32; ROWS],
    /// Unnormalised output, `[ROWS, head_dim]`.
    out: Vec<f32>,
    /// The current tile's probabilities, `[ROWS, KEYS_PER_TILE]`.
    probs: [[f32; KEYS_PER_TILE]; ROWS],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn flash(
    q: &[f32],
    keys: &FlashKeys,
    v_cache: &[f32],
    out: &mut [f32],
    shape: &AttentionShape,
    window: usize,
) {
    let d = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    let rows = shape.n_tokens * group;
    let q_tok = shape.n_heads * d;
    let scale = shape.scale();
    let mut rg = RowGroup {
        q: vec![0f32; ROWS * d],
        first: [0; ROWS],
        last: [0; ROWS],
        max: [0.0; ROWS],
        sum: [0.0; ROWS],
        out: vec![0f32; ROWS * d],
        probs: [[0.0; KEYS_PER_TILE]; ROWS],
    };
    // Row r of KV head g is query head g * group + r % group of token r / group.
    let offset = |g: usize, r: usize| (r / group) * q_tok + (g * group + r % group) * d;
    for g in 0..shape.n_kv_heads {
        for r0 in (0..rows).step_by(ROWS) {
            let live = ROWS.min(rows - r0);
            for i in 0..ROWS {
                let dst = &mut rg.q[i * d..(i + 1) * d];
                if i < live {
                    let src = &q[offset(g, r0 + i)..][..d];
                    for (o, &v) in dst.iter_mut().zip(src) {
                        *o = v * scale;
                    }
                } else {
                    dst.fill(0.0);
                }
                rg.last[i] = shape.pos0 + (r0 + i.min(live - 1)) / group;
                rg.first[i] = (rg.last[i] + 1).saturating_sub(window);
            }
            rg.max = [f32::NEG_INFINITY; ROWS];
            rg.sum = [0.0; ROWS];
            rg.out.fill(0.0);
            let end = rg.last[live - 1] + 1;
            // Rows are in position order: the first row sees the earliest key.
            for t in rg.first[0] / KEYS_PER_TILE..end.div_ceil(KEYS_PER_TILE) {
                let k0 = t * KEYS_PER_TILE;
                let scores = tile_scores(&rg.q, keys.tile(g, t), d);
                softmax_step(&mut rg, &scores, k0);
                let keys_here = KEYS_PER_TILE.min(end - k0);
                let values = &v_cache[k0 * shape.n_kv_heads * d..];
                accumulate_values(&mut rg, values, keys_here, shape.n_kv_heads * d, g * d, d);
            }
            for i in 0..live {
                let inv = 1.0 / rg.sum[i];
                let dst = &mut out[offset(g, r0 + i)..][..d];
                for (o, &v) in dst.iter_mut().zip(&rg.out[i * d..(i + 1) * d]) {
                    *o = v * inv;
                }
            }
        }
    }
}

/// Scores `q_i · k_j` of the [`ROWS`] rows against one key tile (`[d, KEYS_PER_TILE]`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn tile_scores(q: &[f32], tile: &[f32], d: usize) -> [[__m512; 2]; ROWS] {
    debug_assert!(q.len() == ROWS * d && tile.len() == d * KEYS_PER_TILE);
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    for e in 0..d {
        let k = &tile[e * KEYS_PER_TILE..(e + 1) * KEYS_PER_TILE];
        // SAFETY: `k` is 32 readable f32: two unaligned 16-lane loads.
        let (k_lo, k_hi) = unsafe {
            (
                _mm512_loadu_ps(k.as_ptr()),
                _mm512_loadu_ps(k.as_ptr().add(16)),
            )
        };
        for (i, acc) in acc.iter_mut().enumerate() {
            let qv = _mm512_set1_ps(q[i * d + e]);
            acc[0] = _mm512_fmadd_ps(qv, k_lo, acc[0]);
            acc[1] = _mm512_fmadd_ps(qv, k_hi, acc[1]);
        }
    }
    acc
}

/// Online softmax over one tile: masks the keys past each row's last position, updates
/// the running maximum and sum, rescales the output rows, and leaves the tile's
/// probabilities in `rg.probs`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn softmax_step(rg: &mut RowGroup, scores: &[[__m512; 2]; ROWS], k0: usize) {
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let d = rg.q.len() / ROWS;
    // `i` indexes five per-row arrays of the group.
    #[allow(clippy::needless_range_loop)]
    for i in 0..ROWS {
        // Keys k0 + lane (+ 16) are visible from first to last: first - k0 <= lane <
        // last + 1 - k0.
        let visible = (rg.last[i] + 1).saturating_sub(k0).min(KEYS_PER_TILE) as i32;
        let hidden = rg.first[i].saturating_sub(k0).min(KEYS_PER_TILE) as i32;
        if hidden >= visible {
            // Nothing of this tile is in the row's window: no weight, nothing rescaled
            // (a row whose window starts past the tile has no maximum yet).
            rg.probs[i] = [0.0; KEYS_PER_TILE];
            continue;
        }
        let masks = [
            _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(visible))
                & _mm512_cmpge_epi32_mask(lanes, _mm512_set1_epi32(hidden)),
            _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(visible - 16))
                & _mm512_cmpge_epi32_mask(lanes, _mm512_set1_epi32(hidden - 16)),
        ];
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let s = [
            _mm512_mask_blend_ps(masks[0], ninf, scores[i][0]),
            _mm512_mask_blend_ps(masks[1], ninf, scores[i][1]),
        ];
        let tile_max = _mm512_reduce_max_ps(_mm512_max_ps(s[0], s[1]));
        let new_max = rg.max[i].max(tile_max);
        let alpha = crate::vector::exp_approx(rg.max[i] - new_max);
        rg.max[i] = new_max;
        let m = _mm512_set1_ps(new_max);
        let p = [
            _mm512_maskz_mov_ps(masks[0], exp16(_mm512_sub_ps(s[0], m))),
            _mm512_maskz_mov_ps(masks[1], exp16(_mm512_sub_ps(s[1], m))),
        ];
        rg.sum[i] = rg.sum[i] * alpha + _mm512_reduce_add_ps(_mm512_add_ps(p[0], p[1]));
        // SAFETY: `probs[i]` is 32 writable f32.
        unsafe {
            _mm512_storeu_ps(rg.probs[i].as_mut_ptr(), p[0]);
            _mm512_storeu_ps(rg.probs[i].as_mut_ptr().add(16), p[1]);
        }
        if alpha != 1.0 {
            for o in &mut rg.out[i * d..(i + 1) * d] {
                *o *= alpha;
            }
        }
    }
}

/// `out_i += Σ_j probs[i][j] · v_j` for the first `n_keys` keys of the tile; value `j` is
/// `values[j * stride + head..][..d]`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn accumulate_values(
    rg: &mut RowGroup,
    values: &[f32],
    n_keys: usize,
    stride: usize,
    head: usize,
    d: usize,
) {
    assert!(values.len() >= (n_keys.max(1) - 1) * stride + head + d);
    for c in (0..d).step_by(DIM_STEP) {
        let mut acc = [[_mm512_setzero_ps(); 4]; ROWS];
        for (i, acc) in acc.iter_mut().enumerate() {
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: `out` holds ROWS * d f32 and c + 16 v + 16 <= d.
                *a = unsafe { _mm512_loadu_ps(rg.out.as_ptr().add(i * d + c + 16 * v)) };
            }
        }
        for j in 0..n_keys {
            let base = j * stride + head + c;
            // SAFETY: base + 64 <= (n_keys - 1) * stride + head + d <= values.len()
            // (asserted above).
            let vs: [__m512; 4] = std::array::from_fn(|v| unsafe {
                _mm512_loadu_ps(values.as_ptr().add(base + 16 * v))
            });
            for (i, acc) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(rg.probs[i][j]);
                for (a, &v) in acc.iter_mut().zip(&vs) {
                    *a = _mm512_fmadd_ps(p, v, *a);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm512_storeu_ps(rg.out.as_mut_ptr().add(i * d + c + 16 * v), a) };
            }
        }
    }
}

/// [`crate::exp_approx`] on 16 lanes: the same clamp, range reduction and polynomial.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn exp16(x: __m512) -> __m512 {
    const MAGIC: f32 = 12_582_912.0;
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.3)),
        _mm512_set1_ps(88.3),
    );
    let shifted = _mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        _mm512_set1_ps(MAGIC),
    );
    let k = _mm512_sub_ps(shifted, _mm512_set1_ps(MAGIC));
    let k_int = _mm512_sub_epi32(
        _mm512_castps_si512(shifted),
        _mm512_set1_epi32(MAGIC.to_bits() as i32),
    );
    let r = _mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.693_359_4)));
    let r = _mm512_sub_ps(r, _mm512_mul_ps(k, _mm512_set1_ps(-2.121_944_4e-4)));
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let p = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
    let pow2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(k_int, _mm512_set1_epi32(127)));
    _mm512_mul_ps(p, _mm512_castsi512_ps(pow2))
}
