//! Recording one [`Step`] of a stage into the open command buffer: the resident runner's
//! [`StepBackend`], one method per kind of step, with the checks that every value read was
//! written.
//!
//! The steps are the CPU interpreter's, but the device runs them fused
//! ([`hetsched_gpu::GpuBatch::gemm_fused`]): a norm records nothing and is folded into the
//! projections after it (their weights carry its scale); q, k and v are one GEMM, recorded
//! at the last of the three, that also rotates q and k and writes k and v into the layer's
//! cache; gate and up are one GEMM that writes SiLU(gate)·up; the output and down
//! projections add into the residual stream, so the residual step only checks the order.
//! Where the device can ([`GpuContext::attention_fuses_output`]: float atomics, a flash
//! kernel, f16 weights on tensor cores), the attention dispatch also adds the output
//! projection into the stream ([`GpuBatch::attention_into_residual`]) and the o step
//! records nothing. A llama layer is thus 4 dispatches per chunk (3 GEMMs and attention
//! with o), else 5 (4 GEMMs and the attention), where the unfused kernels took 15 to 19
//! and 2 copies. A family's steps (Qwen2's biases, Gemma 3's QK-norm, post-norms, GELU,
//! sliding window and local RoPE base) add the dispatches `family.rs` describes; their
//! steps in the walk record nothing of their own except the post-norm.

use std::sync::Arc;

use hetsched_gpu::{
    AttentionOutput, AttentionShape, FusedGemm, GemmEpilogue, GpuBatch, GpuContext, QkvRows,
};
use hetsched_import::Activation;
use hetsched_systems::op::{Block, NormSite, Projection};
use hetsched_systems::shadow::ShadowSite;

use super::family::{
    QkvIo, gate_up_epilogue, record_post_norm, record_projection, record_qkv, window,
};
use super::tensors::{ChunkTensors, KvRows, NonFiniteFlags, RunState, Value};
use super::{GpuStageRunner, gpu_err};
use crate::error::ExecError;
use crate::steps::{FamilyStep, Step};
use crate::walk::StepBackend;

type Batch = GpuBatch<Arc<GpuContext>>;

/// The projections each fused GEMM groups, and the norm its weights fold in.
const QKV: (u8, NormSite) = (0b111, NormSite::Attention);
const GATE_UP: (u8, NormSite) = (0b11, NormSite::Ffn);

fn bit(p: Projection) -> u8 {
    match p {
        Projection::Q | Projection::Gate => 1,
        Projection::K | Projection::Up => 2,
        _ => 4,
    }
}

/// One stage of one chunk being recorded into the open command buffer: the resident
/// runner's [`StepBackend`].
pub(super) struct Recorder<'a> {
    pub(super) runner: &'a GpuStageRunner,
    pub(super) batch: &'a mut Batch,
    pub(super) state: &'a mut RunState,
    /// The stage's decoder layer (the number of layers for the head).
    pub(super) layer: usize,
    pub(super) chunk: usize,
    /// Whether a step read the logits back (the head did).
    pub(super) reads_logits: bool,
}

impl Recorder<'_> {
    fn tensors(&mut self) -> &mut ChunkTensors {
        &mut self.state.chunks[self.chunk]
    }

    /// Consumes `consumed` (written by an earlier step) and makes `act` the input of the
    /// next projections.
    fn activation(&mut self, step: Step, consumed: Value, act: Value) -> Result<(), ExecError> {
        let chunk = self.chunk;
        let t = self.tensors();
        t.take(consumed, step, chunk)?;
        t.act = Some(act);
        Ok(())
    }

    /// Consumes the output of projection `value`, which its GEMM already added into the
    /// stream, and leaves it for the residual step to account for.
    fn delta(&mut self, step: Step, value: Value) -> Result<(), ExecError> {
        let chunk = self.chunk;
        let t = self.tensors();
        t.take(value, step, chunk)?;
        t.delta = Some(value);
        Ok(())
    }

    /// The queries exist (written by the q/k/v GEMM, which also rotated them).
    fn queries(&mut self, step: Step) -> Result<(), ExecError> {
        let chunk = self.chunk;
        self.tensors().require(Value::Q, step, chunk)
    }

    /// The gated activation `step` (of `activation`), which the gate/up GEMM's epilogue
    /// computed: the family's activation must be the step's.
    fn gated(&mut self, step: Step, activation: Activation) -> Result<(), ExecError> {
        let family = self.runner.model.host.config.family;
        if family.activation != activation {
            return Err(ExecError::UnsupportedOp {
                op: format!("{step:?}"),
                stage: format!("the resident GPU path of a {} model", family.arch),
            });
        }
        let chunk = self.chunk;
        let t = self.tensors();
        t.take(Value::Gate, step, chunk)?;
        t.take(Value::Up, step, chunk)?;
        t.act = Some(Value::Hidden);
        Ok(())
    }
}

