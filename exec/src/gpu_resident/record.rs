//! Recording one [`Step`] of a stage into the open command buffer, one method per kind of
//! step, with the checks that every value read was written.

use std::sync::Arc;

use hetsched_gpu::{AttentionShape, GpuBatch, GpuContext};
use hetsched_systems::op::{NormSite, Projection};

use super::tensors::{ChunkTensors, KvRows, NonFiniteFlags, RunState, Value};
use super::{GpuStageRunner, gpu_err};
use crate::error::ExecError;
use crate::steps::Step;

impl GpuStageRunner {
    /// Records one step; returns whether it reads the logits back.
    pub(super) fn record(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        step: Step,
        layer: usize,
        chunk: usize,
    ) -> Result<bool, ExecError> {
        let t = &mut state.chunks[chunk];
        match step {
            Step::Embed => self.embed(b, t)?,
            Step::Norm(site) => self.norm(b, t, site, layer)?,
            // f32 linears: the activation is read as it is.
            Step::QuantizeNormed(_) => {
                t.take(Value::Normed, step, chunk)?;
                t.act = Some(Value::Normed);
            }
            Step::QuantizeAttention => {
                t.take(Value::Attn, step, chunk)?;
                t.act = Some(Value::Attn);
            }
            // An f32 model has no outliers and so no shadow stages; a plan that has one was
            // not built for this runner.
            Step::Shadow(site) => {
                return Err(ExecError::UnsupportedOp {
                    op: site.op_name(),
                    stage: "the resident GPU path (f32 only)".into(),
                });
            }
            Step::Linear(p) => self.linear(b, state, p, layer, chunk)?,
            // f32 queries need no dequantization; they must exist all the same.
            Step::DequantizeQkv => t.require(Value::Q, step, chunk)?,
            Step::Rope => {
                t.require(Value::Q, step, chunk)?;
                let c = &self.model.host.config;
                b.rope(&t.q, &t.angles, c.n_heads, c.rope_style)
                    .map_err(gpu_err)?;
                self.write_kv(b, state, layer, chunk)?;
            }
            Step::Attention => self.attention(b, state, layer, chunk)?,
            Step::DequantizeO => {
                t.take(Value::O, step, chunk)?;
                t.delta = Some(Value::O);
            }
            Step::DequantizeDown => {
                t.take(Value::Down, step, chunk)?;
                t.delta = Some(Value::Down);
            }
            Step::Residual => {
                let d = t
                    .delta
                    .take()
                    .ok_or_else(|| ExecError::missing(step, chunk, "delta"))?;
                // The feed-forward output joins the stream at the start of the next
                // layer's stage (or the head's), as on the CPU path.
                let (block_layer, block) = match d {
                    Value::Down => (layer.saturating_sub(1), 1),
                    _ => (layer, 0),
                };
                let flags = NonFiniteFlags {
                    layers: self.model.layers.len(),
                };
                let slot = flags.slot(chunk, block_layer, block);
                b.add_assign_checked(&t.x, t.matrix(d), &state.nonfinite, slot)
                    .map_err(gpu_err)?;
            }
            Step::SiluMul => {
                t.take(Value::Gate, step, chunk)?;
                t.take(Value::Up, step, chunk)?;
                b.silu_mul(&t.gate, &t.up, &t.hidden).map_err(gpu_err)?;
                t.act = Some(Value::Hidden);
            }
            // The resident runner computes the llama family only (`prefill` refuses others).
            Step::Family(family) => {
                return Err(ExecError::UnsupportedOp {
                    op: format!("{family:?}"),
                    stage: "the resident GPU path (llama family only)".into(),
                });
            }
            Step::LmHead => {
                self.lm_head(b, state, chunk)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Uploads the chunk's token embeddings into its residual (the only upload of a run).
    fn embed(&self, b: &mut GpuBatch<Arc<GpuContext>>, t: &ChunkTensors) -> Result<(), ExecError> {
        let hidden = self.model.host.config.hidden;
        let embd = &self.model.host.token_embd;
        let mut x = Vec::with_capacity(t.rows * hidden);
        for &id in &self.tokens[t.pos0..t.pos0 + t.rows] {
            let row = id as usize;
            x.extend_from_slice(&embd[row * hidden..(row + 1) * hidden]);
        }
        b.write(&t.x, 0, &x).map_err(gpu_err)
    }

    /// RMS norm of the residual at `site`; the final norm of a prefill that wants the last
    /// token's logits only normalizes that token.
    fn norm(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        t: &mut ChunkTensors,
        site: NormSite,
        layer: usize,
    ) -> Result<(), ExecError> {
        let eps = self.model.host.config.norm_eps;
        let weight = match site {
            NormSite::Attention => &self.layer(layer)?.attn_norm,
            NormSite::Ffn => &self.layer(layer)?.ffn_norm,
            NormSite::Final => &self.model.output_norm,
        };
        if site == NormSite::Final && !self.all_logits {
            b.copy_rows(&t.x, t.rows - 1..t.rows, &t.last, 0)
                .map_err(gpu_err)?;
            b.rms_norm(&t.last, weight, eps, &t.last_normed)
                .map_err(gpu_err)?;
            t.head_on_last = true;
        } else {
            b.rms_norm(&t.x, weight, eps, &t.normed).map_err(gpu_err)?;
        }
        t.ready |= Value::Normed.bit();
        Ok(())
    }

    /// Projection `p` of the current activation; keys and values wait, pending, until a
    /// stage needs them in the cache (see [`Self::write_kv`]).
    fn linear(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        p: Projection,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        let t = &mut state.chunks[chunk];
        let act = t
            .act
            .ok_or_else(|| ExecError::missing(Step::Linear(p), chunk, "activation"))?;
        let w = self.layer(layer)?.linear(p);
        b.matmul_f32(t.matrix(act), w, t.projection_out(p))
            .map_err(gpu_err)?;
        match Value::output_of(p) {
            Some(v) => t.ready |= v.bit(),
            None => {
                let rows = &mut state.kv[layer][chunk];
                let (mut k, mut v) = match *rows {
                    KvRows::Pending { k, v } => (k, v),
                    _ => (false, false),
                };
                k |= p == Projection::K;
                v |= p == Projection::V;
                *rows = KvRows::Pending { k, v };
            }
        }
        Ok(())
    }

    /// Causal attention of the chunk's queries over the cache, after writing the rows of
    /// every chunk up to this one that are not in it yet.
    fn attention(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        for earlier in 0..=chunk {
            self.write_kv(b, state, layer, earlier)?;
        }
        let c = &self.model.host.config;
        let t = &mut state.chunks[chunk];
        t.take(Value::Q, Step::Attention, chunk)?;
        let shape = AttentionShape {
            n_tokens: t.rows,
            pos0: t.pos0,
            kv_len: t.pos0 + t.rows,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let (k_cache, v_cache) = &state.caches[layer];
        b.attention(&t.q, (k_cache, v_cache), &shape, &t.attn)
            .map_err(gpu_err)?;
        t.ready |= Value::Attn.bit();
        Ok(())
    }

    /// The output head into the logits, and their read-back.
    fn lm_head(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        chunk: usize,
    ) -> Result<(), ExecError> {
        let t = &mut state.chunks[chunk];
        t.take(Value::Normed, Step::LmHead, chunk)?;
        let x = if t.head_on_last {
            &t.last_normed
        } else {
            &t.normed
        };
        if x.rows() != state.logits.rows() {
            return Err(ExecError::Kernel(format!(
                "the head of chunk {chunk} has {} rows, the logits {}: only the last chunk runs the head",
                x.rows(),
                state.logits.rows()
            )));
        }
        b.matmul_f32(x, &self.model.output, &state.logits)
            .map_err(gpu_err)?;
        b.read(&state.logits, 0..state.logits.rows())
            .map_err(gpu_err)
    }

    /// Rotates chunk `chunk`'s keys of `layer` and copies its keys and values into the
    /// cache, once (see the module note).
    fn write_kv(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        state: &mut RunState,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        match state.kv[layer][chunk] {
            KvRows::Written => return Ok(()),
            KvRows::Pending { k: true, v: true } => {}
            _ => {
                return Err(ExecError::missing(
                    Step::Attention,
                    chunk,
                    "keys and values",
                ));
            }
        }
        let c = &self.model.host.config;
        let t = &state.chunks[chunk];
        let (k_cache, v_cache) = &state.caches[layer];
        b.rope(&t.k, &t.angles, c.n_kv_heads, c.rope_style)
            .map_err(gpu_err)?;
        b.copy_rows(&t.k, 0..t.rows, k_cache, t.pos0)
            .map_err(gpu_err)?;
        b.copy_rows(&t.v, 0..t.rows, v_cache, t.pos0)
            .map_err(gpu_err)?;
        state.kv[layer][chunk] = KvRows::Written;
        Ok(())
    }
}
