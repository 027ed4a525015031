//! Runs a plain Rust loop compiled for the widest vector unit of the running CPU.
//!
//! The crate builds for the x86-64 baseline (SSE2), so the auto-vectorized element-wise
//! kernels ([`crate::vector`], the dequantize and RMSNorm of the linears, the attention
//! softmax and a decode step's attention products) use 128-bit registers. A function
//! written with `widest!` has its body compiled three times: as is, and inlined into
//! copies compiled with AVX-512 and with AVX2 (and FMA) enabled, the widest of which the
//! CPU has runs, vectorized with 512- or 256-bit registers. The arithmetic is the same
//! Rust code in the same order (Rust never contracts a multiply and an add into an FMA on
//! its own, an explicit `mul_add` rounds once in every copy, and the vectorizer reorders
//! no floating-point reduction), so all copies give bit-identical results:
//! `tests/vector_fast.rs` compares them with the scalar references. The AVX2 copy is
//! what a CPU without AVX-512 runs (AMD before Zen 4, most Intel desktops and laptops):
//! there the baseline copy took a decode step's attention at half the vector width.

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

/// Whether the CPU has AVX2 and FMA, which `widest!`'s middle copy is compiled for
/// ([`crate::cpu::CpuFeatures`], detected once).
pub fn avx2_available() -> bool {
    let cpu = crate::cpu::CpuFeatures::detect();
    cpu.avx2 && cpu.fma
}

/// Defines `fn name(args) -> ret { body }` whose body runs compiled with AVX-512 when
/// [`avx512_available`], else with AVX2 and FMA when [`avx2_available`], else as the
/// baseline build. The body is an `#[inline(always)]` inner function, so it is inlined
/// (and vectorized) into both wider copies; keep it free of calls that are not inlined
/// themselves.
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
            #[target_feature(enable = "avx2,fma")]
            fn middle($($arg: $ty),*) $(-> $ret)? {
                body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::widest::avx512_available() {
                // SAFETY: every feature `wide` is compiled for was detected on the
                // running CPU just above.
                #[allow(unsafe_code)]
                return unsafe { wide($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::widest::avx2_available() {
                // SAFETY: every feature `middle` is compiled for was detected on the
                // running CPU just above.
                #[allow(unsafe_code)]
                return unsafe { middle($($arg),*) };
            }
            body($($arg),*)
        }
    };
}

pub(crate) use widest;