impl StepBackend for Recorder<'_> {
    type Error = ExecError;

    fn embed(&mut self) -> Result<(), ExecError> {
        let t = &self.state.chunks[self.chunk];
        self.runner.embed(self.batch, t)
    }

    /// Records nothing: the norm is folded into the projections after it.
    fn norm(&mut self, site: NormSite) -> Result<(), ExecError> {
        let t = self.tensors();
        t.norm = Some(site);
        t.ready |= Value::Normed.bit();
        Ok(())
    }

    /// f32 linears: the activation is read as it is.
    fn quantize_normed(&mut self, site: ShadowSite) -> Result<(), ExecError> {
        self.activation(Step::QuantizeNormed(site), Value::Normed, Value::Normed)
    }

    /// f32 linears: the activation is read as it is.
    fn quantize_attention(&mut self) -> Result<(), ExecError> {
        self.activation(Step::QuantizeAttention, Value::Attn, Value::Attn)
    }

    fn linear(&mut self, p: Projection) -> Result<(), ExecError> {
        let (layer, chunk) = (self.layer, self.chunk);
        self.runner.linear(self.batch, self.state, p, layer, chunk)
    }

    /// f32 queries need no dequantization; they must exist all the same.
    fn dequantize_qkv(&mut self) -> Result<(), ExecError> {
        self.queries(Step::DequantizeQkv)
    }

    /// The q/k/v GEMM rotated the queries and keys; the queries must exist all the same.
    fn rope(&mut self) -> Result<(), ExecError> {
        self.queries(Step::Rope)
    }

    fn attention(&mut self) -> Result<(), ExecError> {
        let (layer, chunk) = (self.layer, self.chunk);
        self.runner.attention(self.batch, self.state, layer, chunk)
    }

    fn dequantize_o(&mut self) -> Result<(), ExecError> {
        self.delta(Step::DequantizeO, Value::O)
    }

    fn dequantize_down(&mut self) -> Result<(), ExecError> {
        self.delta(Step::DequantizeDown, Value::Down)
    }

    /// Records nothing: the projection's GEMM already added its output into the stream.
    fn residual(&mut self) -> Result<(), ExecError> {
        let chunk = self.chunk;
        let t = self.tensors();
        if t.unnormed {
            return Err(ExecError::missing(Step::Residual, chunk, "post-norm"));
        }
        t.delta
            .take()
            .ok_or_else(|| ExecError::missing(Step::Residual, chunk, "delta"))?;
        Ok(())
    }

    /// Records nothing: the gate/up GEMM wrote SiLU(gate)·up.
    fn silu_mul(&mut self) -> Result<(), ExecError> {
        self.gated(Step::SiluMul, Activation::SiluGlu)
    }

    /// Refused: an f32 model has no outliers and so no shadow stages; a plan that has one
    /// was not built for this runner.
    fn shadow(&mut self, site: ShadowSite) -> Result<(), ExecError> {
        Err(ExecError::UnsupportedOp {
            op: site.op_name(),
            stage: "the resident GPU path (f32 only)".into(),
        })
    }

    fn lm_head(&mut self) -> Result<(), ExecError> {
        self.runner.lm_head(self.batch, self.state, self.chunk)?;
        self.reads_logits = true;
        Ok(())
    }

    /// Records nothing: the embed step's upload carries the scale.
    fn embed_scale(&mut self) -> Result<(), ExecError> {
        Ok(())
    }

    /// Records nothing: the q/k/v step added the biases; the queries must exist.
    fn qkv_bias(&mut self) -> Result<(), ExecError> {
        let step = FamilyStep::QkvBias;
        self.runner.layer(self.layer)?.family.weights_for(step)?;
        self.queries(Step::Family(step))
    }

    /// Records nothing: the q/k/v step normalized q and k; the queries must exist.
    fn qk_norm(&mut self) -> Result<(), ExecError> {
        let step = FamilyStep::QkNorm;
        self.runner.layer(self.layer)?.family.weights_for(step)?;
        self.queries(Step::Family(step))
    }

    fn post_norm(&mut self, block: Block) -> Result<(), ExecError> {
        let (layer, chunk) = (self.layer, self.chunk);
        self.runner
            .post_norm(self.batch, self.state, (layer, chunk), block)
    }

    /// Records nothing: the gate/up GEMM wrote GELU(gate)·up.
    fn gelu_mul(&mut self) -> Result<(), ExecError> {
        self.gated(Step::Family(FamilyStep::GeluMul), Activation::GeluTanhGlu)
    }
}

