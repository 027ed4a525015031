//! A llama model's weights in the form the real kernels take: packed f32 for the float
//! path, per-row INT8 with scales for the W8A8 (emulated NPU) path.

use hetsched_kernels::gemm_w4::GROUP_K;
use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedF32Weights, PackedI8Weights, PackedW4Weights, RopeTable};
use hetsched_systems::block::{BlockVariant, GluActivation, SlidingWindow};
use hetsched_systems::model::{ModelConfig, Precision};
use hetsched_systems::op::Projection;
use hetsched_systems::shadow::{KeptSite, ShadowConfig, ShadowSite};
use std::sync::Arc;

mod family;

pub use family::FamilyWeights;

use serde::{Deserialize, Serialize};

use super::calibration::{Calibration, ModelIdentity};

use super::error::ExecError;
use super::shadow::{
    ColdRowCache, ColdRows, QuantRule, SHADOW_CLIP_RMS, ShadowCounters, ShadowReport, ShadowRows,
    ShadowUsage,
};
use super::steps::projection_tensor;
use hetsched_import::{
    Activation, ColumnSource, EmbeddingScale, GgufFile, GgufSource, ImportError, LayerTensor,
    LlamaConfig, LlamaSource,
};

/// Arithmetic of the linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinearPrecision {
    /// f32 weights and activations: the accuracy reference.
    F32,
    /// INT8 weights (one scale per output row) and INT8 activations (one scale per tensor),
    /// INT32 accumulation: what the Hexagon NPU runs.
    W8a8,
    /// W8A8 with outlier shadowing (seed 000 section 3.3): the activation scale is clipped
    /// below the few outliers, which are multiplied in float with the float weights and
    /// added to the INT8 result.
    #[serde(rename = "w8a8-shadow")]
    W8a8Shadow,
    /// 4-bit weights (an integer sub-scale per group of 32 inputs, a scale per output
    /// row) and INT8 activations (one scale per tensor), INT32 accumulation: half the
    /// weight bytes of W8A8 (docs/real-execution.md, "W4A8").
    W4a8,
    /// W4A8 with the outlier shadow of [`LinearPrecision::W8a8Shadow`] (every site, every
    /// float row resident: no calibration).
    #[serde(rename = "w4a8-shadow")]
    W4a8Shadow,
    /// W4A8 with INT8 activations scaled per row and group of 32 inputs (llama.cpp's
    /// Q8_0 blocks; [`QuantRule::Groups`]): the CPU lane's W4A8, which SmolLM2's
    /// massive activations do not ruin (the NPU lane needs one scale per tensor).
    /// Every linear's input width must be a multiple of 32.
    #[serde(rename = "w4a8-g32")]
    W4a8G32,
    /// W4A8 with INT8 activations scaled per row and group of 128 inputs
    /// ([`QuantRule::Groups128`]): the four weight groups under one activation scale add
    /// their sub-scaled products in i32 before one float step, a faster kernel than
    /// `w4a8-g32`'s at a coarser activation resolution (docs/real-execution.md).
    #[serde(rename = "w4a8-g128")]
    W4a8G128,
}

impl LinearPrecision {
    /// The name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            LinearPrecision::F32 => "f32",
            LinearPrecision::W8a8 => "w8a8",
            LinearPrecision::W8a8Shadow => "w8a8-shadow",
            LinearPrecision::W4a8 => "w4a8",
            LinearPrecision::W4a8Shadow => "w4a8-shadow",
            LinearPrecision::W4a8G32 => "w4a8-g32",
            LinearPrecision::W4a8G128 => "w4a8-g128",
        }
    }

    /// Whether the linears keep an outlier shadow.
    pub fn shadows(self) -> bool {
        matches!(
            self,
            LinearPrecision::W8a8Shadow | LinearPrecision::W4a8Shadow
        )
    }
}

