//! Scalar reference implementations of every operation.
//!
//! These are always compiled, single-threaded and written for clarity, not
//! speed. Each fast path of the crate is tested against its twin here, and
//! operations without a fast path (norm, RoPE, attention, element-wise) are
//! used directly from here.

pub mod attention;
pub mod elementwise;
pub mod gemm_i8;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod rope;

pub use attention::{
    AttentionShape, add_weighted_rows, attention_causal_gqa, attention_windowed_gqa, scaled_dots,
};
pub use elementwise::{add_inplace, silu, silu_mul};
pub use gemm_i8::{dequantize_i32_acc, gemm_i8_reference};
pub use matmul::{matmul_f32, matmul_f32_cols};
pub use norm::rms_norm;
pub use quant::{
    dequantize, quantize_per_tensor, quantize_value, quantize_weights_per_row, scale_for_max_abs,
};
pub use rope::{RopeStyle, rope};
