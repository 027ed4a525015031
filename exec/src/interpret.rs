//! Runs one subgraph instance (a stage of one chunk) on real kernels.

use std::sync::Arc;

use parking_lot::Mutex;

use hetsched_import::Activation;
use hetsched_kernels::AttentionShape;
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::shadow::ShadowSite;

use super::activation::Act;
use super::blocks::for_each_block;
use super::error::ExecError;
use super::family::{self, add_bias, gated, norm_heads, norm_rows};
use super::float_kernels::FloatKernels;
use super::lock_wait;
use super::passes;
use super::shadow::QuantRule;
use super::state::{ChunkValues, KvRows, PrefillState};
use super::steps::{FamilyStep, Step};
use super::values::{LinearOut, dequantize, linear, matmul_rows, quantize, shadow_product};
use super::weights::{ExecModel, LayerWeights, LinearWeights};
use hetsched_systems::op::{Block, NormSite, Projection};

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

impl std::fmt::Debug for dyn FloatKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.device())
    }
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
        // A shadow stage runs beside its INT8 stage, which holds the chunk's values: it
        // touches only the chunk's shadow slot.
        if steps.iter().all(|s| matches!(s, Step::Shadow(_))) {
            for &step in steps {
                if let Step::Shadow(site) = step {
                    self.shadow(site, layer, chunk)?;
                }
            }
            return Ok(());
        }
        let mut values = lock_wait::lock(slot);
        for &step in steps {
            self.step(&**kernels, step, layer, chunk, &mut values)?;
        }
        Ok(())
    }

    fn layer(&self, layer: usize) -> Result<&LayerWeights, ExecError> {
        self.model
            .layers
            .get(layer)
            .ok_or_else(|| failed(format!("layer {layer} is not in the model")))
    }

    /// Runs one compiled step of `layer` on chunk `chunk`'s values. Each arm is a call:
    /// the steps that take more than a line own a method below.
    fn step(
        &self,
        kernels: &dyn FloatKernels,
        step: Step,
        layer: usize,
        chunk: usize,
        v: &mut ChunkValues,
    ) -> Result<(), ExecError> {
        let missing = |value: &'static str| ExecError::missing(step, chunk, value);
        match step {
            Step::Embed => self.embed(chunk, v),
            Step::Norm(site) => self.norm(kernels, site, layer, chunk, v)?,
            Step::QuantizeNormed(site) => {
                let x = v.normed.take().ok_or_else(|| missing("normed"))?;
                v.act = Some(self.quantize(layer, chunk, site, x)?);
            }
            Step::QuantizeAttention => {
                let x = v.attn.take().ok_or_else(|| missing("attention"))?;
                v.act = Some(self.quantize(layer, chunk, ShadowSite::O, x)?);
            }
            Step::Linear(p) => self.linear_step(p, layer, chunk, v, missing)?,
            Step::DequantizeQkv => {
                let q = v
                    .q_raw
                    .take()
                    .ok_or_else(|| missing(Projection::Q.label()))?;
                let q = self.merged(chunk, Projection::Q, step, q)?;
                v.q = Some(dequantize(q, self.layer(layer)?.projection(Projection::Q))?);
            }
            Step::Rope => {
                let q = v.q.as_mut().ok_or_else(|| missing("queries"))?;
                let positions = self.state.positions(chunk);
                kernels.rope(q, positions, self.model.config.n_heads, layer)?;
                self.write_kv(layer, chunk)?;
            }
            Step::Attention => {
                let q = v.q.take().ok_or_else(|| missing("queries"))?;
                v.attn = Some(self.attention(kernels, layer, chunk, &q)?);
            }
            Step::DequantizeO => {
                let o = v
                    .o_raw
                    .take()
                    .ok_or_else(|| missing(Projection::O.label()))?;
                let o = self.merged(chunk, Projection::O, step, o)?;
                let delta = dequantize(o, self.layer(layer)?.projection(Projection::O))?;
                v.delta = Some(finite_block(delta, layer, "attention", chunk)?);
            }
            Step::DequantizeDown => {
                // The carry at the start of layer l (or of the head) hands on layer l-1.
                let prev = layer
                    .checked_sub(1)
                    .ok_or_else(|| missing("a previous layer"))?;
                let d = v
                    .down_raw
                    .take()
                    .ok_or_else(|| missing(Projection::Down.label()))?;
                let d = self.merged(chunk, Projection::Down, step, d)?;
                let delta = dequantize(d, self.layer(prev)?.projection(Projection::Down))?;
                v.delta = Some(finite_block(delta, prev, "feed-forward", chunk)?);
            }
            Step::Residual => {
                let d = v.delta.take().ok_or_else(|| missing("delta"))?;
                passes::add_assign(&mut v.x, &d);
            }
            Step::SiluMul => self.glu(Activation::SiluGlu, step, layer, chunk, v)?,
            Step::Family(FamilyStep::GeluMul) => {
                self.glu(Activation::GeluTanhGlu, step, layer, chunk, v)?;
            }
            Step::Family(f) => self.family_step(f, layer, chunk, v)?,
            Step::Shadow(site) => self.shadow(site, layer, chunk)?,
            Step::LmHead => {
                let x = v.normed.take().ok_or_else(|| missing("normed"))?;
                *lock_wait::lock(&self.state.logits) = Some(self.lm_head(&x));
            }
        }
        Ok(())
    }

    /// The chunk's token embeddings, as its residual stream.
    fn embed(&self, chunk: usize, v: &mut ChunkValues) {
        let (m, hidden) = (&self.model, self.model.config.hidden);
        let positions = self.state.positions(chunk);
        v.x = Vec::with_capacity(positions.len() * hidden);
        for &id in &self.state.tokens[positions] {
            let row = id as usize;
            v.x.extend_from_slice(&m.token_embd[row * hidden..(row + 1) * hidden]);
        }
    }

    /// RMS norm of the residual stream before attention, the FFN or the head.
    fn norm(
        &self,
        kernels: &dyn FloatKernels,
        site: NormSite,
        layer: usize,
        chunk: usize,
        v: &mut ChunkValues,
    ) -> Result<(), ExecError> {
        let (m, c) = (&self.model, &self.model.config);
        let rows = self.state.positions(chunk).len();
        let (weight, x, rows) = match site {
            NormSite::Attention => (&self.layer(layer)?.attn_norm, &v.x[..], rows),
            NormSite::Ffn => (&self.layer(layer)?.ffn_norm, &v.x[..], rows),
            // Prefill needs the last token's logits only (evaluation wants all).
            NormSite::Final if self.state.all_logits => (&m.output_norm, &v.x[..], rows),
            NormSite::Final => (&m.output_norm, &v.x[(rows - 1) * c.hidden..], 1),
        };
        v.normed = Some(kernels.rms_norm(x, weight, c.norm_eps, rows, c.hidden)?);
        Ok(())
    }

    /// One INT8 or f32 linear of `layer` on the chunk's activation; K and V go to the
    /// chunk's KV rows, the others to the chunk's values.
    fn linear_step(
        &self,
        p: Projection,
        layer: usize,
        chunk: usize,
        v: &mut ChunkValues,
        missing: impl Fn(&'static str) -> ExecError,
    ) -> Result<(), ExecError> {
        let weights = self.weights(layer, p)?;
        let act = v.act.as_ref().ok_or_else(|| missing("activation"))?;
        let out = linear(act, self.state.positions(chunk).len(), weights)?;
        match p {
            Projection::Q => v.q_raw = Some(out),
            Projection::K | Projection::V => self.keep_kv(layer, chunk, p, out),
            Projection::O => v.o_raw = Some(out),
            Projection::Gate => v.gate_raw = Some(out),
            Projection::Up => v.up_raw = Some(out),
            Projection::Down => v.down_raw = Some(out),
        }
        Ok(())
    }

    /// A family's optional step on the chunk's values (the gated activation aside):
    /// each reads the value it changes and refuses its absence, and the weights of
    /// `layer` (the post-FFN norm, in the next layer's carry, those of the layer before).
    fn family_step(
        &self,
        f: FamilyStep,
        layer: usize,
        chunk: usize,
        v: &mut ChunkValues,
    ) -> Result<(), ExecError> {
        let step = Step::Family(f);
        let missing = |value: &'static str| ExecError::missing(step, chunk, value);
        let absent = |what: &str| failed(format!("layer {layer} has no {what} weights"));
        let c = &self.model.config;
        match f {
            FamilyStep::EmbedScale => family::scale_embeddings(c, &mut v.x),
            FamilyStep::QkvBias => {
                let q = v.q.as_mut().ok_or_else(|| missing("queries"))?;
                let [bq, _, _] = self
                    .layer(layer)?
                    .family
                    .qkv_bias
                    .as_ref()
                    .ok_or_else(|| absent("QKV bias"))?;
                add_bias(q, bq);
            }
            FamilyStep::QkNorm => {
                let q = v.q.as_mut().ok_or_else(|| missing("queries"))?;
                let [nq, _] = self
                    .layer(layer)?
                    .family
                    .qk_norm
                    .as_ref()
                    .ok_or_else(|| absent("QK-norm"))?;
                norm_heads(q, nq, c.norm_eps);
            }
            FamilyStep::PostNorm(block) => {
                // The FFN's post-norm runs in the carry, which hands on the layer before.
                let owner = match block {
                    Block::Attention => Some(layer),
                    Block::FeedForward => layer.checked_sub(1),
                };
                let owner = owner.ok_or_else(|| missing("a previous layer"))?;
                let weight = self
                    .layer(owner)?
                    .family
                    .post_norm(block)
                    .ok_or_else(|| absent("post-norm"))?;
                let delta = v.delta.take().ok_or_else(|| missing("delta"))?;
                v.delta = Some(norm_rows(&delta, weight, c.norm_eps));
            }
            FamilyStep::GeluMul => {
                return Err(failed("GELU-mul is not a plain family step".into()));
            }
        }
        Ok(())
    }

    /// `act(gate) * up` of `layer`, each merged with its shadow and dequantized, then
    /// quantized for the down projection.
    fn glu(
        &self,
        activation: Activation,
        step: Step,
        layer: usize,
        chunk: usize,
        v: &mut ChunkValues,
    ) -> Result<(), ExecError> {
        let missing = |value: &'static str| ExecError::missing(step, chunk, value);
        let w = self.layer(layer)?;
        let gate = v
            .gate_raw
            .take()
            .ok_or_else(|| missing(Projection::Gate.label()))?;
        let up = v
            .up_raw
            .take()
            .ok_or_else(|| missing(Projection::Up.label()))?;
        let gate = self.merged(chunk, Projection::Gate, step, gate)?;
        let up = self.merged(chunk, Projection::Up, step, up)?;
        let (gate_w, up_w) = (w.projection(Projection::Gate), w.projection(Projection::Up));
        let h = match passes::dequantize_gated(activation, (&gate, gate_w), (&up, up_w)) {
            Some(h) => h,
            None => gated(
                activation,
                &dequantize(gate, gate_w)?,
                &dequantize(up, up_w)?,
            ),
        };
        v.act = Some(self.quantize(layer, chunk, ShadowSite::Down, h)?);
        Ok(())
    }

    /// The head's logits for the normed rows `x`: one row (a prefill's last token, a
    /// decode step) is a matrix-vector product split over the vocabulary, the kernel the
    /// direct decode path's f32 head runs; several, a matrix product.
    fn lm_head(&self, x: &[f32]) -> Vec<f32> {
        matmul_rows(x, &self.model.output)
    }

    /// The quantize operator of `site` in layer `layer`, after the calibration recorder
    /// (if any) has seen the activation. A shadowed site's outliers go to the chunk's
    /// shadow slot, for the shadow stage beside the INT8 linears. A non-finite input is
    /// refused before it is quantized.
    fn quantize(
        &self,
        layer: usize,
        chunk: usize,
        site: ShadowSite,
        x: Vec<f32>,
    ) -> Result<Act, ExecError> {
        if let Some(recorder) = &self.state.recorder {
            recorder.observe(layer, site, &x);
        }
        let rule = self.model.quant_rule(layer, site);
        if rule != QuantRule::PassThrough {
            passes::finite_quantize_input(&x, Some((layer, site)), chunk)?;
        }
        let shadows = rule.shadows();
        let mut act = quantize(x, rule);
        if shadows && let Act::Int8 { outliers, .. } = &mut act {
            let outliers = Arc::new(std::mem::take(outliers));
            lock_wait::lock(&self.state.shadow[chunk]).pending = Some((site, outliers));
        }
        Ok(act)
    }

    /// The weights of projection `p` in layer `layer`.
    fn weights(&self, layer: usize, p: Projection) -> Result<&LinearWeights, ExecError> {
        Ok(self.layer(layer)?.projection(p))
    }

    /// The shadow stage of `site` (seed 000, Eq. 1): the pending outliers of chunk
    /// `chunk` times each of the site's linears' float rows, left for the merge.
    fn shadow(&self, site: ShadowSite, layer: usize, chunk: usize) -> Result<(), ExecError> {
        let slot = &self.state.shadow[chunk];
        let outliers = match &lock_wait::lock(slot).pending {
            Some((pending, outliers)) if *pending == site => outliers.clone(),
            _ => return Err(ExecError::missing(Step::Shadow(site), chunk, "outliers")),
        };
        let rows = self.state.positions(chunk).len();
        let mut results = Vec::new();
        for &p in Projection::of_site(site) {
            let w = self.weights(layer, p)?;
            let y = shadow_product(&outliers, rows, w, &self.model.shadow_counters);
            results.push((p, y?));
        }
        let mut slot = lock_wait::lock(slot);
        for (p, y) in results {
            slot.results[p.index()] = Some(y);
        }
        slot.pending = None;
        Ok(())
    }

    /// `out` with chunk `chunk`'s shadow result for `p` attached, if the shadow left one:
    /// the merge of Eq. 1 (the dequantize adds it). `step` is the merging one.
    fn merged(
        &self,
        chunk: usize,
        p: Projection,
        step: Step,
        out: LinearOut,
    ) -> Result<LinearOut, ExecError> {
        let mut slot = lock_wait::lock(&self.state.shadow[chunk]);
        if let Some((site, _)) = &slot.pending
            && Projection::of_site(*site).contains(&p)
        {
            return Err(ExecError::missing(step, chunk, "outlier shadow"));
        }
        let result = slot.results[p.index()].take();
        Ok(match (out, result) {
            (LinearOut::Int32 { acc, a_scale, .. }, Some(shadow)) => LinearOut::Int32 {
                acc,
                a_scale,
                shadow: Some(shadow),
            },
            (out, _) => out,
        })
    }

    /// Keeps a chunk's key or value projection until its rows are written.
    fn keep_kv(&self, layer: usize, chunk: usize, p: Projection, out: LinearOut) {
        let mut rows = lock_wait::lock(&self.state.kv[layer].rows[chunk]);
        let (mut k, mut v) = match std::mem::take(&mut *rows) {
            KvRows::Pending { k, v } => (k, v),
            _ => (None, None),
        };
        if p == Projection::K {
            k = Some(out);
        } else {
            v = Some(out);
        }
        *rows = KvRows::Pending { k, v };
    }

    /// Writes chunk `chunk`'s keys (rotated) and values into layer `layer`'s cache, once.
    ///
    /// Seed 000's Eq. 2 lets chunk i's attention start once the projections of chunks
    /// 0..=i are done, before their own attention stages ran: so whichever stage needs
    /// a chunk's rows first writes them.
    fn write_kv(&self, layer: usize, chunk: usize) -> Result<(), ExecError> {
        let m = &self.model;
        let c = &m.config;
        let kv = &self.state.kv[layer];
        let mut rows = lock_wait::lock(&kv.rows[chunk]);
        let (k, v) = match std::mem::replace(&mut *rows, KvRows::Written) {
            KvRows::Written => return Ok(()),
            KvRows::Pending {
                k: Some(k),
                v: Some(v),
            } => (k, v),
            other => {
                *rows = other;
                return Err(ExecError::missing(
                    Step::Attention,
                    chunk,
                    "keys and values",
                ));
            }
        };
        let k = self.merged(chunk, Projection::K, Step::Attention, k)?;
        let v = self.merged(chunk, Projection::V, Step::Attention, v)?;
        let w = self.layer(layer)?;
        let positions = self.state.positions(chunk);
        // Keys and values are finished apart, the values on a helper when one is free:
        // the float lane's job is often alone on the pool here.
        let finished = [Projection::K, Projection::V].map(|_| Mutex::new(None));
        let sides = vec![
            (Projection::K, k, &finished[0]),
            (Projection::V, v, &finished[1]),
        ];
        for_each_block(sides, |(p, out, slot)| {
            let rows = dequantize(out, w.projection(p)).map(|mut rows| {
                if p == Projection::K {
                    family::finish_keys_only(m, layer, &mut rows, positions.clone());
                } else {
                    family::finish_values(m, layer, &mut rows);
                }
                rows
            });
            *slot.lock() = Some(rows);
        });
        let [k, v] = finished.map(|slot| slot.into_inner().expect("each side ran once"));
        let (k, v) = (k?, v?);
        let kv_dim = c.kv_dim();
        let span = positions.start * kv_dim..positions.end * kv_dim;
        let mut cache = lock_wait::write(&kv.cache);
        cache.k[span.clone()].copy_from_slice(&k);
        cache.v[span].copy_from_slice(&v);
        Ok(())
    }

    fn attention(
        &self,
        kernels: &dyn FloatKernels,
        layer: usize,
        chunk: usize,
        q: &[f32],
    ) -> Result<Vec<f32>, ExecError> {
        let c = &self.model.config;
        for earlier in 0..=chunk {
            self.write_kv(layer, earlier)?;
        }
        let positions = self.state.positions(chunk);
        let shape = AttentionShape {
            n_tokens: positions.len(),
            pos0: positions.start,
            kv_len: positions.end,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let cache = lock_wait::read(&self.state.kv[layer].cache);
        kernels
            .attention(q, &cache.k, &cache.v, &shape, c.window_of(layer))
            .map_err(ExecError::from)
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
