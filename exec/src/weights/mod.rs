//! A llama model's weights in the form the real kernels take: packed f32 for the float
//! path, per-row INT8 with scales for the W8A8 (emulated NPU) path.

use std::sync::Arc;

use hetsched_import::{
    ColumnSource, GgufFile, GgufSource, ImportError, LayerTensor, LlamaConfig, LlamaSource,
};
use hetsched_kernels::gemm_w4::GROUP_K;
use hetsched_kernels::{PackedF32Weights, RopeTable};
use hetsched_systems::op::Projection;
use hetsched_systems::shadow::ShadowSite;

use super::calibration::{Calibration, ModelIdentity};
use super::error::ExecError;
use super::shadow::{ColdRowCache, QuantRule, ShadowCounters};
use super::steps::projection_tensor;

mod family;
mod linear;
mod planner_view;
mod shadow_setup;

pub use family::FamilyWeights;
pub use linear::{LinearPrecision, LinearWeights};
pub use shadow_setup::ShadowSetup;
use shadow_setup::{shadow_rows, site_rule};

/// Weights of one decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    /// `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// The seven linears, by [`Projection::index`] ([`Self::projection`]).
    pub linears: [LinearWeights; Projection::COUNT],
    /// How each activation site ([`ShadowSite::index`]) is quantized.
    pub quant: [QuantRule; 4],
    /// The weights of the family's optional steps (none for llama).
    pub family: FamilyWeights,
}

impl LayerWeights {
    /// The linear of projection `p`.
    pub fn projection(&self, p: Projection) -> &LinearWeights {
        &self.linears[p.index()]
    }
}

