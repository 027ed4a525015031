//! The dispatch of every packed GEMM (`gemm_f32`, `gemm_i8`, `gemm_w4` and its
//! activation-scaled twins): the argument checks made before a kernel variant is picked
//! (one place, one set of messages), and the pick of a family's variant.

// reason: the SIMD variants are `#[target_feature]` functions, called once the CPU's
// features are checked.
#![allow(unsafe_code)]

use std::ops::Range;

use crate::cpu::{F32Kernel, I8Kernel};

/// The instruction sets every GEMM family has a variant for, slowest first.
#[derive(Clone, Copy)]
pub(crate) enum Tier {
    /// Portable scalar code.
    Scalar,
    /// 256-bit AVX2 (with FMA for f32).
    Avx2,
    /// 512-bit AVX-512 (with VNNI for the integer products).
    Avx512,
}

/// A kernel variant a dispatcher may be asked for.
pub(crate) trait Variant: Copy {
    /// Whether this CPU runs it.
    fn available(self) -> bool;
    /// Its name, for the panic message.
    fn label(self) -> &'static str;
    /// Its instruction set.
    fn tier(self) -> Tier;
}

/// Implements [`Variant`] for a kernel enum from its variants of each [`Tier`], slowest
/// first.
macro_rules! impl_variant {
    ($kernel:ident: $scalar:ident, $avx2:ident, $avx512:ident) => {
        impl Variant for $kernel {
            fn available(self) -> bool {
                self.is_available()
            }
            fn label(self) -> &'static str {
                self.name()
            }
            fn tier(self) -> Tier {
                match self {
                    $kernel::$scalar => Tier::Scalar,
                    $kernel::$avx2 => Tier::Avx2,
                    $kernel::$avx512 => Tier::Avx512,
                }
            }
        }
    };
}

impl_variant!(F32Kernel: Scalar, Avx2Fma, Avx512F);
impl_variant!(I8Kernel: Scalar, Avx2, Avx512Vnni);

/// A variant's product: `out[m, cols]` (a compact tile) of activations `a[m, k]` through
/// packed weights `W`, shapes checked by the dispatcher.
pub(crate) type TileFn<A, W, O> = fn(&[A], usize, &W, Range<usize>, &mut [O]);

/// A SIMD variant's product: a [`TileFn`] compiled with `#[target_feature]`, so unsafe
/// to call on a CPU without those features.
#[cfg(target_arch = "x86_64")]
pub(crate) type SimdTileFn<A, W, O> = unsafe fn(&[A], usize, &W, Range<usize>, &mut [O]);

/// One GEMM family's variants, one per [`Tier`] (the x86 ones exist on x86-64 only,
/// where alone a [`Variant`] of theirs is available). Each SIMD variant is compiled for
/// exactly the features its family's [`Variant`] of that tier is available with.
pub(crate) struct Variants<A, W, O> {
    pub(crate) scalar: TileFn<A, W, O>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) avx2: SimdTileFn<A, W, O>,
    #[cfg(target_arch = "x86_64")]
    pub(crate) avx512: SimdTileFn<A, W, O>,
}

/// The [`Variants`] of one family from the paths of its scalar, AVX2 and AVX-512
/// products (the last two named on x86-64 only).
macro_rules! variants {
    ($scalar:path, $avx2:path, $avx512:path) => {
        $crate::tile_args::Variants {
            scalar: $scalar,
            #[cfg(target_arch = "x86_64")]
            avx2: $avx2,
            #[cfg(target_arch = "x86_64")]
            avx512: $avx512,
        }
    };
}

pub(crate) use variants;

impl<A, W, O> Variants<A, W, O> {
    /// Checks the arguments ([`check_tile`]; `kn` is `w`'s `(k, n)`), that this CPU runs
    /// `kernel`, and runs `kernel`'s variant.
    #[track_caller]
    pub(crate) fn run(
        &self,
        kernel: impl Variant,
        (a, m): (&[A], usize),
        (w, kn): (&W, (usize, usize)),
        cols: Range<usize>,
        out: &mut [O],
    ) {
        check_tile(a.len(), m, kn, &cols, out.len(), kernel);
        match kernel.tier() {
            Tier::Scalar => (self.scalar)(a, m, w, cols, out),
            // SAFETY: `check_tile` asserted that this CPU runs `kernel`, whose tier's
            // variant is compiled for no feature beyond those `kernel` needs.
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => unsafe { (self.avx2)(a, m, w, cols, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => unsafe { (self.avx512)(a, m, w, cols, out) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("x86 kernels are never available here"),
        }
    }
}

/// Panics unless `a` holds `m` rows of `k` (`kn = (k, n)`), `cols` lies within `0..n`,
/// `out` holds `m` rows of `cols.len()`, and `kernel` runs on this CPU.
#[track_caller]
pub(crate) fn check_tile(
    a_len: usize,
    m: usize,
    (k, n): (usize, usize),
    cols: &Range<usize>,
    out_len: usize,
    kernel: impl Variant,
) {
    assert_eq!(a_len, m * k, "a must be [m, k]");
    assert!(
        cols.start <= cols.end && cols.end <= n,
        "cols must be within 0..n"
    );
    assert_eq!(out_len, m * cols.len(), "out must be [m, cols.len()]");
    assert!(
        kernel.available(),
        "kernel {} unsupported by this CPU",
        kernel.label()
    );
}
