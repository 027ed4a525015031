//! INT8 matrix-vector product for one-token decode: `out[cols] = w[cols, :] · x` with
//! i32 accumulators, exact.
//!
//! The activation is prepared once ([`I8Vector`]: padded to whole groups of 4, and
//! biased by +128 for `vpdpbusd`, which multiplies unsigned by signed bytes) and then
//! shared by every product that reads it (a layer's Q, K and V). The AVX-512 VNNI kernel
//! walks one [`PackedI8Weights`] block (16 columns, `k_groups` groups of 64 contiguous
//! bytes) at a time with four independent accumulator chains (groups `g ≡ 0..3 mod 4`)
//! and removes the bias with the block's column sums, as the GEMM does:
//! `Σ (a + 128) · w = Σ a · w + 128 · Σ w`.
//!
//! The AVX2 kernel (a CPU without AVX-512 VNNI) takes the GEMM's signed-pairs form
//! (`gemm_i8/avx2.rs`) when the weights lie in `[-127, 127]`
//! ([`PackedI8Weights::is_symmetric`]): the activation's sign moved onto the weights
//! (`vpsignb`), its magnitude (prepared once in [`I8Vector`]) the unsigned operand of
//! `vpmaddubsw`, whose pair sums then stay within i16, and `vpmaddwd` against ones for
//! each column's exact i32: two 32-byte loads a group, 8 columns each, no fold. Weights
//! holding -128 take the widened form: the weights widened to i16 as they load
//! (`vpmovsxbw`) and multiplied with the activation quad widened once per group
//! (`vpmaddwd`); each of a block's four column quarters keeps an accumulator of column
//! pairs of partial sums, folded at the end of the block. Both prefetch `PREFETCH_BYTES`
//! (`gemm_i8/avx2.rs`) ahead: the product does little arithmetic per byte, so its loads
//! would otherwise wait on memory. Against the widened form the signed-pairs form
//! reads 1.23x the bytes per second from the cache and the same from memory (0.97x,
//! where memory bounds both; 2026-12-07, commit 41c7c1d, 2-core AMD EPYC Zen 3, AVX2,
//! one thread, three runs of `decode_gemv/w8a8` in `benches/w4a8.rs`, medians of the
//! runs' ratios).
//!
//! The scalar twin walks the same packed layout. All are tested for exact equality with
//! [`crate::reference::gemm_i8_reference`].

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::ops::Range;

use crate::cpu::I8Kernel;
use crate::gemm_i8::PackedI8Weights;
use crate::gemv_f32::for_each_block;
use crate::tiling::BLOCK;

/// Bytes of one k-group of one packed block (16 columns × 4 k).
const GROUP_BYTES: usize = BLOCK * 4;

/// One INT8 activation row prepared for [`gemv_i8`]: the values, the same values as
/// `v + 128` (u8) padded to whole groups of 4 with an encoded zero (the VNNI operand),
/// and their magnitudes `|v|` (u8) padded with 0 (the AVX2 operand). Reusable: refill
/// with [`I8Vector::set`] to avoid allocating per step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct I8Vector {
    values: Vec<i8>,
    biased: Vec<u8>,
    magnitudes: Vec<u8>,
}

impl I8Vector {
    /// Prepares `x`.
    pub fn new(x: &[i8]) -> Self {
        let mut v = Self::default();
        v.set(x);
        v
    }

    /// Refills with `x` (keeps the buffers' capacity).
    pub fn set(&mut self, x: &[i8]) {
        self.values.clear();
        self.values.extend_from_slice(x);
        self.biased.clear();
        self.biased.extend(x.iter().map(|&v| (v as u8) ^ 0x80));
        self.biased.resize(x.len().div_ceil(4) * 4, 0x80);
        self.magnitudes.clear();
        self.magnitudes.extend(x.iter().map(|&v| v.unsigned_abs()));
        self.magnitudes.resize(x.len().div_ceil(4) * 4, 0);
    }

    /// The values, `[k]`.
    pub fn values(&self) -> &[i8] {
        &self.values
    }
}

/// `out = w[cols, :] · x` in i32 (`out[j - cols.start]` is output column `j`) with the
/// fastest kernel of this CPU.
///
/// # Panics
/// If `x` has not `w.k()` values, `cols` exceeds `0..w.n()` or `out.len() != cols.len()`.
pub fn gemv_i8(x: &I8Vector, w: &PackedI8Weights, cols: Range<usize>, out: &mut [i32]) {
    gemv_i8_with(I8Kernel::best(), x, w, cols, out);
}

