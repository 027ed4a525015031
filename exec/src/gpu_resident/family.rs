//! The model-family steps on the device (Qwen2's QKV biases; Gemma 3's QK-norm, post-norms,
//! GELU-gated FFN, sliding window, local RoPE base and embedding scale), shared by the
//! resident prefill (`record.rs`) and the recorded decode step (`decode.rs`). The llama
//! row has none of them, and its layers record exactly the fused dispatches they would
//! without this module.
//!
//! How each runs:
//! - QKV bias and QK-norm: the q/k/v GEMM stores its plain product (rows in the file's
//!   order) and [`GpuBatch::qkv_finish`] adds the bias, normalizes each q and k head,
//!   rotates, and writes q and the cache rows (the fused epilogue rotates as it stores, so
//!   a norm cannot sit between).
//! - Post-norms: the o and down GEMMs store into a delta buffer, which is RMS-normalized
//!   with the block's post-norm weight and added into the stream with the non-finite check
//!   (`rms_norm.comp`, `add_checked.comp`); such a layer's attention never fuses o.
//! - GELU(tanh)-gated FFN: the gate/up GEMM's GELU epilogue ([`GemmEpilogue::GeluMul`]).
//! - Sliding window: the attention kernels' window ([`window`]); local layers rotate by a
//!   table of the local base ([`local_angles`]).
//! - Embedding scale: applied on the host to the rows that are uploaded
//!   ([`crate::family::scale_embeddings`]).

use std::sync::Arc;

use hetsched_gpu::{
    Elem, FusedGemm, GemmEpilogue, GpuBatch, GpuContext, GpuMatrix, QkvFinish, QkvRows,
};
use hetsched_import::{Activation, LlamaConfig};

use super::gpu_err;
use crate::error::ExecError;
use crate::steps::FamilyStep;
use crate::weights::FamilyWeights;

type Batch = GpuBatch<Arc<GpuContext>>;

/// One layer's family weights on the device (f32 whatever the linears' type).
#[derive(Default)]
pub(super) struct FamilyLayer {
    /// `[1, q + 2 kv]`: the q, k and v biases.
    bias: Option<GpuMatrix>,
    /// `[1, 2 head_dim]`: the q and the k per-head norm weights.
    qk_norm: Option<GpuMatrix>,
    /// `[1, hidden]` each: the post-attention and post-FFN norm weights.
    pub(super) post_norms: Option<[GpuMatrix; 2]>,
}

impl FamilyLayer {
    /// Uploads `w`'s weights.
    pub(super) fn upload(ctx: &GpuContext, w: &FamilyWeights) -> Result<Self, ExecError> {
        let row = |parts: &[&Vec<f32>]| {
            let data: Vec<f32> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            ctx.upload_f32(&data, 1, data.len()).map_err(gpu_err)
        };
        Ok(Self {
            bias: w
                .qkv_bias
                .as_ref()
                .map(|[q, k, v]| row(&[q, k, v]))
                .transpose()?,
            qk_norm: w.qk_norm.as_ref().map(|[q, k]| row(&[q, k])).transpose()?,
            post_norms: match &w.post_norms {
                Some([a, f]) => Some([row(&[a])?, row(&[f])?]),
                None => None,
            },
        })
    }

    /// Whether the layer's q/k/v go through [`GpuBatch::qkv_finish`] (its q/k/v weights
    /// then stay in the file's row order).
    pub(super) fn finishes_qkv(&self) -> bool {
        self.bias.is_some() || self.qk_norm.is_some()
    }

    /// `Ok` where the layer has the weights family step `step` reads, else the error
    /// naming them (a plan built for another family).
    pub(super) fn weights_for(&self, step: FamilyStep) -> Result<(), ExecError> {
        let (present, what) = match step {
            FamilyStep::QkvBias => (self.bias.is_some(), "QKV biases"),
            FamilyStep::QkNorm => (self.qk_norm.is_some(), "QK-norm weights"),
            FamilyStep::PostNorm(_) => (self.post_norms.is_some(), "post-norm weights"),
            FamilyStep::EmbedScale | FamilyStep::GeluMul => (true, ""),
        };
        present.then_some(()).ok_or_else(|| {
            ExecError::Kernel(format!(
                "the plan has a {step:?} step, and the layer has no {what}"
            ))
        })
    }
}

