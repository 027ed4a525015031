//! Runtime CPU feature detection and kernel-variant selection.

use std::sync::OnceLock;

/// The x86 features the fast paths use, detected at runtime.
///
/// On non-x86 targets every field is `false`. The fields are public for
/// reporting; the dispatchers never trust a caller-built value and always
/// check [`CpuFeatures::detect`] before running a SIMD variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 (256-bit integer SIMD).
    pub avx2: bool,
    /// FMA3 (fused multiply-add).
    pub fma: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word instructions.
    pub avx512bw: bool,
    /// AVX-512 VNNI (`vpdpbusd`).
    pub avx512vnni: bool,
}

impl CpuFeatures {
    /// Detects the features of the running CPU (once; later calls return the
    /// cached value).
    pub fn detect() -> Self {
        static DETECTED: OnceLock<CpuFeatures> = OnceLock::new();
        *DETECTED.get_or_init(Self::detect_uncached)
    }

    /// A value with no feature: only the scalar variants qualify.
    pub fn none() -> Self {
        Self::default()
    }

    #[cfg(target_arch = "x86_64")]
    fn detect_uncached() -> Self {
        Self {
            avx2: is_x86_feature_detected!("avx2"),
            fma: is_x86_feature_detected!("fma"),
            avx512f: is_x86_feature_detected!("avx512f"),
            avx512bw: is_x86_feature_detected!("avx512bw"),
            avx512vnni: is_x86_feature_detected!("avx512vnni"),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect_uncached() -> Self {
        Self::none()
    }
}

/// Variants of the W8A8 INT8 GEMM ([`crate::gemm_i8()`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum I8Kernel {
    /// Portable scalar loop over the packed layout.
    Scalar,
    /// AVX2: `vpmaddubsw` on `|a|` and the weights carrying `a`'s sign
    /// (`vpsignb`) when every weight lies in `[-127, 127]`, else both operands
    /// sign-extended to i16 (`vpmovsxbw`) for `vpmaddwd`; exact either way.
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` (u8 × i8) with the +128 activation bias and a
    /// per-column correction; needs avx512f + avx512bw + avx512vnni.
    Avx512Vnni,
}

impl I8Kernel {
    /// Every variant, slowest first.
    pub const ALL: [Self; 3] = [Self::Scalar, Self::Avx2, Self::Avx512Vnni];

    /// Whether a CPU with features `f` can run this variant.
    pub fn is_supported_by(self, f: &CpuFeatures) -> bool {
        match self {
            Self::Scalar => true,
            Self::Avx2 => f.avx2,
            Self::Avx512Vnni => f.avx512f && f.avx512bw && f.avx512vnni,
        }
    }

    /// Whether the running CPU can run this variant.
    pub fn is_available(self) -> bool {
        self.is_supported_by(&CpuFeatures::detect())
    }

    /// The fastest variant supported by `f`.
    pub fn best_for(f: &CpuFeatures) -> Self {
        *Self::ALL
            .iter()
            .rev()
            .find(|v| v.is_supported_by(f))
            .unwrap_or(&Self::Scalar)
    }

    /// The fastest variant of the running CPU (chosen once).
    pub fn best() -> Self {
        static BEST: OnceLock<I8Kernel> = OnceLock::new();
        *BEST.get_or_init(|| Self::best_for(&CpuFeatures::detect()))
    }

    /// Short name for logs and test output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// Variants of the f32 GEMM ([`crate::matmul_f32`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum F32Kernel {
    /// Portable scalar loop over the packed layout.
    Scalar,
    /// AVX2 + FMA3, 256-bit.
    Avx2Fma,
    /// AVX-512F, 512-bit.
    Avx512F,
}

impl F32Kernel {
    /// Every variant, slowest first.
    pub const ALL: [Self; 3] = [Self::Scalar, Self::Avx2Fma, Self::Avx512F];

    /// Whether a CPU with features `f` can run this variant.
    pub fn is_supported_by(self, f: &CpuFeatures) -> bool {
        match self {
            Self::Scalar => true,
            Self::Avx2Fma => f.avx2 && f.fma,
            Self::Avx512F => f.avx512f,
        }
    }

    /// Whether the running CPU can run this variant.
    pub fn is_available(self) -> bool {
        self.is_supported_by(&CpuFeatures::detect())
    }

    /// The fastest variant supported by `f`.
    pub fn best_for(f: &CpuFeatures) -> Self {
        *Self::ALL
            .iter()
            .rev()
            .find(|v| v.is_supported_by(f))
            .unwrap_or(&Self::Scalar)
    }

    /// The fastest variant of the running CPU (chosen once).
    pub fn best() -> Self {
        static BEST: OnceLock<F32Kernel> = OnceLock::new();
        *BEST.get_or_init(|| Self::best_for(&CpuFeatures::detect()))
    }

    /// Short name for logs and test output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2Fma => "avx2-fma",
            Self::Avx512F => "avx512f",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_features_means_scalar() {
        let f = CpuFeatures::none();
        assert_eq!(I8Kernel::best_for(&f), I8Kernel::Scalar);
        assert_eq!(F32Kernel::best_for(&f), F32Kernel::Scalar);
    }

    #[test]
    fn selection_prefers_widest_supported() {
        let avx2 = CpuFeatures {
            avx2: true,
            fma: true,
            ..CpuFeatures::none()
        };
        assert_eq!(I8Kernel::best_for(&avx2), I8Kernel::Avx2);
        assert_eq!(F32Kernel::best_for(&avx2), F32Kernel::Avx2Fma);
        // VNNI needs bw too.
        let partial = CpuFeatures {
            avx512f: true,
            avx512vnni: true,
            ..avx2
        };
        assert_eq!(I8Kernel::best_for(&partial), I8Kernel::Avx2);
        assert_eq!(F32Kernel::best_for(&partial), F32Kernel::Avx512F);
        let full = CpuFeatures {
            avx512bw: true,
            ..partial
        };
        assert_eq!(I8Kernel::best_for(&full), I8Kernel::Avx512Vnni);
    }

    #[test]
    fn detected_best_is_available() {
        println!("detected: {:?}", CpuFeatures::detect());
        assert!(I8Kernel::best().is_available());
        assert!(F32Kernel::best().is_available());
        assert!(I8Kernel::Scalar.is_available());
    }
}
