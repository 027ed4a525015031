//! Runs one subgraph instance (a stage of one chunk) on real kernels: the CPU
//! interpreter's [`StepBackend`], whose steps read and write the chunk's values.

mod shared;

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use hetsched_import::Activation;
use hetsched_systems::op::{Block, NormSite, Projection};
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::shadow::ShadowSite;

use super::error::ExecError;
use super::family::{self, add_bias, gated, norm_heads, norm_rows};
use super::float_kernels::FloatKernels;
use super::lock_wait;
use super::passes;
use super::state::{ChunkValues, PrefillState};
use super::steps::{FamilyStep, Step};
use super::values::{LinearOut, dequantize, linear, matmul_rows};
use super::walk::{StepBackend, walk};
use super::weights::{ExecModel, LayerWeights, LinearWeights};

/// Executes stages of one prefill: the model, its compiled stages and the shared state.
#[derive(Debug)]
pub struct StageRunner {
    model: Arc<ExecModel>,
    /// Steps per stage.
    steps: Vec<Vec<Step>>,
    /// Decoder layer per stage (`None`: the head).
    layers: Vec<Option<u32>>,
    /// Float kernels per processor lane.
    lanes: Vec<Arc<dyn FloatKernels>>,
    /// What the run writes.
    pub state: PrefillState,
}

fn failed(reason: String) -> ExecError {
    ExecError::Kernel(reason)
}

impl StageRunner {
    /// A runner for `steps` (compiled from the plan's stages, whose layers are `layers`),
    /// running float kernels on `lanes[processor]`.
    pub fn new(
        model: Arc<ExecModel>,
        steps: Vec<Vec<Step>>,
        layers: Vec<Option<u32>>,
        lanes: Vec<Arc<dyn FloatKernels>>,
        state: PrefillState,
    ) -> Self {
        Self {
            model,
            steps,
            layers,
            lanes,
            state,
        }
    }

    /// Runs stage `key.stage` of chunk `key.chunk` on processor lane `lane`.
    pub fn run(&self, key: InstanceKey, lane: usize) -> Result<(), ExecError> {
        let Some(kernels) = self.lanes.get(lane) else {
            return Err(failed(format!(
                "no float kernels for processor lane {lane}"
            )));
        };
        let chunk = key.chunk as usize;
        let stage = key.stage as usize;
        let (Some(steps), Some(slot)) = (self.steps.get(stage), self.state.chunks.get(chunk))
        else {
            return Err(failed(format!(
                "no stage {stage} of chunk {chunk} in this prefill"
            )));
        };
        // The head (no layer) reads the last layer's output.
        let layer = self.layers[stage].map_or(self.model.layers.len(), |l| l as usize);
        let mut stage = CpuStage {
            runner: self,
            kernels: &**kernels,
            layer,
            chunk,
            values: LockedOnUse { slot, guard: None },
        };
        walk(steps, &mut stage)
    }

    fn layer(&self, layer: usize) -> Result<&LayerWeights, ExecError> {
        self.model
            .layers
            .get(layer)
            .ok_or_else(|| failed(format!("layer {layer} is not in the model")))
    }

    /// The weights of projection `p` in layer `layer`.
    fn weights(&self, layer: usize, p: Projection) -> Result<&LinearWeights, ExecError> {
        Ok(self.layer(layer)?.projection(p))
    }

    /// A family's weights that `pick` finds in layer `layer`, or the error naming `what`
    /// as absent.
    fn family_weights<T: ?Sized>(
        &self,
        layer: usize,
        what: &str,
        pick: impl FnOnce(&LayerWeights) -> Option<&T>,
    ) -> Result<&T, ExecError> {
        pick(self.layer(layer)?)
            .ok_or_else(|| failed(format!("layer {layer} has no {what} weights")))
    }
}

/// A chunk's values, locked by the first step that touches them and held to the end of the
/// stage. A shadow stage runs beside its INT8 stage, which holds the values, and touches
/// only the chunk's shadow slot: it never locks them, so never waits for that stage.
struct LockedOnUse<'a> {
    slot: &'a Mutex<ChunkValues>,
    guard: Option<MutexGuard<'a, ChunkValues>>,
}

