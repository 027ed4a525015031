//! AVX2 INT8 GEMM, in two forms chosen by the weights.
//!
//! **Signed pairs** (weights in `[-127, 127]`, [`PackedI8Weights::is_symmetric`]: every
//! weight the project's quantizers produce). `vpmaddubsw` multiplies unsigned by signed
//! bytes, 32 products an instruction, and adds adjacent pairs into i16 with saturation.
//! Each activation's sign moves onto the weight it multiplies (`vpsignb`: `w · sign(a)`),
//! so that its magnitude `|a|` (at most 128, a u8) is the unsigned operand:
//! `|a| · w · sign(a) = a · w`. A pair sum is then at most `2 · 128 · 127 = 32512`, inside
//! i16 (32767), so nothing saturates; one `vpmaddwd` against ones adds the two pairs of
//! a column's quad into an exact i32. Activations may take every i8 value, -128
//! included; a weight of -128 may not (`vpsignb` cannot negate it, and `128 · 128 · 2`
//! exceeds i16). This is the form of llama.cpp's AVX2 Q8_0 dot product.
//!
//! A 256-bit load of a packed group holds 8 columns × 4 k, so each i32 lane is one
//! column, in order: no fold. Per row and 32 products that is `vpsignb`, `vpmaddubsw`,
//! `vpmaddwd` and `vpaddd`; the rows' quads (the activation and its magnitude) are
//! broadcast from memory, interleaved so that a tile's rows sit at fixed offsets of one
//! pointer.
//!
//! **Widened** (weights holding -128). Both operands are sign-extended to i16
//! (`vpmovsxbw`) and multiplied with `vpmaddwd`, which sums adjacent i16 products into
//! exact i32 lanes (an i8 pair sum is at most `2 · 128² = 32768`, far inside i32). Per
//! group of 4 k, a 128-bit load of the packed block holds 4 columns × 4 k; after widening,
//! `vpmaddwd` with the broadcast activations `[a0 a1 a2 a3]×4` gives two partial sums per
//! column, which are folded with `vphaddd` at the end.
//!
//! Both equal the scalar reference exactly (wrapping modulo 2³² like it).
//!
//! The multiplies per 32 products are the same two in both forms; the signed-pairs form
//! drops the widening and the fold, and its 4-row tiles take a batched decode step's 8
//! rows in two passes where the widened form's 3-row tiles took three. Measured
//! (2026-12-07, commit 41c7c1d, 2-core AMD EPYC Zen 3, AVX2, one thread, three runs of
//! `cargo bench -p hetsched-kernels --bench w4a8 -- 'decode_rows|w4a8_vs_w8a8/w8a8'`,
//! medians of the runs' ratios), the widened form's time over the signed-pairs form's:
//! 8 rows of SmolLM2's 90 FFN matrices 1.40x from memory and 1.58x from the cache;
//! prefill GEMMs of 16 to 512 rows 1.40-1.70x.

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls
// into `#[target_feature]` functions) need `unsafe`; every block states why
// it is sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::{GROUP_BYTES, PackedI8Weights, pad_activations};
use crate::tiling::{BLOCK, MC, TILE_COLS, Tile, for_each_microtile};

/// Rows per microtile of the signed-pairs form: two accumulators a row (16 columns),
/// so 4 rows keep 8 accumulators, the block's two weight vectors and the operands in
/// the 16 registers; a batched decode step's 8 rows are two tiles.
const MR: usize = 4;

/// Rows per microtile of the widened form (four accumulators a row).
const MR_WIDENED: usize = 3;

/// How far ahead of the group multiplied the AVX2 kernels (this GEMM's signed-pairs
/// form, the matrix-vector product's two) request weight bytes: 12 KiB, a block or more
/// of SmolLM2's (9 or 24 KiB), as the blocks follow each other in memory. With a few
/// rows the products do little arithmetic per weight byte, so their loads would
/// otherwise wait on memory.
pub(crate) const PREFETCH_BYTES: usize = 12 * 1024;

