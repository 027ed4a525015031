//! f32 matrix-vector product for one-token decode: `out[cols] = w[cols, :] · x`.
//!
//! A decode step multiplies one activation row by every weight matrix, so it is bound
//! by streaming the weights from memory, not by arithmetic. The GEMM microkernel run
//! with one row keeps only two accumulator chains per 32 columns and goes through the
//! tile machinery; this kernel walks one [`PackedF32Weights`] block (a `[k, 16]` panel,
//! contiguous) at a time with four independent FMA chains (k steps `p ≡ 0..3 mod 4`),
//! so the loads of one sequential stream are never waiting on an FMA's latency.
//!
//! Variants: AVX-512F, AVX2 + FMA, portable scalar (the reference twin, over the same
//! packed layout), picked like the GEMM's ([`F32Kernel`]). Every variant is tested
//! against [`crate::reference::matmul_f32`] with one row, relative tolerance `1e-4` of
//! `Σ_p |x[p] · w[j, p]|` (the summation order differs).

// reason: x86 SIMD intrinsics (loads/stores through raw pointers and calls into
// `#[target_feature]` functions) need `unsafe`; every block states why it is sound.
#![allow(unsafe_code)]

use std::ops::Range;

use crate::cpu::F32Kernel;
use crate::gemm_f32::PackedF32Weights;
use crate::tiling::BLOCK;

/// `out = w[cols, :] · x` (`out[j - cols.start]` is output column `j`) with the fastest
/// kernel of this CPU.
///
/// # Panics
/// If `x.len() != w.k()`, `cols` exceeds `0..w.n()` or `out.len() != cols.len()`.
pub fn gemv_f32(x: &[f32], w: &PackedF32Weights, cols: Range<usize>, out: &mut [f32]) {
    gemv_f32_with(F32Kernel::best(), x, w, cols, out);
}