impl LockedOnUse<'_> {
    fn get(&mut self) -> &mut ChunkValues {
        self.guard.get_or_insert_with(|| lock_wait::lock(self.slot))
    }
}

/// One stage of one chunk on the CPU interpreter: where its steps read and write.
struct CpuStage<'a> {
    runner: &'a StageRunner,
    /// The lane's float kernels (norms, RoPE, attention).
    kernels: &'a dyn FloatKernels,
    /// The stage's decoder layer (the number of layers for the head).
    layer: usize,
    chunk: usize,
    values: LockedOnUse<'a>,
}

/// The value in `slot`, consumed, or the error naming `step`'s missing input.
fn take<T>(
    slot: &mut Option<T>,
    step: Step,
    chunk: usize,
    value: &'static str,
) -> Result<T, ExecError> {
    slot.take()
        .ok_or_else(|| ExecError::missing(step, chunk, value))
}

impl<'a> CpuStage<'a> {
    /// The weights of the stage's layer.
    fn weights(&self) -> Result<&'a LayerWeights, ExecError> {
        self.runner.layer(self.layer)
    }

    /// `out`, the output of projection `p` (o or down), merged with its shadow and
    /// dequantized: the delta of `layer`'s `block`, refused if not finite.
    fn block_delta(
        &mut self,
        step: Step,
        (p, out): (Projection, LinearOut),
        layer: usize,
        block: &'static str,
    ) -> Result<(), ExecError> {
        let (r, chunk) = (self.runner, self.chunk);
        let out = r.merged(chunk, p, step, out)?;
        let delta = dequantize(out, r.weights(layer, p)?)?;
        self.values.get().delta = Some(finite_block(delta, layer, block, chunk)?);
        Ok(())
    }

    /// The chunk's queries, which family step `f` changes.
    fn queries(&mut self, f: FamilyStep) -> Result<&mut Vec<f32>, ExecError> {
        let chunk = self.chunk;
        let q = self.values.get().q.as_mut();
        q.ok_or_else(|| ExecError::missing(Step::Family(f), chunk, "queries"))
    }

    /// `act(gate) * up`, each merged with its shadow and dequantized, then quantized for
    /// the down projection.
    fn glu(&mut self, activation: Activation, step: Step) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let w = r.layer(layer)?;
        let v = self.values.get();
        let gate = take(&mut v.gate_raw, step, chunk, Projection::Gate.label())?;
        let up = take(&mut v.up_raw, step, chunk, Projection::Up.label())?;
        let gate = r.merged(chunk, Projection::Gate, step, gate)?;
        let up = r.merged(chunk, Projection::Up, step, up)?;
        let (gate_w, up_w) = (w.projection(Projection::Gate), w.projection(Projection::Up));
        let h = match passes::dequantize_gated(activation, (&gate, gate_w), (&up, up_w)) {
            Some(h) => h,
            None => gated(
                activation,
                &dequantize(gate, gate_w)?,
                &dequantize(up, up_w)?,
            ),
        };
        v.act = Some(r.quantize(layer, chunk, ShadowSite::Down, h)?);
        Ok(())
    }
}

