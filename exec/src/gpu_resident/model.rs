//! A model's f32 weights uploaded once to the device.

use std::sync::Arc;

use hetsched_gpu::{GpuContext, GpuMatrix, fold_norm, interleave_rows, reorder_rope_rows};
use hetsched_import::LlamaConfig;
use hetsched_systems::op::Projection;

use super::gpu_err;
use crate::error::ExecError;
use crate::weights::{ExecModel, LayerWeights, LinearWeights};

/// One decoder layer's weights on the device, in the layouts of the fused GEMMs
/// ([`hetsched_gpu::GemmEpilogue`]): the norms folded into the projections that follow
/// them, q/k/v stacked (q and k rows in RoPE-pair order), gate and up interleaved.
pub(super) struct GpuLayer {
    /// `[Wq; Wk; Wv] · diag(attn_norm)`, `[q + 2 kv, hidden]`.
    pub(super) qkv: GpuMatrix,
    /// Output projection `[hidden, q]`.
    pub(super) o: GpuMatrix,
    /// Gate and up rows interleaved, `· diag(ffn_norm)`, `[2 ffn, hidden]`.
    pub(super) gate_up: GpuMatrix,
    /// Down projection `[hidden, ffn]`.
    pub(super) down: GpuMatrix,
}

/// A model's weights resident on a Vulkan device, f32.
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
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel")
            .field("device", &self.context.info().name)
            .field("resident_bytes", &self.resident_bytes)
            .finish()
    }
}

/// Uploads `data` as `[rows, cols]`, counting its bytes.
fn upload(
    ctx: &GpuContext,
    bytes: &mut u64,
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<GpuMatrix, ExecError> {
    *bytes += (data.len() * 4) as u64;
    ctx.upload_f32(data, rows, cols).map_err(gpu_err)
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
    ctx: &GpuContext,
    bytes: &mut u64,
    c: &LlamaConfig,
    w: &LayerWeights,
) -> Result<GpuLayer, ExecError> {
    let (h, d) = (c.hidden, c.head_dim);
    let proj = |p: Projection| rows(w.projection(p));
    let mut qkv = reorder_rope_rows(&proj(Projection::Q)?, h, d, c.rope_style);
    qkv.extend(reorder_rope_rows(&proj(Projection::K)?, h, d, c.rope_style));
    qkv.extend(proj(Projection::V)?);
    let qkv = fold_norm(&qkv, h, &w.attn_norm);
    let gate_up = interleave_rows(&proj(Projection::Gate)?, &proj(Projection::Up)?, h);
    let gate_up = fold_norm(&gate_up, h, &w.ffn_norm);
    let (o, down) = (w.projection(Projection::O), w.projection(Projection::Down));
    Ok(GpuLayer {
        qkv: upload(ctx, bytes, &qkv, qkv.len() / h.max(1), h)?,
        o: upload(ctx, bytes, &rows(o)?, o.n(), o.k())?,
        gate_up: upload(ctx, bytes, &gate_up, gate_up.len() / h.max(1), h)?,
        down: upload(ctx, bytes, &rows(down)?, down.n(), down.k())?,
    })
}

impl GpuModel {
    /// Uploads `model`'s weights to `context`. The model must hold f32 linears
    /// ([`crate::LinearPrecision::F32`]).
    pub fn upload(context: GpuContext, model: Arc<ExecModel>) -> Result<Self, ExecError> {
        let ctx = &context;
        let mut bytes = 0u64;
        let c = &model.config;
        let layers = model
            .layers
            .iter()
            .map(|w| fused_layer(ctx, &mut bytes, c, w))
            .collect::<Result<Vec<_>, _>>()?;
        let head = &model.output;
        let output = fold_norm(&head.to_rows(), head.k(), &model.output_norm);
        let output = upload(ctx, &mut bytes, &output, head.n(), head.k())?;
        Ok(Self {
            context: Arc::new(context),
            host: model,
            layers,
            output,
            resident_bytes: bytes,
        })
    }

    /// Per layer, a zero-filled key and value cache of `positions` rows on the device,
    /// for [`super::GpuStageRunner::continuing`].
    pub fn alloc_caches(&self, positions: usize) -> Result<Vec<(GpuMatrix, GpuMatrix)>, ExecError> {
        let c = &self.host.config;
        super::tensors::alloc_caches(&self.context, c, self.layers.len(), positions)
    }

    /// Runs a one-token prefill, so that what a first prefill pays for beyond
    /// [`GpuContext::prepare`] (descriptor pools, memory blocks of activation-sized buffers,
    /// the first open command buffer) stays out of a measured run.
    pub fn warm_up(self: &Arc<Self>) -> Result<(), ExecError> {
        let options = crate::PrefillOptions {
            chunk_len: 1,
            ..crate::PrefillOptions::default()
        };
        crate::prefill_on_gpu(self, &[0], &options).map(drop)
    }
}