/// Weights of one linear layer, `[n, k]`.
#[derive(Debug)]
pub enum LinearWeights {
    /// Packed f32.
    F32(PackedF32Weights),
    /// Packed INT8 with one scale per output row.
    Int8 {
        /// Packed weights.
        packed: PackedI8Weights,
        /// `[n]` scales.
        scales: Vec<f32>,
        /// For outlier shadowing: float weight rows per input channel (all of them, or
        /// the hot ones with the rest read from the model file).
        shadow: Option<ShadowRows>,
    },
    /// Packed 4-bit weights with per-group sub-scales and per-row scales (W4A8); the
    /// same INT8 activations and INT32 accumulators as [`LinearWeights::Int8`].
    Int4 {
        /// Packed weights and their scales.
        packed: PackedW4Weights,
        /// For outlier shadowing, as [`LinearWeights::Int8`]'s.
        shadow: Option<ShadowRows>,
    },
}

impl LinearWeights {
    /// The `[n]` row scales that dequantize an integer product's INT32 accumulators
    /// (INT8 or 4-bit weights); `None` for float weights.
    pub fn row_scales(&self) -> Option<&[f32]> {
        match self {
            LinearWeights::Int8 { scales, .. } => Some(scales),
            LinearWeights::Int4 { packed, .. } => Some(packed.row_scales()),
            LinearWeights::F32(_) => None,
        }
    }

    fn new(
        w: &[f32],
        n: usize,
        k: usize,
        precision: LinearPrecision,
        shadow: Option<ShadowRows>,
    ) -> Self {
        match precision {
            LinearPrecision::F32 => LinearWeights::F32(PackedF32Weights::pack(w, n, k)),
            LinearPrecision::W8a8 | LinearPrecision::W8a8Shadow => {
                let (q, scales) = quantize_weights_per_row(w, n, k);
                LinearWeights::Int8 {
                    packed: PackedI8Weights::pack(&q, n, k),
                    scales,
                    shadow,
                }
            }
            LinearPrecision::W4a8
            | LinearPrecision::W4a8Shadow
            | LinearPrecision::W4a8G32
            | LinearPrecision::W4a8G128 => LinearWeights::Int4 {
                packed: PackedW4Weights::quantize(w, n, k),
                shadow,
            },
        }
    }

    /// Output features.
    pub fn n(&self) -> usize {
        match self {
            LinearWeights::F32(w) => w.n(),
            LinearWeights::Int8 { packed, .. } => packed.n(),
            LinearWeights::Int4 { packed, .. } => packed.n(),
        }
    }

    /// Input features.
    pub fn k(&self) -> usize {
        match self {
            LinearWeights::F32(w) => w.k(),
            LinearWeights::Int8 { packed, .. } => packed.k(),
            LinearWeights::Int4 { packed, .. } => packed.k(),
        }
    }

    /// The outlier shadow's float rows, if this linear has any.
    pub fn shadow(&self) -> Option<&ShadowRows> {
        match self {
            LinearWeights::Int8 { shadow, .. } | LinearWeights::Int4 { shadow, .. } => {
                shadow.as_ref()
            }
            LinearWeights::F32(_) => None,
        }
    }

    /// Bytes of the weights the product reads (packed values and their scales; not the
    /// outlier shadow's float rows, which [`ExecModel::shadow_report`] counts).
    pub fn bytes(&self) -> u64 {
        let (n, k) = (self.n() as u64, self.k() as u64);
        match self {
            // Packed f32 (padding aside).
            LinearWeights::F32(_) => 4 * n * k,
            // One byte per weight, an f32 scale and an i32 column sum per row.
            LinearWeights::Int8 { .. } => n * k + 8 * n,
            LinearWeights::Int4 { packed, .. } => packed.bytes() as u64,
        }
    }
}

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

/// Which float weights the outlier shadow keeps, and where the rest come from.
#[derive(Clone)]
pub enum ShadowSetup<'a> {
    /// Every site shadowed, every input channel's row resident (no calibration).
    Full,
    /// The calibration's kept sites shadowed with their hot channels' rows resident;
    /// cold rows are read from `columns` (the memory-mapped model file) when needed.
    Calibrated {
        /// Kept sites and hot channels.
        calibration: &'a Calibration,
        /// The model file, for cold rows.
        columns: Arc<dyn ColumnSource>,
        /// The budget for cold rows kept once read.
        cold_cache: Arc<ColdRowCache>,
    },
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