/// `out[m, cols] = a[m, k] · wᵀ` (compact tile) with AVX2: the signed-pairs form when
/// the weights allow it, else the widened form. Shapes and the CPU's features are
/// checked by the caller ([`crate::tile_args::Variants::run`]).
#[target_feature(enable = "avx2")]
pub(crate) fn gemm(a: &[i8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    // Unbiased i8 bit patterns, rows zero-padded to whole groups of 4.
    let padded = pad_activations(a, m, w.k(), w.k_groups(), 0);
    if w.is_symmetric() {
        gemm_signed_pairs(&padded, m, w, cols, out);
    } else {
        gemm_widened(&padded, m, w, cols, out);
    }
}

/// The signed-pairs form over every tile (`padded`: the rows as [`gemm`] pads them).
/// Exact only for weights in `[-127, 127]`.
#[target_feature(enable = "avx2")]
fn gemm_signed_pairs(
    padded: &[u8],
    m: usize,
    w: &PackedI8Weights,
    cols: Range<usize>,
    out: &mut [i32],
) {
    // Tiles start at multiples of MR (the driver steps MR rows within runs of MC),
    // where the interleaved runs start.
    const { assert!(MC.is_multiple_of(MR)) };
    let quads = interleave_signed_quads(padded, m, w.k_groups());
    let kg = w.k_groups();
    for_each_microtile!(m, cols, out, MR, 1, |r0, R, b, _N, tile| {
        signed_pairs::<R>(&quads[r0 * kg..(r0 + R) * kg], w, b, tile)
    });
}

/// The widened form over every tile, exact for every weight.
#[target_feature(enable = "avx2")]
fn gemm_widened(padded: &[u8], m: usize, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    let kp = 4 * w.k_groups();
    for_each_microtile!(m, cols, out, MR_WIDENED, 1, |r0, R, b0, _N, tile| {
        widened::<R>(&padded[r0 * kp..(r0 + R) * kp], w, b0, tile)
    });
}

/// A row's group of 4 activations as the signed-pairs form broadcasts it: the i8 bit
/// patterns (`vpsignb`'s sign source) and their magnitudes `|a|` as u8.
#[derive(Clone, Copy, Default)]
struct SignedQuad {
    signs: u32,
    magnitudes: u32,
}

/// The padded rows (`[m, 4 · k_groups]` bytes) as [`SignedQuad`]s, rows interleaved
/// within each run of [`MR`] rows: the run starting at row `r0` (of `rows` rows, the
/// tile [`for_each_microtile!`] gives that row) holds row `r0 + r`'s group `g` at
/// `r0 · k_groups + g · rows + r`.
fn interleave_signed_quads(padded: &[u8], m: usize, k_groups: usize) -> Vec<SignedQuad> {
    let quads = padded.as_chunks::<4>().0;
    debug_assert_eq!(quads.len(), m * k_groups);
    let mut out = vec![SignedQuad::default(); m * k_groups];
    for r0 in (0..m).step_by(MR) {
        let rows = MR.min(m - r0);
        let run = &mut out[r0 * k_groups..(r0 + rows) * k_groups];
        for r in 0..rows {
            let row = &quads[(r0 + r) * k_groups..(r0 + r + 1) * k_groups];
            for (g, quad) in row.iter().enumerate() {
                run[g * rows + r] = SignedQuad {
                    signs: u32::from_le_bytes(*quad),
                    magnitudes: u32::from_le_bytes(quad.map(|v| (v as i8).unsigned_abs())),
                };
            }
        }
    }
    out
}

/// Computes `R` rows × block `b` (16 columns) into `tile` in the signed-pairs form;
/// `quads` holds the `R` rows' groups interleaved (`[k_groups, R]`, see
/// [`interleave_signed_quads`]). The block's weights must lie in `[-127, 127]`.
#[inline]
#[target_feature(enable = "avx2")]
fn signed_pairs<const R: usize>(
    quads: &[SignedQuad],
    w: &PackedI8Weights,
    b: usize,
    tile: &mut Tile<i32>,
) {
    let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
    let quads = quads.as_chunks::<R>().0;
    debug_assert_eq!(quads.len(), groups.len());
    let ones = _mm256_set1_epi16(1);
    // acc[r][h]: columns 8h..8h + 8 of row r.
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for (group, rows) in groups.iter().zip(quads) {
        let ahead = group.as_ptr().wrapping_add(PREFETCH_BYTES);
        // A hint: it never faults, so an address past the weights is harmless.
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        // SAFETY: `group` is exactly 64 readable bytes, two 32-byte loads; loadu needs
        // no alignment.
        let wv = unsafe {
            [
                _mm256_loadu_si256(group.as_ptr().cast()),
                _mm256_loadu_si256(group.as_ptr().add(32).cast()),
            ]
        };
        for (acc, quad) in acc.iter_mut().zip(rows) {
            let signs = _mm256_set1_epi32(quad.signs as i32);
            let magnitudes = _mm256_set1_epi32(quad.magnitudes as i32);
            for (acc, &wv) in acc.iter_mut().zip(&wv) {
                let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(wv, signs));
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (h, &v) in acc.iter().enumerate() {
            let dst = &mut tile[r * TILE_COLS + h * 8..r * TILE_COLS + (h + 1) * 8];
            // SAFETY: `dst` is exactly 8 writable i32; storeu needs no alignment.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        }
    }
}

/// Folds the pair sums of 8 columns: `lo` holds columns 0..4 and `hi`
/// columns 4..8, two partial sums per column; returns the 8 column sums in
/// order.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn fold_pairs(lo: __m256i, hi: __m256i) -> __m256i {
    // hadd: [c0 c1 c4 c5 | c2 c3 c6 c7] (per 128-bit lane), then reorder the
    // 64-bit quarters 0, 2, 1, 3.
    let h = _mm256_hadd_epi32(lo, hi);
    _mm256_permute4x64_epi64::<0b11_01_10_00>(h)
}

/// Computes `R` rows × one block (16 columns) into `tile` in the widened form.
/// `a_rows` holds `R` zero-padded activation rows of `4 * k_groups` bytes.
#[inline]
#[target_feature(enable = "avx2")]
fn widened<const R: usize>(a_rows: &[u8], w: &PackedI8Weights, b0: usize, tile: &mut Tile<i32>) {
    let kp = 4 * w.k_groups();
    debug_assert_eq!(a_rows.len(), R * kp);
    const { assert!(BLOCK <= TILE_COLS) };
    let block = w.block(b0);
    let rows: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| a_rows[r * kp..(r + 1) * kp].as_chunks::<4>().0);
    // acc[r][q]: quarter q = columns 4q..4q+4, two partial sums each.
    let mut acc = [[_mm256_setzero_si256(); 4]; R];
    for g in 0..w.k_groups() {
        let bytes = &block[g * GROUP_BYTES..(g + 1) * GROUP_BYTES];
        let wq: [__m256i; 4] = std::array::from_fn(|q| {
            let quarter = &bytes[q * 16..(q + 1) * 16];
            // SAFETY: `quarter` is exactly 16 readable bytes; loadu has no
            // alignment requirement.
            let v = unsafe { _mm_loadu_si128(quarter.as_ptr().cast()) };
            _mm256_cvtepi8_epi16(v)
        });
        for r in 0..R {
            // [a0 a1 a2 a3] repeated 4 times, widened to 16 × i16.
            let av = _mm256_cvtepi8_epi16(_mm_set1_epi32(i32::from_le_bytes(rows[r][g])));
            for q in 0..4 {
                acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(wq[q], av));
            }
        }
    }
    for r in 0..R {
        let halves = [
            fold_pairs(acc[r][0], acc[r][1]),
            fold_pairs(acc[r][2], acc[r][3]),
        ];
        for (h, v) in halves.into_iter().enumerate() {
            let dst = &mut tile[r * TILE_COLS + h * 8..r * TILE_COLS + (h + 1) * 8];
            // SAFETY: `dst` is exactly 8 writable i32; storeu has no
            // alignment requirement.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::I8Kernel;
    use crate::reference::gemm_i8_reference;

    /// Runs `f` with AVX2 if this CPU has it.
    fn with_avx2(f: impl FnOnce()) {
        if I8Kernel::Avx2.is_available() {
            f();
        } else {
            println!("SKIP: avx2 not supported by this CPU");
        }
    }

    /// Why weights holding -128 are routed to the widened form: the signed-pairs form
    /// gets them wrong (`vpsignb` leaves -128 as it is), and [`gemm`] does not.
    #[test]
    fn weights_holding_minus_128_take_the_widened_form() {
        with_avx2(|| {
            let (m, k, n) = (2, 8, 16);
            let a = vec![-1i8; m * k];
            let mut b = vec![5i8; n * k];
            b[3] = -128;
            let mut want = vec![0i32; m * n];
            gemm_i8_reference(&a, &b, &mut want, m, k, n);
            let packed = PackedI8Weights::pack(&b, n, k);
            assert!(!packed.is_symmetric());
            let padded = pad_activations(&a, m, k, packed.k_groups(), 0);
            let mut signed = vec![0i32; m * n];
            // SAFETY: AVX2 is available (checked by `with_avx2`).
            unsafe { gemm_signed_pairs(&padded, m, &packed, 0..n, &mut signed) };
            assert_ne!(signed[0], want[0], "-128 · -1 taken as -128 · 1");
            assert_eq!(&signed[1..n], &want[1..n]);
            let mut got = vec![0i32; m * n];
            // SAFETY: as above.
            unsafe { gemm(&a, m, &packed, 0..n, &mut got) };
            assert_eq!(got, want);
        });
    }
}
