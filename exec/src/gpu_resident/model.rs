//! A model's f32 weights uploaded once to the device.

use std::sync::Arc;

use hetsched_gpu::{GpuContext, GpuMatrix};
use hetsched_systems::op::Projection;

use super::gpu_err;
use crate::error::ExecError;
use crate::weights::{ExecModel, LinearWeights};

/// One decoder layer's weights on the device (linears `[n, k]` f32, norms `[1, hidden]`).
pub(super) struct GpuLayer {
    pub(super) attn_norm: GpuMatrix,
    pub(super) ffn_norm: GpuMatrix,
    /// By [`Projection::index`].
    pub(super) linears: [GpuMatrix; Projection::COUNT],
}

impl GpuLayer {
    pub(super) fn linear(&self, p: Projection) -> &GpuMatrix {
        &self.linears[p.index()]
    }
}

/// A model's weights resident on a Vulkan device, f32.
pub struct GpuModel {
    /// The device.
    pub context: Arc<GpuContext>,
    /// The host model (configuration, token embeddings; its weights are not used).
    pub host: Arc<ExecModel>,
    pub(super) layers: Vec<GpuLayer>,
    pub(super) output_norm: GpuMatrix,
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

fn upload_linear(
    ctx: &GpuContext,
    bytes: &mut u64,
    w: &LinearWeights,
) -> Result<GpuMatrix, ExecError> {
    match w {
        LinearWeights::F32(packed) => upload(ctx, bytes, &packed.to_rows(), packed.n(), packed.k()),
        LinearWeights::Int8 { .. } | LinearWeights::Int4 { .. } => Err(ExecError::Gpu(
            "the resident GPU path runs f32 linears: load the model with --precision f32".into(),
        )),
    }
}

impl GpuModel {
    /// Uploads `model`'s weights to `context`. The model must hold f32 linears
    /// ([`crate::LinearPrecision::F32`]).
    pub fn upload(context: GpuContext, model: Arc<ExecModel>) -> Result<Self, ExecError> {
        let ctx = &context;
        let mut bytes = 0u64;
        let hidden = model.config.hidden;
        let mut layers = Vec::with_capacity(model.layers.len());
        for w in &model.layers {
            let b = &mut bytes;
            layers.push(GpuLayer {
                attn_norm: upload(ctx, b, &w.attn_norm, 1, hidden)?,
                ffn_norm: upload(ctx, b, &w.ffn_norm, 1, hidden)?,
                linears: Projection::ALL
                    .into_iter()
                    .map(|p| upload_linear(ctx, b, w.projection(p)))
                    .collect::<Result<Vec<_>, _>>()?
                    .try_into()
                    .expect("one linear per projection"),
            });
        }
        let output_norm = upload(ctx, &mut bytes, &model.output_norm, 1, hidden)?;
        let head = &model.output;
        let output = upload(ctx, &mut bytes, &head.to_rows(), head.n(), head.k())?;
        Ok(Self {
            context: Arc::new(context),
            host: model,
            layers,
            output_norm,
            output,
            resident_bytes: bytes,
        })
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
