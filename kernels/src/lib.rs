//! Compute kernels for hetsched. Pure functions over slices: no ECS, no queues.
//!
//! This crate is the kernel layer for LLM prefill of a llama-family model
//! (SmolLM2-135M: hidden 576, 9 query heads, 3 KV heads, head dim 64,
//! FFN 1536, RoPE base 1e5, RMSNorm eps 1e-5). It knows nothing of
//! scheduling: every function takes explicit shapes and works on the slices
//! it is given, single-threaded, so that a caller can split work across
//! threads or processors.
//!
//! # Layout conventions
//!
//! * Every matrix is **row-major**: element `(i, j)` of an `[r, c]` matrix is
//!   at index `i * c + j`. Every function documents its shapes in this
//!   `[rows, cols]` notation; slice lengths are checked with `assert!`.
//! * **Weights are stored `[n, k]`**, one row per output feature, as GGUF and
//!   llama.cpp store them. A linear layer is `out[m, n] = a[m, k] · wᵀ`.
//! * Activations of attention are `[tokens, heads, head_dim]`; KV caches are
//!   `[kv_len, n_kv_heads, head_dim]`.
//! * INT8 quantization is symmetric with range `[-127, 127]` (NPU
//!   semantics), round-to-nearest-even; see [`reference::quant`].
//!
//! # The scalar-twin rule
//!
//! Every operation has a scalar f32/i32 implementation in [`mod@reference`]
//! that is always compiled, simple and obviously correct. A fast path (SIMD)
//! exists only beside its scalar twin and is tested against it:
//!
//! * INT8 GEMM ([`gemm_i8()`]): AVX-512 VNNI, AVX2, portable scalar; tested for
//!   **exact** equality of the i32 accumulators with
//!   [`reference::gemm_i8_reference`].
//! * f32 GEMM ([`matmul_f32`]): AVX-512F, AVX2+FMA, portable scalar; tested
//!   against [`reference::matmul_f32`] with relative tolerance `1e-4` of
//!   `Σ|a·b|`.
//!
//! The best variant is picked once at runtime from [`CpuFeatures::detect`];
//! [`I8Kernel`] and [`F32Kernel`] name the variants so that tests and
//! benchmarks can force one.
//!
//! # Splitting work
//!
//! GEMMs compute a sub-range of the output on request: a **row range** is a
//! plain sub-slice of `a` and `out` (rows are contiguous), and a **column
//! range** is served by [`gemm_i8_cols`] / [`matmul_f32_packed_cols`], which
//! write a compact `[m, cols.len()]` tile.
//!
//! # Example
//!
//! Quantize, run the INT8 GEMM, dequantize, and compare with f32:
//!
//! ```rust
//! use hetsched_kernels::{PackedI8Weights, gemm_i8, reference};
//!
//! let (m, k, n) = (3, 8, 5);
//! let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
//! let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 13) as f32 - 6.0) / 8.0).collect();
//!
//! // Activations: per-tensor scale. Weights: one scale per output row.
//! let a_scale = reference::scale_for_max_abs(&a);
//! let mut a_q = vec![0i8; m * k];
//! reference::quantize_per_tensor(&a, a_scale, &mut a_q);
//! let (w_q, w_scales) = reference::quantize_weights_per_row(&w, n, k);
//!
//! // Pack once, then run the best INT8 kernel of this CPU.
//! let packed = PackedI8Weights::pack(&w_q, n, k);
//! let mut acc = vec![0i32; m * n];
//! gemm_i8(&a_q, m, &packed, &mut acc);
//!
//! // The fast kernel is exact: it equals the scalar reference.
//! let mut acc_ref = vec![0i32; m * n];
//! reference::gemm_i8_reference(&a_q, &w_q, &mut acc_ref, m, k, n);
//! assert_eq!(acc, acc_ref);
//!
//! let mut y = vec![0f32; m * n];
//! reference::dequantize_i32_acc(&acc, m, n, a_scale, &w_scales, &mut y);
//!
//! let mut y_f32 = vec![0f32; m * n];
//! reference::matmul_f32(&a, &w, &mut y_f32, m, k, n);
//! for (q, f) in y.iter().zip(&y_f32) {
//!     assert!((q - f).abs() < 0.1, "{q} vs {f}");
//! }
//! ```

pub mod attention;
pub mod attention_decode;
pub mod attention_flash;
pub mod clip_stats;
pub mod convert;
pub mod cpu;
pub mod gelu;
pub mod gemm_f32;
pub mod gemm_i8;
pub mod gemm_w4;
pub mod gemv_f32;
pub mod gemv_i8;
mod prefetch;
pub mod reference;
pub mod rope_table;
mod row_dots;
pub mod seeded;
pub mod shadow_merge;
pub mod stream_read;
mod tile_args;
mod tiling;
pub mod vector;
pub mod widest;

pub use attention::{AttentionKv, attention_causal_gqa_gemm};
pub use attention_decode::{add_weighted_rows, scaled_dots};
pub use attention_flash::{
    FlashKeys, attention_causal_gqa_flash, attention_windowed_gqa_flash, flash_supported,
};
pub use clip_stats::{
    ClipStats, SATURATION_BLOCK, clip_stats, saturated_blocks, sum_squares_within,
};
pub use cpu::{CpuFeatures, F32Kernel, I8Kernel};
pub use gelu::{gelu_tanh_mul, gelu_tanh_mul_fast};
pub use gemm_f32::{
    PackedF32Weights, matmul_f32, matmul_f32_packed, matmul_f32_packed_cols, matmul_f32_with,
};
pub use gemm_i8::{PackedI8Weights, gemm_i8, gemm_i8_cols, gemm_i8_with, matmul_w8a8};
pub use gemm_w4::{PackedW4Weights, W4Rows, gemm_w4, gemm_w4_cols, gemm_w4_with, matmul_w4a8};
pub use gemm_w4::{gemm_w4_g128_cols, matmul_w4a8_g128, quantize_groups128};
pub use gemm_w4::{gemm_w4_grouped, gemm_w4_grouped_cols, matmul_w4a8_grouped, quantize_groups};
pub use gemv_f32::{gemv_f32, gemv_f32_with};
pub use gemv_i8::{I8Vector, gemv_i8, gemv_i8_with};
pub use reference::{
    AttentionShape, RopeStyle, add_inplace, attention_causal_gqa, rms_norm, rope, silu_mul,
};
pub use rope_table::RopeTable;
pub use row_dots::chosen_row_dots;
pub use shadow_merge::{dequantize_add_shadow, shadow_scatter};
pub use stream_read::stream_read_sum;
pub use vector::{
    block_maxima, exp_approx, max_abs, max_f32, quantize_per_tensor_fast, scale_for_max_abs_fast,
    silu_mul_fast, softmax_in_place, sum_f32,
};
pub use vector::{dequantize_i32_acc_fast, rms_norm_fast};