/// The graph builder's view of `config`'s family: the optional operators its layer has
/// and its sliding window (`None` for llama, whose graph stays the built-in one).
pub fn block_variant(config: &LlamaConfig) -> Option<BlockVariant> {
    let family = &config.family;
    if family.is_llama_like() {
        return None;
    }
    let count = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    Some(BlockVariant {
        family: family.arch.to_owned(),
        activation: match family.activation {
            Activation::SiluGlu => GluActivation::Silu,
            Activation::GeluTanhGlu => GluActivation::GeluTanh,
        },
        qkv_bias: family.qkv_bias,
        qk_norm: family.qk_norm,
        post_norms: family.post_norms,
        embedding_scale: family.embedding_scale == EmbeddingScale::SqrtHidden,
        sliding_window: (family.sliding_window_period > 0).then(|| SlidingWindow {
            keys: count(config.sliding_window),
            period: count(family.sliding_window_period),
        }),
    })
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

    /// The outlier shadow's footprint and `usage`, or `None` without a shadow.
    pub fn shadow_report(&self, usage: ShadowUsage) -> Option<ShadowReport> {
        if !self.precision.shadows() {
            return None;
        }
        let mut kept_sites = 0;
        for layer in &self.layers {
            // Kept: the full shadow (pruned sites may keep their top channels' rows).
            kept_sites += layer
                .quant
                .iter()
                .filter(|r| matches!(r, QuantRule::Clip { .. }))
                .count();
        }
        let (mut resident_bytes, mut full_copy_bytes, mut cold_kept_bytes) = (0, 0, 0);
        for layer in &self.layers {
            for w in Projection::ALL.map(|p| layer.projection(p)) {
                full_copy_bytes += (4 * w.n() * w.k()) as u64;
                resident_bytes += w.shadow().map_or(0, ShadowRows::resident_bytes);
                cold_kept_bytes += w.shadow().map_or(0, ShadowRows::kept_bytes);
            }
        }
        Some(ShadowReport {
            kept_sites,
            sites: 4 * self.layers.len(),
            calibration: self.calibration_file.clone(),
            resident_bytes,
            full_copy_bytes,
            resident_share: resident_bytes as f64 / full_copy_bytes.max(1) as f64,
            hits: usage.hits,
            misses: usage.misses,
            cold_kept_bytes,
            outliers: usage.outliers,
            shadow_ms: usage.shadow_ns as f64 / 1e6,
            prefill_share: 0.0,
        })
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

    /// The model as the planner sees it: shapes for the cost model and the graph builder.
    pub fn model_config(&self) -> ModelConfig {
        let c = &self.config;
        let (weights, activations) = match self.precision {
            LinearPrecision::F32 => (Precision::Fp32, Precision::Fp32),
            // The planner has no 4-bit precision: W4A8 is planned as INT8 (its roofline
            // over-counts the weight bytes; real runs use measured stage costs).
            LinearPrecision::W8a8
            | LinearPrecision::W8a8Shadow
            | LinearPrecision::W4a8
            | LinearPrecision::W4a8Shadow
            | LinearPrecision::W4a8G32
            | LinearPrecision::W4a8G128 => (Precision::Int8, Precision::Int8),
        };
        let count = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        ModelConfig {
            name: self.name.clone(),
            layers: count(c.n_layers),
            hidden: count(c.hidden),
            heads: count(c.n_heads),
            kv_heads: count(c.n_kv_heads),
            head_dim: Some(count(c.head_dim)),
            ffn: count(c.ffn),
            vocab: count(c.vocab_size),
            context: count(c.context_length),
            weight_precision: weights,
            activation_precision: activations,
            float_precision: Precision::Fp32,
            layer_ops: None,
            shadow: self.shadow_config(),
            block: block_variant(c),
        }
    }

    /// The sites that keep an outlier shadow, for the planner (each becomes a shadow
    /// stage beside its INT8 stage), or `None` when no site does.
    fn shadow_config(&self) -> Option<ShadowConfig> {
        let kept: Vec<KeptSite> = self
            .layers
            .iter()
            .enumerate()
            .flat_map(|(layer, l)| {
                ShadowSite::ALL
                    .into_iter()
                    .filter(|site| l.quant[site.index()].shadows())
                    .map(move |site| KeptSite {
                        layer: layer as u32,
                        site,
                    })
            })
            .collect();
        if kept.is_empty() {
            return None;
        }
        // The share of input channels whose float rows are resident, over the kept sites'
        // linears (the planner's memory estimate; times are measured).
        let (mut hot, mut channels) = (0usize, 0usize);
        for site in &kept {
            let layer = &self.layers[site.layer as usize];
            for &p in Projection::of_site(site.site) {
                let w = layer.projection(p);
                if let Some(rows) = w.shadow() {
                    hot += rows.hot_channels();
                    channels += w.k();
                }
            }
        }
        Some(ShadowConfig {
            hot_channels: hot as f64 / channels.max(1) as f64,
            ..ShadowConfig::with_sites(kept)
        })
    }
}

/// How layer `layer` quantizes `site` (whose input rows are `width` wide): f32 passes
/// through, W8A8 uses the max scale, the shadow clips (every site without a calibration;
/// the kept ones with).
fn site_rule(
    precision: LinearPrecision,
    setup: &ShadowSetup<'_>,
    layer: usize,
    (site, width): (ShadowSite, usize),
) -> QuantRule {
    let clip = QuantRule::Clip {
        rms: SHADOW_CLIP_RMS,
    };
    match (precision, setup) {
        (LinearPrecision::F32, _) => QuantRule::PassThrough,
        (LinearPrecision::W8a8 | LinearPrecision::W4a8, _) => QuantRule::MaxAbs,
        (LinearPrecision::W4a8G32, _) => QuantRule::Groups,
        (LinearPrecision::W4a8G128, _) => QuantRule::Groups128 { width },
        (LinearPrecision::W8a8Shadow | LinearPrecision::W4a8Shadow, ShadowSetup::Full) => clip,
        (
            LinearPrecision::W8a8Shadow | LinearPrecision::W4a8Shadow,
            ShadowSetup::Calibrated { calibration, .. },
        ) => match calibration.site(layer, site) {
            Some(s) if s.keep => clip,
            Some(s) => calibration.pruned_rule(s),
            None => QuantRule::MaxAbs,
        },
    }
}

/// The shadow rows of linear `w` (`[n, k]`, tensor `which` of layer `layer`, read at
/// `site` under `rule`): every row with the full setup, the calibrated hot channels' with
/// a calibration (cold rows read on demand), none where the rule does not shadow.
fn shadow_rows(
    (w, n, k): (&[f32], usize, usize),
    rule: &QuantRule,
    setup: &ShadowSetup<'_>,
    (layer, site, which): (usize, ShadowSite, LayerTensor),
) -> Option<ShadowRows> {
    match (rule, setup) {
        (QuantRule::Clip { .. }, ShadowSetup::Full) => Some(ShadowRows::all(w, n, k)),
        (
            rule @ (QuantRule::Clip { .. } | QuantRule::HotMax { .. }),
            ShadowSetup::Calibrated {
                calibration,
                columns,
                cold_cache,
            },
        ) => {
            let hot = match rule {
                // A pruned site's outliers are mostly in these channels.
                QuantRule::HotMax { hot, .. } => (0..)
                    .zip(hot.iter())
                    .filter(|&(_, &h)| h)
                    .map(|(c, _)| c)
                    .collect(),
                _ => calibration
                    .site(layer, site)
                    .map(|s| s.hot_channel_ids())
                    .unwrap_or_default(),
            };
            let cold = ColdRows {
                source: columns.clone(),
                layer,
                which,
                cache: cold_cache.clone(),
            };
            Some(ShadowRows::hot(w, n, k, &hot, cold))
        }
        _ => None,
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
