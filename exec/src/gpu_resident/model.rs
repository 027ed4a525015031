//! A model's weights uploaded once to the device, f32 or rounded to f16.

use std::sync::Arc;

use hetsched_gpu::{GpuContext, GpuMatrix, fold_norm, interleave_rows, reorder_rope_rows};
use hetsched_import::LlamaConfig;
use hetsched_systems::op::Projection;

use super::family::FamilyLayer;
use super::gpu_err;
use crate::error::ExecError;
use crate::weights::{ExecModel, LayerWeights, LinearWeights};

/// One decoder layer's weights on the device, in the layouts of the fused GEMMs
/// ([`hetsched_gpu::GemmEpilogue`]): the norms folded into the projections that follow
/// them, q/k/v stacked (q and k rows in RoPE-pair order, or in the file's order for a
/// layer whose q/k/v are finished apart, see `family.rs`), gate and up interleaved.
pub(super) struct GpuLayer {
    /// `[Wq; Wk; Wv] · diag(attn_norm)`, `[q + 2 kv, hidden]`.
    pub(super) qkv: GpuMatrix,
    /// Output projection `[hidden, q]`.
    pub(super) o: GpuMatrix,
    /// Gate and up rows interleaved, `· diag(ffn_norm)`, `[2 ffn, hidden]`.
    pub(super) gate_up: GpuMatrix,
    /// Down projection `[hidden, ffn]`.
    pub(super) down: GpuMatrix,
    /// The weights of the family's steps (none for llama).
    pub(super) family: FamilyLayer,
}

/// The element type of the resident weights: f32 (the reference), or f16 for the fused
/// GEMMs' f16 kernels (activations rounded to f16 as the GEMMs stage them, f32 sums; on
/// tensor cores where the device has KHR cooperative matrices,
/// [`GpuContext::fused_gemm_on_tensor_cores`]). Attention, norms and the residual stream
/// stay as they are either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResidentWeights {
    /// f32 weights and GEMMs.
    #[default]
    F32,
    /// f16 weights, f16 GEMM inputs, f32 sums.
    F16,
}

/// A model's weights resident on a Vulkan device.
pub struct GpuModel {
    /// The device.
    pub context: Arc<GpuContext>,
    /// The host model (configuration, token embeddings; its weights are not used).
    pub host: Arc<ExecModel>,
    pub(super) layers: Vec<GpuLayer>,
    /// The head `· diag(output_norm)`.
    pub(super) output: GpuMatrix,
    /// Bytes of weights uploaded.
    pub resident_bytes: u64,
    /// Their element type.
    pub weights: ResidentWeights,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("device", &self.context.info().name)
            .field("resident_bytes", &self.resident_bytes)
            .finish()
    }
}

/// Where weights go and as what: the device, the element type, the bytes so far.
struct Uploader<'a> {
    ctx: &'a GpuContext,
    weights: ResidentWeights,
    bytes: u64,
}

impl Uploader<'_> {
    /// Uploads `data` as `[rows, cols]` of the chosen type, counting its bytes.
    fn upload(&mut self, data: &[f32], rows: usize, cols: usize) -> Result<GpuMatrix, ExecError> {
        let m = match self.weights {
            ResidentWeights::F32 => self.ctx.upload_f32(data, rows, cols),
            ResidentWeights::F16 => self.ctx.upload_f32_as_f16(data, rows, cols),
        }
        .map_err(gpu_err)?;
        self.bytes += (m.rows() * m.ld() * 4 / m.elem().per_word()) as u64;
        Ok(m)
    }
}

/// The f32 rows `[n, k]` of a linear, or the error for INT8 weights.
fn rows(w: &LinearWeights) -> Result<Vec<f32>, ExecError> {
    match w {
        LinearWeights::F32(packed) => Ok(packed.to_rows()),
        LinearWeights::Int8 { .. } | LinearWeights::Int4 { .. } => Err(ExecError::Gpu(
            "the resident GPU path runs f32 linears: load the model with --precision f32".into(),
        )),
    }
}

/// One layer's weights in the fused GEMMs' layouts (see [`GpuLayer`]).
fn fused_layer(
    up: &mut Uploader<'_>,
    c: &LlamaConfig,
    w: &LayerWeights,
) -> Result<GpuLayer, ExecError> {
    let (h, d) = (c.hidden, c.head_dim);
    let proj = |p: Projection| rows(w.projection(p));
    let family = FamilyLayer::upload(up.ctx, &w.family)?;
    // The fused epilogue rotates pairs at adjacent columns; `qkv_finish` reads the file's
    // order.
    let rope_rows = |p: Projection| -> Result<Vec<f32>, ExecError> {
        match family.finishes_qkv() {
            true => proj(p),
            false => Ok(reorder_rope_rows(&proj(p)?, h, d, c.rope_style)),
        }
    };
    let mut qkv = rope_rows(Projection::Q)?;
    qkv.extend(rope_rows(Projection::K)?);
    qkv.extend(proj(Projection::V)?);
    let qkv = fold_norm(&qkv, h, &w.attn_norm);
    let gate_up = interleave_rows(&proj(Projection::Gate)?, &proj(Projection::Up)?, h);
    let gate_up = fold_norm(&gate_up, h, &w.ffn_norm);
    let (o, down) = (w.projection(Projection::O), w.projection(Projection::Down));
    Ok(GpuLayer {
        qkv: up.upload(&qkv, qkv.len() / h.max(1), h)?,
        o: up.upload(&rows(o)?, o.n(), o.k())?,
        gate_up: up.upload(&gate_up, gate_up.len() / h.max(1), h)?,
        down: up.upload(&rows(down)?, down.n(), down.k())?,
        family,
    })
}

impl GpuModel {
    /// Uploads `model`'s weights to `context`, f32. The model must hold f32 linears
    /// ([`crate::LinearPrecision::F32`]).
    pub fn upload(context: GpuContext, model: Arc<ExecModel>) -> Result<Self, ExecError> {
        Self::upload_as(context, model, ResidentWeights::F32)
    }

    /// [`GpuModel::upload`] with the weights stored as `weights` says (the host's f32
    /// weights rounded to nearest for f16).
    pub fn upload_as(
        context: GpuContext,
        model: Arc<ExecModel>,
        weights: ResidentWeights,
    ) -> Result<Self, ExecError> {
        let mut up = Uploader {
            ctx: &context,
            weights,
            bytes: 0,
        };
        let c = &model.config;
        let layers = model
            .layers
            .iter()
            .map(|w| fused_layer(&mut up, c, w))
            .collect::<Result<Vec<_>, _>>()?;
        let head = &model.output;
        let output = fold_norm(&head.to_rows(), head.k(), &model.output_norm);
        let output = up.upload(&output, head.n(), head.k())?;
        let resident_bytes = up.bytes;
        Ok(Self {
            context: Arc::new(context),
            host: model,
            layers,
            output,
            resident_bytes,
            weights,
        })
    }

    /// Per layer, a zero-filled key and value cache of `positions` rows on the device,
    /// for [`super::GpuStageRunner::continuing`].
    pub fn alloc_caches(&self, positions: usize) -> Result<Vec<(GpuMatrix, GpuMatrix)>, ExecError> {
        let c = &self.host.config;
        super::tensors::alloc_caches(&self.context, c, self.layers.len(), positions)
    }
}