impl GpuStageRunner {
    /// Uploads the chunk's token embeddings into its residual (the only upload of a run),
    /// times the family's embedding scale.
    fn embed(&self, b: &mut Batch, t: &ChunkTensors) -> Result<(), ExecError> {
        let hidden = self.model.host.config.hidden;
        let embd = &self.model.host.token_embd;
        let mut x = Vec::with_capacity(t.rows * hidden);
        for &id in &self.tokens[t.pos0..t.pos0 + t.rows] {
            let row = id as usize;
            x.extend_from_slice(&embd[row * hidden..(row + 1) * hidden]);
        }
        crate::family::scale_embeddings(&self.model.host.config, &mut x);
        b.write(&t.x, 0, &x).map_err(gpu_err)
    }

    /// Projection `p`: q/k/v and gate/up wait for the rest of their group, then run as one
    /// fused GEMM on the normalised stream; o and down add into the stream.
    fn linear(
        &self,
        b: &mut Batch,
        state: &mut RunState,
        p: Projection,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        let step = Step::Linear(p);
        let w = self.layer(layer)?;
        let flags = NonFiniteFlags {
            layers: self.model.layers.len(),
        };
        let t = &mut state.chunks[chunk];
        let act = t
            .act
            .ok_or_else(|| ExecError::missing(step, chunk, "activation"))?;
        let (want, input) = match p {
            Projection::O => (Value::Attn, &t.attn),
            Projection::Down => (Value::Hidden, &t.hidden),
            _ => (Value::Normed, &t.x),
        };
        if act != want {
            return Err(ExecError::missing(step, chunk, want.name()));
        }
        let (group, done) = match p {
            // Attention already added it into the stream.
            Projection::O if t.o_fused => {
                t.o_fused = false;
                t.ready |= Value::O.bit();
                return Ok(());
            }
            Projection::O | Projection::Down => {
                let (weights, block, done) = match p {
                    Projection::O => (&w.o, 0, Value::O),
                    _ => (&w.down, 1, Value::Down),
                };
                let post_norm = w.family.post_norms.is_some();
                let stream = (&t.x, &t.family);
                let check = (&state.nonfinite, flags.slot(chunk, layer, block));
                record_projection(b, (input, weights), post_norm, stream, check)?;
                t.unnormed = post_norm;
                t.ready |= done.bit();
                return Ok(());
            }
            Projection::Q | Projection::K | Projection::V => (QKV, Value::Q),
            Projection::Gate | Projection::Up => (GATE_UP, Value::Gate),
        };
        let (all, site) = group;
        if t.norm != Some(site) {
            return Err(ExecError::Kernel(format!(
                "the resident GPU path folds the {site:?} norm into {}; chunk {chunk}'s stage normalised {:?} before it",
                p.label(),
                t.norm
            )));
        }
        t.pending |= bit(p);
        if t.pending != all {
            return Ok(());
        }
        t.pending = 0;
        let c = &self.model.host.config;
        if done == Value::Q {
            self.qkv(b, state, layer, chunk)?;
        } else {
            let f = FusedGemm {
                norm_eps: Some(c.norm_eps),
                epilogue: gate_up_epilogue(c.family.activation),
            };
            b.gemm_fused(&t.x, &w.gate_up, &t.hidden, f)
                .map_err(gpu_err)?;
            t.ready |= Value::Gate.bit() | Value::Up.bit();
        }
        Ok(())
    }

    /// The chunk's q/k/v GEMM: q rotated into its buffer, keys rotated and values written
    /// into the layer's cache at the chunk's rows.
    fn qkv(
        &self,
        b: &mut Batch,
        state: &mut RunState,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        let c = &self.model.host.config;
        let t = &mut state.chunks[chunk];
        let (k_cache, v_cache) = &state.caches[layer];
        let io = QkvIo {
            x: &t.x,
            q: &t.q,
            scratch: &t.family,
            angles: t.angles_of(c, layer),
            caches: (k_cache, v_cache),
            rows: QkvRows::From(t.pos0),
        };
        let w = self.layer(layer)?;
        record_qkv(b, c, (&w.qkv, &w.family), io)?;
        let t = &mut state.chunks[chunk];
        t.ready |= Value::Q.bit();
        state.kv[layer][chunk] = KvRows::Written;
        Ok(())
    }

