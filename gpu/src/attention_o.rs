//! Attention with the output projection folded in (`attention_flash_khr_o.comp` on tensor
//! cores, `attention_flash_o.comp` elsewhere): one dispatch computes a chunk's causal
//! attention and adds `attention · W_oᵀ` into the residual stream, so that a llama layer is
//! four dispatches (q/k/v, attention + o, gate/up, down). Each workgroup that holds a head's
//! final output tile multiplies it by that head's columns of W_o and adds the product into
//! the stream with float atomics (why atomics and not a fixed-order sum:
//! `attention_o_khr.glsl`); [`crate::GpuOptions::unfused_output_projection`] keeps the
//! separate, deterministic GEMM.

use hetsched_kernels::reference::AttentionShape;

use crate::attention::{FLASH_MAX_HEAD_DIM, FusedOutput, record_attention};
use crate::batch::{GpuBatch, check_attention, dense};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{GpuError, Result, shape};
use crate::pipelines::Shader;

/// The head dimension the tensor-core variant needs (its W_o slices are whole 16x16
/// fragments of one head).
const KHR_HEAD_DIM: usize = 64;

/// What [`GpuBatch::attention_into_residual`] adds the attention output into.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOutput<'a> {
    /// The output projection `[n_out, n_heads · head_dim]`, f32 or f16 (f16 only where
    /// attention runs on tensor cores).
    pub w_o: &'a GpuMatrix,
    /// The residual stream `[n_tokens, n_out]`, f32: it gains `attention · w_oᵀ`.
    pub residual: &'a GpuMatrix,
    /// A dense f32 matrix of flags: `flags[slot] = 1.0` when a head's product is NaN or
    /// infinite (as the checked residual add of [`crate::GemmEpilogue::Residual`]).
    pub flags: &'a GpuMatrix,
    /// Which flag.
    pub slot: usize,
}

impl GpuContext {
    /// Whether attention of shape `s` can add its output projection (weights of type
    /// `w_o`) into the residual stream itself: a flash kernel applies (head_dim <= 64), the
    /// device adds floats atomically (`shaderBufferFloat32AtomicAdd`),
    /// [`crate::GpuOptions::unfused_output_projection`] is off, and on tensor cores the
    /// weights are f16 and head_dim is 64 (f32 weights there keep the separate f32 GEMM,
    /// the reference).
    pub fn attention_fuses_output(&self, s: &AttentionShape, w_o: Elem) -> bool {
        // A few tokens run the decode kernel and the few-row GEMM for o: one workgroup per
        // head and token, where the fused kernels' 32-row tiles would be almost empty.
        if self.unfused_output_projection
            || crate::attention::decode_attention_fits(s)
            || !self.info.float_atomic_add
            || s.head_dim > FLASH_MAX_HEAD_DIM
            || !matches!(w_o, Elem::F32 | Elem::F16)
        {
            return false;
        }
        if self.attention_on_tensor_cores(s) {
            w_o == Elem::F16 && s.head_dim == KHR_HEAD_DIM && Shader::AttentionFlashKhrO.compiled()
        } else {
            true
        }
    }
}

const OP: &str = "attention_into_residual";

/// Checks the projection's operands against the attention shape.
fn check_output(s: &AttentionShape, o: &AttentionOutput<'_>) -> Result<()> {
    let (w, x) = (o.w_o, o.residual);
    if w.cols() != s.n_heads * s.head_dim || w.rows() == 0 {
        return Err(shape(
            OP,
            format!(
                "w_o is [{}, {}], expected [n_out, {} heads x {}]",
                w.rows(),
                w.cols(),
                s.n_heads,
                s.head_dim
            ),
        ));
    }
    if x.elem() != Elem::F32 || x.rows() != s.n_tokens || x.cols() != w.rows() {
        return Err(shape(
            OP,
            format!(
                "residual is [{}, {}] {:?}, expected [{}, {}] f32",
                x.rows(),
                x.cols(),
                x.elem(),
                s.n_tokens,
                w.rows()
            ),
        ));
    }
    dense(OP, "flags", o.flags, o.flags.rows(), o.flags.cols())?;
    if o.slot >= o.flags.rows() * o.flags.cols() {
        return Err(shape(OP, format!("flag slot {} past the flags", o.slot)));
    }
    Ok(())
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// [`GpuBatch::attention`] into `out`, and in the same dispatch `o.residual +=
    /// out · o.w_oᵀ` (see the module note). [`GpuError::Unsupported`] where
    /// [`GpuContext::attention_fuses_output`] says no: record the attention and a
    /// [`GpuBatch::gemm_fused`] with the residual epilogue instead.
    pub fn attention_into_residual(
        &mut self,
        q: &GpuMatrix,
        caches: (&GpuMatrix, &GpuMatrix),
        s: &AttentionShape,
        out: &GpuMatrix,
        o: AttentionOutput<'_>,
    ) -> Result<()> {
        check_attention(q, caches, s, out)?;
        check_output(s, &o)?;
        let job = self.job_mut();
        if !job.ctx().attention_fuses_output(s, o.w_o.elem()) {
            return Err(GpuError::Unsupported {
                kernel: "attention with the output projection folded in",
                feature: "a flash kernel (head_dim <= 64), float atomic adds, and f16 W_o \
                          with head_dim 64 on tensor cores",
            });
        }
        let fused = FusedOutput {
            bufs: [&o.w_o.buf, &o.residual.buf, &o.flags.buf],
            o_cols: o.w_o.rows(),
            w_ld_words: o.w_o.ld_words(),
            w_f16: o.w_o.elem() == Elem::F16,
            x_ld: o.residual.ld(),
            slot: o.slot,
        };
        let (k, v) = caches;
        record_attention(job, [&q.buf, &k.buf, &v.buf, &out.buf], s, Some(&fused), 0)
    }
}