impl StepBackend for CpuStage<'_> {
    type Error = ExecError;

    /// The chunk's token embeddings, as its residual stream.
    fn embed(&mut self) -> Result<(), ExecError> {
        let (m, hidden) = (&self.runner.model, self.runner.model.config.hidden);
        let state = &self.runner.state;
        let positions = state.positions(self.chunk);
        let v = self.values.get();
        v.x = Vec::with_capacity(positions.len() * hidden);
        for &id in &state.tokens[positions] {
            let row = id as usize;
            v.x.extend_from_slice(&m.token_embd[row * hidden..(row + 1) * hidden]);
        }
        Ok(())
    }

    /// RMS norm of the residual stream before attention, the FFN or the head.
    fn norm(&mut self, site: NormSite) -> Result<(), ExecError> {
        let (m, c) = (&self.runner.model, &self.runner.model.config);
        let state = &self.runner.state;
        let rows = state.positions(self.chunk).len();
        let weight = match site {
            NormSite::Attention => &self.weights()?.attn_norm,
            NormSite::Ffn => &self.weights()?.ffn_norm,
            NormSite::Final => &m.output_norm,
        };
        let v = self.values.get();
        let (x, rows) = match site {
            // Prefill needs the last token's logits only (evaluation wants all).
            NormSite::Final if !state.all_logits => (&v.x[(rows - 1) * c.hidden..], 1),
            _ => (&v.x[..], rows),
        };
        v.normed = Some(
            self.kernels
                .rms_norm(x, weight, c.norm_eps, rows, c.hidden)?,
        );
        Ok(())
    }

    fn quantize_normed(&mut self, site: ShadowSite) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let v = self.values.get();
        let x = take(&mut v.normed, Step::QuantizeNormed(site), chunk, "normed")?;
        v.act = Some(r.quantize(layer, chunk, site, x)?);
        Ok(())
    }

    fn quantize_attention(&mut self) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let v = self.values.get();
        let x = take(&mut v.attn, Step::QuantizeAttention, chunk, "attention")?;
        v.act = Some(r.quantize(layer, chunk, ShadowSite::O, x)?);
        Ok(())
    }

    /// One INT8 or f32 linear on the chunk's activation; K and V go to the chunk's KV
    /// rows, the others to the chunk's values.
    fn linear(&mut self, p: Projection) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let weights = r.weights(layer, p)?;
        let v = self.values.get();
        let act = v
            .act
            .as_ref()
            .ok_or_else(|| ExecError::missing(Step::Linear(p), chunk, "activation"))?;
        let out = linear(act, r.state.positions(chunk).len(), weights)?;
        match p {
            Projection::Q => v.q_raw = Some(out),
            Projection::K | Projection::V => r.keep_kv(layer, chunk, p, out),
            Projection::O => v.o_raw = Some(out),
            Projection::Gate => v.gate_raw = Some(out),
            Projection::Up => v.up_raw = Some(out),
            Projection::Down => v.down_raw = Some(out),
        }
        Ok(())
    }

    fn dequantize_qkv(&mut self) -> Result<(), ExecError> {
        let (r, layer, chunk, step) = (self.runner, self.layer, self.chunk, Step::DequantizeQkv);
        let v = self.values.get();
        let q = take(&mut v.q_raw, step, chunk, Projection::Q.label())?;
        let q = r.merged(chunk, Projection::Q, step, q)?;
        v.q = Some(dequantize(q, r.weights(layer, Projection::Q)?)?);
        Ok(())
    }

    /// RoPE on the queries; the chunk's keys are rotated where its rows are written.
    fn rope(&mut self) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let v = self.values.get();
        let q =
            v.q.as_mut()
                .ok_or_else(|| ExecError::missing(Step::Rope, chunk, "queries"))?;
        let positions = r.state.positions(chunk);
        self.kernels
            .rope(q, positions, r.model.config.n_heads, layer)?;
        r.write_kv(layer, chunk)
    }

    fn attention(&mut self) -> Result<(), ExecError> {
        let (r, layer, chunk) = (self.runner, self.layer, self.chunk);
        let v = self.values.get();
        let q = take(&mut v.q, Step::Attention, chunk, "queries")?;
        v.attn = Some(r.attention(self.kernels, layer, chunk, &q)?);
        Ok(())
    }

    fn dequantize_o(&mut self) -> Result<(), ExecError> {
        let (step, p) = (Step::DequantizeO, Projection::O);
        let out = take(&mut self.values.get().o_raw, step, self.chunk, p.label())?;
        self.block_delta(step, (p, out), self.layer, "attention")
    }

    fn dequantize_down(&mut self) -> Result<(), ExecError> {
        let (step, p) = (Step::DequantizeDown, Projection::Down);
        // The carry at the start of layer l (or of the head) hands on layer l-1.
        let prev = self
            .layer
            .checked_sub(1)
            .ok_or_else(|| ExecError::missing(step, self.chunk, "a previous layer"))?;
        let out = take(&mut self.values.get().down_raw, step, self.chunk, p.label())?;
        self.block_delta(step, (p, out), prev, "feed-forward")
    }

    fn residual(&mut self) -> Result<(), ExecError> {
        let v = self.values.get();
        let d = take(&mut v.delta, Step::Residual, self.chunk, "delta")?;
        passes::add_assign(&mut v.x, &d);
        Ok(())
    }

    fn silu_mul(&mut self) -> Result<(), ExecError> {
        self.glu(Activation::SiluGlu, Step::SiluMul)
    }

    fn shadow(&mut self, site: ShadowSite) -> Result<(), ExecError> {
        self.runner.shadow(site, self.layer, self.chunk)
    }

    /// The head's logits for the normed rows: one row (a prefill's last token, a decode
    /// step) is a matrix-vector product split over the vocabulary, the kernel the direct
    /// decode path's f32 head runs; several, a matrix product.
    fn lm_head(&mut self) -> Result<(), ExecError> {
        let r = self.runner;
        let v = self.values.get();
        let x = take(&mut v.normed, Step::LmHead, self.chunk, "normed")?;
        *lock_wait::lock(&r.state.logits) = Some(matmul_rows(&x, &r.model.output));
        Ok(())
    }

    fn embed_scale(&mut self) -> Result<(), ExecError> {
        family::scale_embeddings(&self.runner.model.config, &mut self.values.get().x);
        Ok(())
    }

    fn qkv_bias(&mut self) -> Result<(), ExecError> {
        let (r, layer) = (self.runner, self.layer);
        let q = self.queries(FamilyStep::QkvBias)?;
        let [bq, _, _] = r.family_weights(layer, "QKV bias", |w| w.family.qkv_bias.as_ref())?;
        add_bias(q, bq);
        Ok(())
    }

    fn qk_norm(&mut self) -> Result<(), ExecError> {
        let (r, layer) = (self.runner, self.layer);
        let q = self.queries(FamilyStep::QkNorm)?;
        let [nq, _] = r.family_weights(layer, "QK-norm", |w| w.family.qk_norm.as_ref())?;
        norm_heads(q, nq, r.model.config.norm_eps);
        Ok(())
    }

    /// RMSNorm of the block's output with its post-norm weight.
    fn post_norm(&mut self, block: Block) -> Result<(), ExecError> {
        let (step, chunk) = (Step::Family(FamilyStep::PostNorm(block)), self.chunk);
        // The FFN's post-norm runs in the carry, which hands on the layer before.
        let owner = match block {
            Block::Attention => Some(self.layer),
            Block::FeedForward => self.layer.checked_sub(1),
        };
        let owner = owner.ok_or_else(|| ExecError::missing(step, chunk, "a previous layer"))?;
        let weight = self
            .runner
            .family_weights(owner, "post-norm", |w| w.family.post_norm(block))?;
        let eps = self.runner.model.config.norm_eps;
        let v = self.values.get();
        let delta = take(&mut v.delta, step, chunk, "delta")?;
        v.delta = Some(norm_rows(&delta, weight, eps));
        Ok(())
    }

    fn gelu_mul(&mut self) -> Result<(), ExecError> {
        self.glu(Activation::GeluTanhGlu, Step::Family(FamilyStep::GeluMul))
    }
}

/// `delta`, the output of `layer`'s `block` for chunk `chunk`, if every value is finite.
/// A NaN or infinity there (an overflow, or a non-finite weight that slipped through)
/// would poison every later layer and end as an empty or plausible-looking answer; one
/// pass over the block's output (rows x hidden, against the block's rows x hidden x ffn
/// multiply-adds) names the layer where it first appears instead.
fn finite_block(
    delta: Vec<f32>,
    layer: usize,
    block: &'static str,
    chunk: usize,
) -> Result<Vec<f32>, ExecError> {
    match passes::first_non_finite(&delta) {
        None => Ok(delta),
        Some(index) => Err(ExecError::NonFiniteActivation {
            layer,
            block,
            chunk,
            index,
            value: delta[index],
        }),
    }
}