/// [`gemv_f32`] with a chosen kernel variant (for tests and benchmarks).
///
/// # Panics
/// As [`gemv_f32`], and if the running CPU does not support `kernel`.
pub fn gemv_f32_with(
    kernel: F32Kernel,
    x: &[f32],
    w: &PackedF32Weights,
    cols: Range<usize>,
    out: &mut [f32],
) {
    assert_eq!(x.len(), w.k(), "x must be [k]");
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
    for_each_block(cols, out, |b, lanes| match kernel {
        F32Kernel::Scalar => scalar_block(x, w.block(b), lanes),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `kernel.is_available()` was asserted above.
        F32Kernel::Avx2Fma => unsafe { x86::avx2_block(x, w.block(b), lanes) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `kernel.is_available()` was asserted above.
        F32Kernel::Avx512F => unsafe { x86::avx512_block(x, w.block(b), lanes) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("x86 kernels are never available here"),
    });
}

/// Calls `block(b, lanes)` for every block `b` that `cols` touches, `lanes` being the
/// block's 16 outputs, and copies the part inside `cols` into `out` (whole blocks are
/// written in place, partial ones through a stack copy).
#[inline(always)]
pub(crate) fn for_each_block<T: Copy + Default>(
    cols: Range<usize>,
    out: &mut [T],
    mut block: impl FnMut(usize, &mut [T; BLOCK]),
) {
    let mut j = cols.start;
    while j < cols.end {
        let (b, lane) = (j / BLOCK, j % BLOCK);
        let take = (BLOCK - lane).min(cols.end - j);
        let dst = &mut out[j - cols.start..j - cols.start + take];
        match <&mut [T; BLOCK]>::try_from(&mut *dst) {
            Ok(whole) => block(b, whole),
            Err(_) => {
                let mut lanes = [T::default(); BLOCK];
                block(b, &mut lanes);
                dst.copy_from_slice(&lanes[lane..lane + take]);
            }
        }
        j += take;
    }
}

/// The scalar twin: one `[k, 16]` panel times `x`.
fn scalar_block(x: &[f32], panel: &[f32], lanes: &mut [f32; BLOCK]) {
    *lanes = [0.0; BLOCK];
    for (&xp, row) in x.iter().zip(panel.chunks_exact(BLOCK)) {
        for (l, &wv) in lanes.iter_mut().zip(row) {
            *l += xp * wv;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// One `[k, 16]` panel times `x`, four FMA chains of 16 lanes.
    ///
    /// # Safety
    /// The CPU must support avx512f.
    #[target_feature(enable = "avx512f")]
    pub(super) fn avx512_block(x: &[f32], panel: &[f32], lanes: &mut [f32; BLOCK]) {
        debug_assert_eq!(panel.len(), x.len() * BLOCK);
        let mut acc = [_mm512_setzero_ps(); 4];
        let rows = panel.as_chunks::<BLOCK>().0;
        let (x4, x_tail) = x.as_chunks::<4>();
        let (r4, r_tail) = rows.split_at(x4.len() * 4);
        for (xs, ws) in x4.iter().zip(r4.chunks_exact(4)) {
            for t in 0..4 {
                // SAFETY: `ws[t]` is exactly 16 readable f32; loadu needs no alignment.
                let wv = unsafe { _mm512_loadu_ps(ws[t].as_ptr()) };
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t]), wv, acc[t]);
            }
        }
        for (&xp, row) in x_tail.iter().zip(r_tail) {
            // SAFETY: as above.
            let wv = unsafe { _mm512_loadu_ps(row.as_ptr()) };
            acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(xp), wv, acc[0]);
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        // SAFETY: `lanes` is exactly 16 writable f32.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), sum) };
    }

    /// One `[k, 16]` panel times `x`: two k chains × two 8-lane halves.
    ///
    /// # Safety
    /// The CPU must support avx2 and fma.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2_block(x: &[f32], panel: &[f32], lanes: &mut [f32; BLOCK]) {
        debug_assert_eq!(panel.len(), x.len() * BLOCK);
        let mut acc = [[_mm256_setzero_ps(); 2]; 2];
        let rows = panel.as_chunks::<BLOCK>().0;
        let (x2, x_tail) = x.as_chunks::<2>();
        let (r2, r_tail) = rows.split_at(x2.len() * 2);
        for (xs, ws) in x2.iter().zip(r2.chunks_exact(2)) {
            for t in 0..2 {
                let xv = _mm256_set1_ps(xs[t]);
                for h in 0..2 {
                    // SAFETY: `ws[t][8h..8h + 8]` is 8 readable f32; loadu needs no
                    // alignment.
                    let wv = unsafe { _mm256_loadu_ps(ws[t][8 * h..].as_ptr()) };
                    acc[t][h] = _mm256_fmadd_ps(xv, wv, acc[t][h]);
                }
            }
        }
        for (&xp, row) in x_tail.iter().zip(r_tail) {
            let xv = _mm256_set1_ps(xp);
            for h in 0..2 {
                // SAFETY: as above.
                let wv = unsafe { _mm256_loadu_ps(row[8 * h..].as_ptr()) };
                acc[0][h] = _mm256_fmadd_ps(xv, wv, acc[0][h]);
            }
        }
        for h in 0..2 {
            let sum = _mm256_add_ps(acc[0][h], acc[1][h]);
            // SAFETY: `lanes[8h..8h + 8]` is 8 writable f32.
            unsafe { _mm256_storeu_ps(lanes[8 * h..].as_mut_ptr(), sum) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::seeded::SeededRng;

    fn check(kernel: F32Kernel, n: usize, k: usize, cols: Range<usize>) {
        let mut rng = SeededRng::new((n * 131 + k) as u64);
        let (x, w) = (rng.f32s(k), rng.f32s(n * k));
        let mut want = vec![0f32; n];
        reference::matmul_f32(&x, &w, &mut want, 1, k, n);
        let packed = PackedF32Weights::pack(&w, n, k);
        let mut got = vec![f32::NAN; cols.len()];
        gemv_f32_with(kernel, &x, &packed, cols.clone(), &mut got);
        for (i, g) in got.iter().enumerate() {
            let j = cols.start + i;
            let mag: f32 = (0..k).map(|p| (x[p] * w[j * k + p]).abs()).sum();
            let diff = (g - want[j]).abs();
            assert!(
                diff <= 1e-4 * mag + f32::MIN_POSITIVE,
                "{kernel:?} n={n} k={k} col {j}: {g} vs {}",
                want[j]
            );
        }
    }

    #[test]
    fn every_variant_matches_the_reference() {
        for kernel in F32Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            for (n, k) in [(1, 1), (16, 4), (17, 5), (40, 7), (200, 96), (576, 576)] {
                check(kernel, n, k, 0..n);
            }
            // Column ranges that start and end inside blocks.
            check(kernel, 200, 33, 5..37);
            check(kernel, 200, 33, 16..48);
            check(kernel, 200, 33, 190..200);
            check(kernel, 200, 33, 7..7);
        }
    }

    #[test]
    #[should_panic(expected = "x must be [k]")]
    fn refuses_a_wrong_length() {
        let packed = PackedF32Weights::pack(&[0.0; 8], 2, 4);
        gemv_f32(&[0.0; 3], &packed, 0..2, &mut [0.0; 2]);
    }
}