/// [`gemv_i8`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// As [`gemv_i8`], and if the running CPU does not support `kernel`.
pub fn gemv_i8_with(
    kernel: I8Kernel,
    x: &I8Vector,
    w: &PackedI8Weights,
    cols: Range<usize>,
    out: &mut [i32],
) {
    assert_eq!(x.values.len(), w.k(), "x must be [k]");
    assert!(
        cols.start <= cols.end && cols.end <= w.n(),
        "cols must be within 0..n"
    );
    assert_eq!(out.len(), cols.len(), "out must be [cols.len()]");
    assert!(
        kernel.is_available(),
        "kernel {} unsupported by this CPU",
        kernel.name()
    );
    match kernel {
        I8Kernel::Scalar => for_each_block(cols, out, |b, lanes| scalar_block(x, w, b, lanes)),
        #[cfg(target_arch = "x86_64")]
        I8Kernel::Avx512Vnni => for_each_block(cols, out, |b, lanes| {
            // SAFETY: `kernel.is_available()` was asserted above.
            unsafe { x86::vnni_block(&x.biased, w, b, lanes) }
        }),
        #[cfg(target_arch = "x86_64")]
        I8Kernel::Avx2 if w.is_symmetric() => for_each_block(cols, out, |b, lanes| {
            // SAFETY: `kernel.is_available()` was asserted above.
            unsafe { x86::avx2_signed_block(x, w, b, lanes) }
        }),
        #[cfg(target_arch = "x86_64")]
        I8Kernel::Avx2 => for_each_block(cols, out, |b, lanes| {
            // SAFETY: `kernel.is_available()` was asserted above.
            unsafe { x86::avx2_block(&x.biased, w, b, lanes) }
        }),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("x86 kernels are never available here"),
    }
}

