//! Runs a plain Rust loop compiled for the widest vector unit of the running CPU.
//!
//! The crate builds for the x86-64 baseline (SSE2), so the auto-vectorized element-wise
//! kernels ([`crate::vector`], the dequantize and RMSNorm of the linears, the attention
//! softmax) use 128-bit registers. A function written with `widest!` has its body
//! compiled twice: as is, and inlined into a copy compiled with AVX-512 enabled, which
//! runs when the CPU has it and vectorizes with 512-bit registers. The arithmetic is the
//! same Rust code in the same order (Rust never contracts a multiply and an add into an
//! FMA on its own, and the vectorizer reorders no floating-point reduction), so both
//! copies give bit-identical results: `tests/vector_fast.rs` compares them with the
//! scalar references.

/// Whether the CPU has the AVX-512 subsets `widest!` compiles for (detected once).
pub fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `fn name(args) -> ret { body }` whose body runs compiled with AVX-512 when
/// [`avx512_available`], else as the baseline build. The body is an `#[inline(always)]`
/// inner function, so it is inlined (and vectorized) into the wide copy; keep it free of
/// calls that are not inlined themselves.
macro_rules! widest {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
            fn wide($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::widest::avx512_available() {
                // SAFETY: every feature `wide` is compiled for was detected on the
                // running CPU just above.
                #[allow(unsafe_code)]
                return unsafe { wide($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

pub(crate) use widest;