    /// Causal attention of the chunk's queries over the cache (through the layer's sliding
    /// window, if any), whose rows of every chunk up to this one must have been written by
    /// their q/k/v GEMMs. The output projection joins the dispatch where the device can
    /// and the layer has no window and no post-norm.
    fn attention(
        &self,
        b: &mut Batch,
        state: &mut RunState,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        if let Some(missing) = (0..=chunk).find(|&j| state.kv[layer][j] != KvRows::Written) {
            return Err(ExecError::missing(
                Step::Attention,
                missing,
                "keys and values",
            ));
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
        let w = self.layer(layer)?;
        let w_o = &w.o;
        let window = window(c, layer);
        let plain_o = window == 0 && w.family.post_norms.is_none();
        if plain_o
            && self
                .model
                .context
                .attention_fuses_output(&shape, w_o.elem())
        {
            let flags = NonFiniteFlags {
                layers: self.model.layers.len(),
            };
            let o = AttentionOutput {
                w_o,
                residual: &t.x,
                flags: &state.nonfinite,
                slot: flags.slot(chunk, layer, 0),
            };
            b.attention_into_residual(&t.q, (k_cache, v_cache), &shape, &t.attn, o)
                .map_err(gpu_err)?;
            t.o_fused = true;
        } else {
            b.attention_windowed(&t.q, (k_cache, v_cache), &shape, window, &t.attn)
                .map_err(gpu_err)?;
        }
        t.ready |= Value::Attn.bit();
        Ok(())
    }

    /// A block's post-norm (stage of `layer` and `chunk`), which also adds the block's
    /// output into the stream: the attention's of the stage's layer, or the feed-forward's
    /// of the layer before (its down projection ran in that layer's stage).
    fn post_norm(
        &self,
        b: &mut Batch,
        state: &mut RunState,
        (layer, chunk): (usize, usize),
        block: Block,
    ) -> Result<(), ExecError> {
        let step = Step::Family(FamilyStep::PostNorm(block));
        let (owner, index) = match block {
            Block::Attention => (Some(layer), 0),
            Block::FeedForward => (layer.checked_sub(1), 1),
        };
        let owner = owner.ok_or_else(|| ExecError::missing(step, chunk, "feed-forward"))?;
        let weights = self.layer(owner)?.family.post_norms.as_ref();
        let weight = &weights.ok_or_else(|| ExecError::missing(step, chunk, "post-norm"))?[index];
        let flags = NonFiniteFlags {
            layers: self.model.layers.len(),
        };
        let t = &mut state.chunks[chunk];
        if !t.unnormed {
            return Err(ExecError::missing(step, chunk, "block output"));
        }
        let eps = self.model.host.config.norm_eps;
        let check = (&state.nonfinite, flags.slot(chunk, owner, index));
        record_post_norm(b, (weight, eps), (&t.x, &t.family), check)?;
        t.unnormed = false;
        Ok(())
    }

    /// The output head (the final norm folded in) into the logits, and their read-back;
    /// a prefill that wants the last token's logits only copies that token's row first.
    fn lm_head(&self, b: &mut Batch, state: &mut RunState, chunk: usize) -> Result<(), ExecError> {
        let t = &mut state.chunks[chunk];
        t.take(Value::Normed, Step::LmHead, chunk)?;
        if t.norm != Some(NormSite::Final) {
            return Err(ExecError::missing(Step::LmHead, chunk, "final norm"));
        }
        let x = if self.all_logits {
            &t.x
        } else {
            b.copy_rows(&t.x, t.rows - 1..t.rows, &t.last, 0)
                .map_err(gpu_err)?;
            &t.last
        };
        if x.rows() != state.logits.rows() {
            return Err(ExecError::Kernel(format!(
                "the head of chunk {chunk} has {} rows, the logits {}: only the last chunk runs the head",
                x.rows(),
                state.logits.rows()
            )));
        }
        let f = FusedGemm {
            norm_eps: Some(self.model.host.config.norm_eps),
            epilogue: GemmEpilogue::Store,
        };
        b.gemm_fused(x, &self.model.output, &state.logits, f)
            .map_err(gpu_err)?;
        b.read(&state.logits, 0..state.logits.rows())
            .map_err(gpu_err)
    }
}