/// The scalar twin over the packed layout: block `b` times `x`.
fn scalar_block(x: &I8Vector, w: &PackedI8Weights, b: usize, lanes: &mut [i32; BLOCK]) {
    *lanes = [0; BLOCK];
    let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
    for (a4, group) in x.biased.as_chunks::<4>().0.iter().zip(groups) {
        let a4 = a4.map(|v| i32::from((v ^ 0x80) as i8));
        for (acc, w4) in lanes.iter_mut().zip(group.as_chunks::<4>().0) {
            let dot = (0..4).fold(0i32, |s, t| s.wrapping_add(a4[t] * i32::from(w4[t])));
            *acc = acc.wrapping_add(dot);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BLOCK, GROUP_BYTES, I8Vector, PackedI8Weights};
    use crate::gemm_i8::avx2::{PREFETCH_BYTES, fold_pairs};

    /// Block `b` times the biased activation, four `vpdpbusd` chains, bias removed.
    ///
    /// # Safety
    /// The CPU must support avx512f, avx512bw and avx512vnni.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) fn vnni_block(
        biased: &[u8],
        w: &PackedI8Weights,
        b: usize,
        lanes: &mut [i32; BLOCK],
    ) {
        let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
        let a = biased.as_chunks::<4>().0;
        debug_assert_eq!(groups.len(), a.len());
        let mut acc = [_mm512_setzero_si512(); 4];
        let (g4, g_tail) = groups.as_chunks::<4>();
        let (a4, a_tail) = a.as_chunks::<4>();
        for (gs, xs) in g4.iter().zip(a4) {
            for t in 0..4 {
                // SAFETY: `gs[t]` is exactly 64 readable bytes; loadu needs no alignment.
                let wv = unsafe { _mm512_loadu_si512(gs[t].as_ptr().cast()) };
                let av = _mm512_set1_epi32(i32::from_le_bytes(xs[t]));
                acc[t] = _mm512_dpbusd_epi32(acc[t], av, wv);
            }
        }
        for (g, x) in g_tail.iter().zip(a_tail) {
            // SAFETY: as above.
            let wv = unsafe { _mm512_loadu_si512(g.as_ptr().cast()) };
            acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_set1_epi32(i32::from_le_bytes(*x)), wv);
        }
        let sum = _mm512_add_epi32(
            _mm512_add_epi32(acc[0], acc[1]),
            _mm512_add_epi32(acc[2], acc[3]),
        );
        // SAFETY: `col_sums(b)` is exactly 16 readable i32.
        let sums = unsafe { _mm512_loadu_si512(w.col_sums(b).as_ptr().cast()) };
        let v = _mm512_sub_epi32(sum, _mm512_slli_epi32::<7>(sums));
        // SAFETY: `lanes` is exactly 16 writable i32.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), v) };
    }

    /// Block `b` times `x` in the signed-pairs form (`gemm_i8/avx2.rs`): per group,
    /// `vpsignb` puts the quad's signs on two 32-byte loads of 8 columns each,
    /// `vpmaddubsw` multiplies them by the quad's magnitudes, `vpmaddwd` against ones
    /// adds each column's two pairs into i32. Exact for weights in `[-127, 127]` only.
    ///
    /// # Safety
    /// The CPU must support avx2.
    #[target_feature(enable = "avx2")]
    pub(super) fn avx2_signed_block(
        x: &I8Vector,
        w: &PackedI8Weights,
        b: usize,
        lanes: &mut [i32; BLOCK],
    ) {
        let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
        let biased = x.biased.as_chunks::<4>().0;
        let magnitudes = x.magnitudes.as_chunks::<4>().0;
        debug_assert!(groups.len() == biased.len() && groups.len() == magnitudes.len());
        // Columns 0..8 and 8..16, two accumulator chains each (even and odd groups).
        let mut even = [_mm256_setzero_si256(); 2];
        let mut odd = [_mm256_setzero_si256(); 2];
        let (groups2, group_tail) = groups.as_chunks::<2>();
        let (biased2, biased_tail) = biased.as_chunks::<2>();
        let (magnitudes2, magnitude_tail) = magnitudes.as_chunks::<2>();
        for ((gs, qs), ms) in groups2.iter().zip(biased2).zip(magnitudes2) {
            signed_group(&mut even, &gs[0], qs[0], ms[0]);
            signed_group(&mut odd, &gs[1], qs[1], ms[1]);
        }
        for ((group, quad), magnitude) in group_tail.iter().zip(biased_tail).zip(magnitude_tail) {
            signed_group(&mut even, group, *quad, *magnitude);
        }
        // SAFETY: `lanes` is exactly 16 writable i32; storeu needs no alignment.
        unsafe {
            let low = _mm256_add_epi32(even[0], odd[0]);
            let high = _mm256_add_epi32(even[1], odd[1]);
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), low);
            _mm256_storeu_si256(lanes.as_mut_ptr().add(8).cast(), high);
        }
    }

    /// Adds one group's products to `acc` (columns 0..8 and 8..16), the group's
    /// weights requested [`PREFETCH_BYTES`] ahead; `quad` is the activations'
    /// `v + 128`, `magnitude` their `|v|`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn signed_group(
        acc: &mut [__m256i; 2],
        group: &[i8; GROUP_BYTES],
        quad: [u8; 4],
        magnitude: [u8; 4],
    ) {
        let ahead = group.as_ptr().wrapping_add(PREFETCH_BYTES);
        // A hint: it never faults, so an address past the weights is harmless.
        _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        let signs = _mm256_set1_epi32(i32::from_le_bytes(quad) ^ i32::from_le_bytes([0x80; 4]));
        let magnitudes = _mm256_set1_epi32(i32::from_le_bytes(magnitude));
        let ones = _mm256_set1_epi16(1);
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `group` is exactly 64 readable bytes, and `32 h + 32 <= 64`;
            // loadu needs no alignment.
            let wv = unsafe { _mm256_loadu_si256(group.as_ptr().add(32 * h).cast()) };
            let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(wv, signs));
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
        }
    }

    /// Block `b` times the activation (`biased`: `v + 128`, padded to whole groups),
    /// weights widened to i16 as they load, exact for every weight.
    ///
    /// # Safety
    /// The CPU must support avx2.
    #[target_feature(enable = "avx2")]
    pub(super) fn avx2_block(
        biased: &[u8],
        w: &PackedI8Weights,
        b: usize,
        lanes: &mut [i32; BLOCK],
    ) {
        let groups = w.block(b).as_chunks::<GROUP_BYTES>().0;
        let a = biased.as_chunks::<4>().0;
        debug_assert_eq!(groups.len(), a.len());
        // Columns 4q..4q + 4 of each group, as pairs of i32 per column (k 0 + 1, 2 + 3).
        let mut quarters = [_mm256_setzero_si256(); 4];
        for (group, quad) in groups.iter().zip(a) {
            let ahead = group.as_ptr().wrapping_add(PREFETCH_BYTES);
            // A hint: it never faults, so an address past the weights is harmless.
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            // The quad's 4 values as i16, repeated for the 4 columns of a quarter.
            let unbiased = i32::from_le_bytes(*quad) ^ i32::from_le_bytes([0x80; 4]);
            let av = _mm256_cvtepi8_epi16(_mm_set1_epi32(unbiased));
            for (q, acc) in quarters.iter_mut().enumerate() {
                // SAFETY: `group` is exactly 64 readable bytes, and `16 q + 16 <= 64`;
                // loadu needs no alignment.
                let wq = unsafe { _mm_loadu_si128(group.as_ptr().add(16 * q).cast()) };
                let wv = _mm256_cvtepi8_epi16(wq);
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(wv, av));
            }
        }
        let low = fold_pairs(quarters[0], quarters[1]);
        let high = fold_pairs(quarters[2], quarters[3]);
        // SAFETY: `lanes` is exactly 16 writable i32; storeu needs no alignment.
        unsafe {
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), low);
            _mm256_storeu_si256(lanes.as_mut_ptr().add(8).cast(), high);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::seeded::SeededRng;

    /// Checks `kernel` on a drawn `[n, k]` problem twice: with a weight of -128, and
    /// with the weights clamped to `[-127, 127]` (the AVX2 kernel's two forms).
    fn check(kernel: I8Kernel, n: usize, k: usize, cols: Range<usize>) {
        let mut rng = SeededRng::new((n * 31 + k) as u64);
        let (x, mut w) = (rng.i8s(k), rng.i8s(n * k));
        // The extremes, where a bias or sign error would show.
        w[0] = -128;
        let x = if k > 1 {
            [&[-128i8, 127][..], &x[2..]].concat()
        } else {
            x
        };
        let clamped: Vec<i8> = w.iter().map(|&v| v.max(-127)).collect();
        for w in [w, clamped] {
            let mut want = vec![0i32; n];
            reference::gemm_i8_reference(&x, &w, &mut want, 1, k, n);
            let packed = PackedI8Weights::pack(&w, n, k);
            let mut got = vec![i32::MIN; cols.len()];
            gemv_i8_with(kernel, &I8Vector::new(&x), &packed, cols.clone(), &mut got);
            let symmetric = packed.is_symmetric();
            assert_eq!(
                got,
                want[cols.clone()],
                "{kernel:?} n={n} k={k} {symmetric}"
            );
        }
    }

    #[test]
    fn the_largest_pair_sums_are_exact() {
        // ±2 · 128 · 127 and ±2 · 127² are the signed-pairs form's largest i16 pair sums;
        // -128 weights must leave it.
        let (n, k) = (33, 67);
        for kernel in I8Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            for xv in [-128i8, -127, -1, 0, 127] {
                for wv in [-128i8, -127, 127] {
                    let (x, w) = (vec![xv; k], vec![wv; n * k]);
                    let want = vec![i32::from(xv) * i32::from(wv) * k as i32; n];
                    let packed = PackedI8Weights::pack(&w, n, k);
                    let mut got = vec![0; n];
                    gemv_i8_with(kernel, &I8Vector::new(&x), &packed, 0..n, &mut got);
                    assert_eq!(got, want, "{kernel:?} x={xv} w={wv}");
                }
            }
        }
    }

    #[test]
    fn every_variant_equals_the_reference_exactly() {
        for kernel in I8Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            for (n, k) in [
                (1, 1),
                (16, 4),
                (17, 5),
                (40, 7),
                (200, 96),
                (576, 576),
                (64, 1536),
            ] {
                check(kernel, n, k, 0..n);
            }
            check(kernel, 200, 33, 5..37);
            check(kernel, 200, 33, 16..48);
            check(kernel, 200, 33, 190..200);
            check(kernel, 200, 33, 7..7);
        }
    }

    #[test]
    fn a_refilled_vector_equals_a_new_one() {
        let mut v = I8Vector::new(&[1, 2, 3, 4, 5]);
        v.set(&[-7, 9]);
        assert_eq!(v, I8Vector::new(&[-7, 9]));
        assert_eq!(v.values(), &[-7, 9]);
        assert_eq!(v.magnitudes, [7, 9, 0, 0]);
        v.set(&[-128]);
        assert_eq!(v.magnitudes, [128, 0, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "x must be [k]")]
    fn refuses_a_wrong_length() {
        let packed = PackedI8Weights::pack(&[0; 8], 2, 4);
        gemv_i8(&I8Vector::new(&[0; 3]), &packed, 0..2, &mut [0; 2]);
    }
}