/// The buffers the family steps need beside a chunk's (or a decode step's) own, `rows`
/// rows each; `None` where the family has no such step.
pub(super) struct FamilyScratch {
    /// `[rows, q + 2 kv]`: the plain q/k/v product.
    pub(super) qkv: Option<GpuMatrix>,
    /// `[rows, hidden]` each: a block's output before its post-norm, and after.
    pub(super) delta: Option<(GpuMatrix, GpuMatrix)>,
}

impl FamilyScratch {
    /// Zero-filled buffers for `rows` rows of a model with `c`'s family.
    pub(super) fn alloc(ctx: &GpuContext, c: &LlamaConfig, rows: usize) -> Result<Self, ExecError> {
        let alloc = |cols| ctx.alloc_matrix(rows, cols, Elem::F32).map_err(gpu_err);
        let f = &c.family;
        Ok(Self {
            qkv: (f.qkv_bias || f.qk_norm)
                .then(|| alloc(c.n_heads * c.head_dim + 2 * c.kv_dim()))
                .transpose()?,
            delta: f
                .post_norms
                .then(|| Ok::<_, ExecError>((alloc(c.hidden)?, alloc(c.hidden)?)))
                .transpose()?,
        })
    }
}

/// The gate/up GEMM's epilogue for the family's activation.
pub(super) fn gate_up_epilogue(activation: Activation) -> GemmEpilogue<'static> {
    match activation {
        Activation::SiluGlu => GemmEpilogue::SiluMul,
        Activation::GeluTanhGlu => GemmEpilogue::GeluMul,
    }
}

/// The attention kernels' window of layer `layer`: the keys a query sees at most, 0 for a
/// global layer (all of them).
pub(super) fn window(c: &LlamaConfig, layer: usize) -> usize {
    match c.window_of(layer) {
        usize::MAX => 0,
        w => w,
    }
}

/// The RoPE table of `positions` for the local layers, where the family's local base
/// differs from the file's (Gemma 3); `None` where every layer uses the file's base.
pub(super) fn local_angles(
    ctx: &GpuContext,
    c: &LlamaConfig,
    positions: &[usize],
) -> Result<Option<GpuMatrix>, ExecError> {
    let local = c.family.local_rope_base;
    (c.family.sliding_window_period > 0 && local != c.rope_base)
        .then(|| ctx.rope_angles(positions, c.head_dim, local))
        .transpose()
        .map_err(gpu_err)
}

/// Where one layer's q/k/v GEMM reads and writes.
pub(super) struct QkvIo<'a> {
    /// The residual stream (normalized by the GEMM).
    pub(super) x: &'a GpuMatrix,
    /// The queries out.
    pub(super) q: &'a GpuMatrix,
    /// The plain product, for a layer that finishes its q/k/v.
    pub(super) scratch: &'a FamilyScratch,
    /// The layer's RoPE table.
    pub(super) angles: &'a GpuMatrix,
    /// The layer's key and value caches.
    pub(super) caches: (&'a GpuMatrix, &'a GpuMatrix),
    /// Which cache and table rows the stream's rows are.
    pub(super) rows: QkvRows<'a>,
}