/// A llama model ready for real prefill.
#[derive(Debug)]
pub struct ExecModel {
    /// Hyper-parameters from the file.
    pub config: LlamaConfig,
    /// Human-readable name (`general.name`, or the file's architecture).
    pub name: String,
    /// Arithmetic of the linears.
    pub precision: LinearPrecision,
    /// `[vocab, hidden]`.
    pub token_embd: Vec<f32>,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`.
    pub output_norm: Vec<f32>,
    /// The LM head, f32 (it runs on the float processor for the last token only).
    pub output: PackedF32Weights,
    /// RoPE rotations for every position of the context (global layers).
    pub rope: RopeTable,
    /// The local (sliding-window) layers' rotations, where their base differs (Gemma 3).
    pub rope_local: Option<RopeTable>,
    /// Whether the rotations are scaled (linear scaling or Llama-3's `rope_freqs.weight`),
    /// which only the CPU lanes' tables compute.
    pub rope_scaled: bool,
    /// What the outlier shadow did so far.
    pub shadow_counters: ShadowCounters,
    /// The calibration file the shadow follows, if any (for reports).
    pub calibration_file: Option<String>,
}

impl ExecModel {
    /// Loads every weight of a GGUF `file` for `precision` (dequantizing GGUF blocks to
    /// f32 and, for W8A8, requantizing per output row).
    pub fn load(file: &GgufFile, precision: LinearPrecision) -> Result<Self, ImportError> {
        Self::from_source(&GgufSource::new(file)?, precision)
    }

    /// Loads every weight of `source` (a GGUF file or a Hugging Face directory).
    pub fn from_source(
        source: &dyn LlamaSource,
        precision: LinearPrecision,
    ) -> Result<Self, ImportError> {
        Self::build(source, precision, &ShadowSetup::Full)
    }

    /// Loads `source` for W8A8 with the outlier shadow `calibration` decides: only its
    /// kept sites shadowed, only their hot channels' float rows resident, cold rows read
    /// from `columns` on demand and kept once read while `cold_cache_bytes` last (shared
    /// by every linear; 0 reads every miss again). Fails if the calibration was made for
    /// another model.
    pub fn from_source_calibrated(
        source: &dyn LlamaSource,
        calibration: &Calibration,
        columns: Arc<dyn ColumnSource>,
        cold_cache_bytes: u64,
    ) -> Result<Self, ExecError> {
        calibration.check_model(&ModelIdentity::of_source(source)?)?;
        calibration.check_shapes(source.config())?;
        let setup = ShadowSetup::Calibrated {
            calibration,
            columns,
            cold_cache: Arc::new(ColdRowCache::new(cold_cache_bytes)),
        };
        Ok(Self::build(source, LinearPrecision::W8a8Shadow, &setup)?)
    }

    fn build(
        source: &dyn LlamaSource,
        precision: LinearPrecision,
        setup: &ShadowSetup<'_>,
    ) -> Result<Self, ImportError> {
        let config = source.config().clone();
        config.validate()?;
        let (vocab, h) = (config.vocab_size, config.hidden);
        let token_embd = checked("token_embd", source.token_embd()?, &[vocab, h])?;
        let output = match source.output()? {
            Some(o) => PackedF32Weights::pack(&checked("output", o, &[vocab, h])?, vocab, h),
            None => PackedF32Weights::pack(&token_embd, vocab, h),
        };
        let layers = (0..config.n_layers)
            .map(|l| Self::build_layer(source, &config, precision, setup, l))
            .collect::<Result<_, _>>()?;
        let factors = source.rope_factors()?;
        let rope_scaled = factors.is_some() || config.rope_freq_scale != 1.0;
        let table = |base| {
            RopeTable::from_frequencies(
                config.head_dim,
                config.rope_frequencies(base, factors.as_deref()),
                config.rope_style,
                config.context_length,
            )
        };
        let rope = table(config.rope_base);
        let local = config.family.local_rope_base;
        let rope_local = (config.family.sliding_window_period > 0 && local != config.rope_base)
            .then(|| table(local));
        Ok(Self {
            output_norm: checked("output_norm", source.output_norm()?, &[h])?,
            name: source.name(),
            precision,
            token_embd,
            layers,
            output,
            rope,
            rope_local,
            rope_scaled,
            config,
            shadow_counters: ShadowCounters::default(),
            calibration_file: None,
        })
    }

    /// Layer `l`'s norms and linears, each linear with its shadow rows where its site's
    /// rule shadows outliers.
    fn build_layer(
        source: &dyn LlamaSource,
        config: &LlamaConfig,
        precision: LinearPrecision,
        setup: &ShadowSetup<'_>,
        l: usize,
    ) -> Result<LayerWeights, ImportError> {
        let tensor = |which: LayerTensor| {
            let shape = which.shape(config);
            checked(
                &format!("layer {l} {which:?}"),
                source.layer(l, which)?,
                &shape,
            )
        };
        let quant = ShadowSite::ALL.map(|site| {
            // The site's input width: its linears share it (w4a8-g128 groups each row).
            let width = Projection::of_site(site)
                .first()
                .map_or(0, |&p| projection_tensor(p).shape(config)[1]);
            site_rule(precision, setup, l, (site, width))
        });
        let linear = |p: Projection| -> Result<LinearWeights, ImportError> {
            let which = projection_tensor(p);
            let shape = which.shape(config);
            let (n, k) = (shape[0], shape[1]);
            let w = tensor(which)?;
            if precision == LinearPrecision::W4a8G32 && k % GROUP_K != 0 {
                return Err(ImportError::InvalidConfig(format!(
                    "--precision w4a8-g32 needs input widths that are multiples of {GROUP_K} (activation groups); layer {l} {which:?} has {k}"
                )));
            }
            let rule = &quant[p.site().index()];
            let shadow = shadow_rows((&w, n, k), rule, setup, (l, p.site(), which));
            Ok(LinearWeights::new(&w, n, k, precision, shadow))
        };
        Ok(LayerWeights {
            family: FamilyWeights::load(source, config, l)?,
            quant: quant.clone(),
            attn_norm: tensor(LayerTensor::AttnNorm)?,
            ffn_norm: tensor(LayerTensor::FfnNorm)?,
            linears: Projection::ALL
                .into_iter()
                .map(linear)
                .collect::<Result<Vec<_>, _>>()?
                .try_into()
                .expect("one linear per projection"),
        })
    }

    /// The RoPE table of layer `layer`: the local one for a sliding-window layer of a
    /// family whose local base differs.
    pub fn rope_of(&self, layer: usize) -> &RopeTable {
        match &self.rope_local {
            Some(local) if self.config.family.is_local(layer) => local,
            _ => &self.rope,
        }
    }

    /// How layer `layer` quantizes activation `site`.
    pub fn quant_rule(&self, layer: usize, site: ShadowSite) -> QuantRule {
        self.layers
            .get(layer)
            .map_or(QuantRule::PassThrough, |l| l.quant[site.index()].clone())
    }

    /// Bytes of the decoder layers' linear weights as the products read them (the
    /// quantized linears' packed values and scales; the f32 embedding and head aside).
    pub fn linear_weight_bytes(&self) -> u64 {
        self.layers
            .iter()
            .flat_map(|l| l.linears.iter())
            .map(LinearWeights::bytes)
            .sum()
    }
}

/// `data` if it holds exactly `shape`'s elements.
pub(crate) fn checked(
    name: &str,
    data: Vec<f32>,
    shape: &[usize],
) -> Result<Vec<f32>, ImportError> {
    if data.len() == shape.iter().product::<usize>() {
        Ok(data)
    } else {
        Err(ImportError::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            found: vec![data.len()],
        })
    }
}

impl ModelIdentity {
    /// The identity of a loaded model.
    pub fn of_model(model: &ExecModel) -> Self {
        let norms = model
            .layers
            .iter()
            .flat_map(|l| [&l.attn_norm[..], &l.ffn_norm[..]])
            .chain([&model.output_norm[..]]);
        Self::new(model.name.clone(), &model.config, norms)
    }
}
