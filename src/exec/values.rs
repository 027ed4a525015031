//! Activations between operators, and the linear layer in both precisions.
//!
//! The W8A8 path follows the NPU's semantics: one scale per activation tensor (the
//! tensor's max |x| / 127), activations saturated to ±127, INT32 accumulation, the
//! per-row weight scales applied only when the accumulators are dequantized. No
//! per-group scales: the NPU cannot do them.

use hetsched_kernels::reference::dequantize_i32_acc;
use hetsched_kernels::{
    gemm_i8, matmul_f32_packed, quantize_per_tensor_fast, scale_for_max_abs_fast,
};
use rayon::prelude::*;

use super::weights::{LinearPrecision, LinearWeights};

/// An input of a linear layer.
#[derive(Debug, Clone)]
pub enum Act {
    /// f32 rows (the float path).
    F32(Vec<f32>),
    /// INT8 rows with one per-tensor scale.
    Int8 {
        /// Quantized values.
        q: Vec<i8>,
        /// Scale: real value = q × scale.
        scale: f32,
    },
}

/// An output of a linear layer before dequantization.
#[derive(Debug, Clone)]
pub enum LinearOut {
    /// f32 rows.
    F32(Vec<f32>),
    /// INT32 accumulators and the activation scale they were computed with.
    Int32 {
        /// `[rows, n]` accumulators.
        acc: Vec<i32>,
        /// The input's per-tensor scale.
        a_scale: f32,
    },
}

/// Rows handed to one worker: small enough that two threads share a chunk's GEMM,
/// large enough that every task streams the weights efficiently.
const ROWS_PER_TASK: usize = 16;

/// The quantize operator: per-tensor INT8 for W8A8, a pass-through for f32.
pub fn quantize(x: Vec<f32>, precision: LinearPrecision) -> Act {
    match precision {
        LinearPrecision::F32 => Act::F32(x),
        LinearPrecision::W8a8 => {
            let scale = scale_for_max_abs_fast(&x);
            let mut q = vec![0i8; x.len()];
            quantize_per_tensor_fast(&x, scale, &mut q);
            Act::Int8 { q, scale }
        }
    }
}

/// `x[rows, k] · wᵀ`, split by rows over the current thread pool.
pub fn linear(x: &Act, rows: usize, w: &LinearWeights) -> Result<LinearOut, String> {
    let (k, n) = (w.k(), w.n());
    match (x, w) {
        (Act::F32(a), LinearWeights::F32(packed)) => {
            check_len(a.len(), rows * k)?;
            let mut out = vec![0f32; rows * n];
            out.par_chunks_mut(ROWS_PER_TASK * n)
                .zip(a.par_chunks(ROWS_PER_TASK * k))
                .for_each(|(o, a)| matmul_f32_packed(a, a.len() / k, packed, o));
            Ok(LinearOut::F32(out))
        }
        (Act::Int8 { q, scale }, LinearWeights::Int8 { packed, .. }) => {
            check_len(q.len(), rows * k)?;
            let mut acc = vec![0i32; rows * n];
            acc.par_chunks_mut(ROWS_PER_TASK * n)
                .zip(q.par_chunks(ROWS_PER_TASK * k))
                .for_each(|(o, a)| gemm_i8(a, a.len() / k, packed, o));
            Ok(LinearOut::Int32 {
                acc,
                a_scale: *scale,
            })
        }
        _ => Err("activation and weight precisions differ".into()),
    }
}

/// The dequantize operator: INT32 accumulators × activation scale × row scale.
pub fn dequantize(out: LinearOut, w: &LinearWeights) -> Result<Vec<f32>, String> {
    match (out, w) {
        (LinearOut::F32(y), LinearWeights::F32(_)) => Ok(y),
        (LinearOut::Int32 { acc, a_scale }, LinearWeights::Int8 { scales, .. }) => {
            let n = scales.len();
            check_len(acc.len() % n.max(1), 0)?;
            let mut y = vec![0f32; acc.len()];
            dequantize_i32_acc(&acc, acc.len() / n.max(1), n, a_scale, scales, &mut y);
            Ok(y)
        }
        _ => Err("accumulator and weight precisions differ".into()),
    }
}

fn check_len(found: usize, expected: usize) -> Result<(), String> {
    if found == expected {
        Ok(())
    } else {
        Err(format!(
            "activation has {found} elements where {expected} were expected"
        ))
    }
}