/// Records a layer's q/k/v (its stacked weights and family weights): one fused GEMM that rotates and writes the caches (llama),
/// or the plain GEMM and [`GpuBatch::qkv_finish`] (a layer with biases or QK-norm).
pub(super) fn record_qkv(
    b: &mut Batch,
    c: &LlamaConfig,
    (qkv_weights, family): (&GpuMatrix, &FamilyLayer),
    io: QkvIo<'_>,
) -> Result<(), ExecError> {
    let norm_eps = Some(c.norm_eps);
    let (n_heads, n_kv_heads, style) = (c.n_heads, c.n_kv_heads, c.rope_style);
    let (angles, caches) = (io.angles, io.caches);
    if !family.finishes_qkv() {
        let heads = (n_heads, n_kv_heads);
        let epilogue = io.rows.rope_epilogue(angles, caches, heads, style);
        let f = FusedGemm { norm_eps, epilogue };
        return b.gemm_fused(io.x, qkv_weights, io.q, f).map_err(gpu_err);
    }
    let qkv = io
        .scratch
        .qkv
        .as_ref()
        .ok_or_else(|| missing("q/k/v product"))?;
    let store = FusedGemm {
        norm_eps,
        epilogue: GemmEpilogue::Store,
    };
    b.gemm_fused(io.x, qkv_weights, qkv, store)
        .map_err(gpu_err)?;
    let finish = QkvFinish {
        angles,
        caches,
        rows: io.rows,
        n_heads,
        n_kv_heads,
        style,
        bias: family.bias.as_ref(),
        norm: family.qk_norm.as_ref().map(|n| (n, c.norm_eps)),
    };
    b.qkv_finish(qkv, &finish, io.q).map_err(gpu_err)
}

fn missing(what: &str) -> ExecError {
    ExecError::Kernel(format!(
        "the resident GPU path has no {what} buffer for this family"
    ))
}

/// A block's output projection `input · wᵀ`: added into the stream `x` (raising `flags`
/// at `slot` when it breaks the numbers), or, where the block has a post-norm, stored
/// into the scratch delta for [`record_post_norm`]. Returns whether it went to the delta.
pub(super) fn record_projection(
    b: &mut Batch,
    (input, w): (&GpuMatrix, &GpuMatrix),
    post_norm: bool,
    (x, scratch): (&GpuMatrix, &FamilyScratch),
    (flags, slot): (&GpuMatrix, usize),
) -> Result<(), ExecError> {
    let (out, epilogue) = match post_norm {
        true => {
            let (delta, _) = scratch.delta.as_ref().ok_or_else(|| missing("delta"))?;
            (delta, GemmEpilogue::Store)
        }
        false => (x, GemmEpilogue::Residual { flags, slot }),
    };
    let f = FusedGemm {
        norm_eps: None,
        epilogue,
    };
    b.gemm_fused(input, w, out, f).map_err(gpu_err)
}

/// `x += rms_norm(delta) · weight` with the non-finite check at `slot`: a post-norm and
/// its block's residual add.
pub(super) fn record_post_norm(
    b: &mut Batch,
    (weight, eps): (&GpuMatrix, f32),
    (x, scratch): (&GpuMatrix, &FamilyScratch),
    (flags, slot): (&GpuMatrix, usize),
) -> Result<(), ExecError> {
    let (delta, normed) = scratch.delta.as_ref().ok_or_else(|| missing("delta"))?;
    b.rms_norm(delta, weight, eps, normed).map_err(gpu_err)?;
    b.add_assign_checked(x, normed, flags, slot)
        .map_err(gpu_err)
}

#[cfg(test)]
mod tests {
    use hetsched_systems::op::Block;

    use super::*;

    #[test]
    fn a_step_without_its_weights_is_refused_by_name() {
        let llama = FamilyLayer::default();
        for step in [
            FamilyStep::QkvBias,
            FamilyStep::QkNorm,
            FamilyStep::PostNorm(Block::Attention),
        ] {
            let err = llama.weights_for(step).unwrap_err().to_string();
            assert!(err.contains(&format!("{step:?}")), "{err}");
        }
        // Steps that read no layer weights.
        assert!(llama.weights_for(FamilyStep::EmbedScale).is_ok());
        assert!(llama.weights_for(FamilyStep::GeluMul).is_ok());
    }
}
