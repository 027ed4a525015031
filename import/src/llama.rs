//! The llama-like architectures in GGUF (the rows of [`crate::family`]: llama, qwen2,
//! gemma3): hyper-parameters and tensors.
//!
//! Tensor names and shapes (outermost first, i.e. GGUF dims reversed; a
//! linear weight is `[out_features, in_features]`, one row per output):
//!
//! | tensor | shape |
//! |--------|-------|
//! | `token_embd.weight` | `[vocab, hidden]` |
//! | `blk.N.attn_norm.weight`, `blk.N.ffn_norm.weight`, `output_norm.weight` | `[hidden]` |
//! | `blk.N.attn_q.weight` | `[n_heads · head_dim, hidden]` |
//! | `blk.N.attn_k.weight`, `blk.N.attn_v.weight` | `[n_kv_heads · head_dim, hidden]` |
//! | `blk.N.attn_output.weight` | `[hidden, n_heads · head_dim]` |
//! | `blk.N.ffn_gate.weight`, `blk.N.ffn_up.weight` | `[ffn, hidden]` |
//! | `blk.N.ffn_down.weight` | `[hidden, ffn]` |
//! | `output.weight` (absent when tied to `token_embd.weight`) | `[vocab, hidden]` |
//! | `blk.N.attn_{q,k,v}.bias` (families with QKV biases) | `[q_dim]`, `[kv_dim]` |
//! | `blk.N.attn_{q,k}_norm.weight` (families with QK-norm) | `[head_dim]` |
//! | `blk.N.post_attention_norm.weight`, `blk.N.post_ffw_norm.weight` (post-norms) | `[hidden]` |
//! | `rope_freqs.weight` (optional: Llama-3's RoPE frequency factors) | `[head_dim / 2]` |
//!
//! The head dimension is `ARCH.attention.key_length` when present (Gemma 3: 256 with
//! hidden 640 and 4 heads), else `hidden / n_heads`.
//!
//! llama.cpp's converter permutes the rows of `attn_q` / `attn_k` so that
//! RoPE rotates **adjacent** pairs `(x[2i], x[2i+1])` (rope type NORM):
//! [`LlamaConfig::rope_style`] is [`RopeStyle::Adjacent`] for this
//! architecture, which the SmolLM2 forward test confirms (Hugging Face's
//! half-split `rotate_half` gives wrong predictions on these weights).

use hetsched_kernels::RopeStyle;

use super::error::{ImportError, Result};
use super::family::{self, Family};
use super::gguf::{GgufFile, Metadata, TensorView};

/// Hyper-parameters of a llama-like model (any row of [`crate::family`]). Keys are
/// read under the architecture's prefix (`llama.block_count`, `gemma3.block_count`).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// How the block computes: the family row of `general.architecture`.
    pub family: Family,
    /// Transformer blocks (`llama.block_count`).
    pub n_layers: usize,
    /// Model width (`llama.embedding_length`).
    pub hidden: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`, default `n_heads`).
    pub n_kv_heads: usize,
    /// Dimension of a head: `attention.key_length`, else `hidden / n_heads`.
    pub head_dim: usize,
    /// FFN inner width (`llama.feed_forward_length`).
    pub ffn: usize,
    /// RoPE base (`llama.rope.freq_base`, default 10000).
    pub rope_base: f32,
    /// Rotated dimensions per head (`llama.rope.dimension_count`, default
    /// `head_dim`; only `head_dim` is supported).
    pub rope_dims: usize,
    /// Which elements RoPE pairs: the family's (for GGUF llama,
    /// [`RopeStyle::Adjacent`]); Hugging Face llama checkpoints use
    /// [`RopeStyle::HalfSplit`].
    pub rope_style: RopeStyle,
    /// RoPE position scale: `1 / rope.scaling.factor` for linear scaling, else 1.
    pub rope_freq_scale: f32,
    /// Keys a local layer attends to, the query's own included
    /// (`attention.sliding_window`); 0 when the family has no local layers.
    pub sliding_window: usize,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub norm_eps: f32,
    /// Trained context (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size: length of `tokenizer.ggml.tokens`, else `llama.vocab_size`.
    pub vocab_size: usize,
    /// Whether the output projection reuses `token_embd.weight` (no `output.weight`).
    pub tied_output: bool,
}

fn to_usize(key: &str, v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| ImportError::WrongKeyType {
        key: key.to_owned(),
        expected: "a value that fits usize",
        found: v.to_string(),
    })
}

fn req(md: &Metadata, key: &str) -> Result<usize> {
    to_usize(key, md.require_u64(key)?)
}

fn opt(md: &Metadata, key: &str) -> Result<Option<usize>> {
    md.get_u64(key)?.map(|v| to_usize(key, v)).transpose()
}

fn positive_f32(md: &Metadata, key: &str, default: Option<f64>) -> Result<f32> {
    let v = match (md.get_f64(key)?, default) {
        (Some(v), _) => v,
        (None, Some(d)) => d,
        (None, None) => return Err(ImportError::MissingKey(key.to_owned())),
    };
    let f = v as f32;
    if !(f.is_finite() && f > 0.0) {
        return Err(ImportError::InvalidConfig(format!(
            "{key} = {v} must be positive and finite"
        )));
    }
    Ok(f)
}

/// The vocabulary size: length of `tokenizer.ggml.tokens`, else `vocab_key`.
fn vocab_size(md: &Metadata, vocab_key: &str) -> Result<usize> {
    match md.get("tokenizer.ggml.tokens") {
        Some(v) => match v.as_array() {
            Some(a) => Ok(a.values.len()),
            None => Err(ImportError::WrongKeyType {
                key: "tokenizer.ggml.tokens".into(),
                expected: "an array of strings",
                found: format!("{:?}", v.value_type()),
            }),
        },
        None => req(md, vocab_key),
    }
}

/// `1 / factor` for `rope.scaling.type = linear`, 1 without scaling. Llama-3's scaling
/// has no type here: llama.cpp's converter writes its per-frequency factors as the
/// `rope_freqs.weight` tensor instead ([`LlamaWeights::rope_factors`]). Every other type
/// (`yarn`, `longrope`, ...) is [`ImportError::UnsupportedRopeScaling`], naming it.
fn rope_freq_scale(md: &Metadata, type_key: &str, factor_key: &str) -> Result<f32> {
    let Some(value) = md.get(type_key) else {
        return Ok(1.0);
    };
    match value.as_str() {
        Some("none") => Ok(1.0),
        Some("linear") => Ok(1.0 / positive_f32(md, factor_key, Some(1.0))?),
        Some(other) => Err(ImportError::UnsupportedRopeScaling {
            key: type_key.to_owned(),
            kind: other.to_owned(),
        }),
        None => Err(ImportError::WrongKeyType {
            key: type_key.to_owned(),
            expected: "a string",
            found: format!("{:?}", value.value_type()),
        }),
    }
}

impl LlamaConfig {
    /// Reads the configuration of the model in `file` (`tied_output` from
    /// the absence of `output.weight`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_metadata(file.metadata(), file.tensor("output.weight").is_none())
    }

    /// Reads the configuration from metadata alone.
    ///
    /// Errors: [`ImportError::UnsupportedArchitecture`] unless
    /// `general.architecture` names a row of [`crate::family`]; [`ImportError::MissingKey`] /
    /// [`ImportError::WrongKeyType`] for absent or mistyped keys;
    /// [`ImportError::InvalidConfig`] for inconsistent values (zero sizes,
    /// heads not dividing the width or each other, odd head dim, partial
    /// rotary, non-positive eps or base).
    pub fn from_metadata(md: &Metadata, tied_output: bool) -> Result<Self> {
        let family = family::family(md.require_str("general.architecture")?)?;
        let k = |suffix: &str| family.key(suffix);
        let n_layers = req(md, &k("block_count"))?;
        let hidden = req(md, &k("embedding_length"))?;
        let n_heads = req(md, &k("attention.head_count"))?;
        let n_kv_heads = opt(md, &k("attention.head_count_kv"))?.unwrap_or(n_heads);
        let ffn = req(md, &k("feed_forward_length"))?;
        let context_length = req(md, &k("context_length"))?;
        let norm_eps = positive_f32(md, &k("attention.layer_norm_rms_epsilon"), None)?;
        let rope_base = positive_f32(md, &k("rope.freq_base"), Some(10_000.0))?;
        let vocab_size = vocab_size(md, &k("vocab_size"))?;
        let head_dim = match opt(md, &k("attention.key_length"))? {
            Some(d) => d,
            None if n_heads > 0 && !hidden.is_multiple_of(n_heads) => {
                return Err(ImportError::InvalidConfig(format!(
                    "hidden {hidden} is not {n_heads} heads of equal width, and no {} gives the head dim",
                    k("attention.key_length")
                )));
            }
            None => hidden.checked_div(n_heads).unwrap_or(0),
        };
        let value_key = k("attention.value_length");
        if let Some(v) = opt(md, &value_key)?
            && v != head_dim
        {
            return Err(ImportError::InvalidConfig(format!(
                "{value_key} = {v} differs from the key length {head_dim} (unsupported)"
            )));
        }
        let rope_dims = opt(md, &k("rope.dimension_count"))?.unwrap_or(head_dim);
        let sliding_window = match family.sliding_window_period {
            0 => 0,
            _ => req(md, &k("attention.sliding_window"))?,
        };
        let config = Self {
            family,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn,
            rope_base,
            rope_dims,
            rope_style: family.rope_style,
            rope_freq_scale: rope_freq_scale(
                md,
                &k("rope.scaling.type"),
                &k("rope.scaling.factor"),
            )?,
            sliding_window,
            norm_eps,
            context_length,
            vocab_size,
            tied_output,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks that the fields are consistent, so that the kernels' shape
    /// assertions cannot fire: no zero sizes, `head_dim = hidden / n_heads`
    /// even, `n_kv_heads` dividing `n_heads`, `rope_dims == head_dim`,
    /// positive finite `norm_eps` and `rope_base`
    /// ([`ImportError::InvalidConfig`] otherwise).
    pub fn validate(&self) -> Result<()> {
        use crate::limits::{self, check};
        // Limits first: the readers size tables (RoPE: context × head dim) and per-layer
        // vectors from these before any tensor is touched.
        for (name, v, max) in [
            ("llama.block_count", self.n_layers, limits::MAX_LAYERS),
            ("llama.embedding_length", self.hidden, limits::MAX_HIDDEN),
            (
                "llama.attention.head_count",
                self.n_heads,
                limits::MAX_HEADS,
            ),
            (
                "llama.attention.head_count_kv",
                self.n_kv_heads,
                limits::MAX_HEADS,
            ),
            ("llama.feed_forward_length", self.ffn, limits::MAX_FFN),
            (
                "llama.context_length",
                self.context_length,
                limits::MAX_CONTEXT,
            ),
            ("vocabulary size", self.vocab_size, limits::MAX_VOCAB),
        ] {
            check(name, v as u64, max)?;
        }
        let invalid = |msg: String| Err(ImportError::InvalidConfig(msg));
        for (name, v) in [
            ("llama.block_count", self.n_layers),
            ("llama.embedding_length", self.hidden),
            ("llama.attention.head_count", self.n_heads),
            ("llama.attention.head_count_kv", self.n_kv_heads),
            ("llama.feed_forward_length", self.ffn),
            ("llama.context_length", self.context_length),
            ("vocabulary size", self.vocab_size),
        ] {
            if v == 0 {
                return invalid(format!("{name} is 0"));
            }
        }
        let (n_heads, n_kv_heads) = (self.n_heads, self.n_kv_heads);
        check("head dim", self.head_dim as u64, limits::MAX_HIDDEN)?;
        if self.head_dim == 0 {
            return invalid("the head dim is 0".into());
        }
        if !n_heads.is_multiple_of(n_kv_heads) {
            return invalid(format!(
                "{n_kv_heads} KV heads do not divide {n_heads} query heads"
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return invalid(format!("head dim {} is odd", self.head_dim));
        }
        if self.rope_dims != self.head_dim {
            return invalid(format!(
                "llama.rope.dimension_count = {} != head dim {}: partial rotary is unsupported",
                self.rope_dims, self.head_dim
            ));
        }
        if self.family.sliding_window_period > 0 && self.sliding_window == 0 {
            return invalid(format!(
                "{} needs a sliding window above 0",
                self.family.arch
            ));
        }
        for (name, v) in [
            ("norm eps", self.norm_eps),
            ("rope base", self.rope_base),
            ("rope frequency scale", self.rope_freq_scale),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return invalid(format!("{name} {v} must be positive and finite"));
            }
        }
        Ok(())
    }

    /// The RoPE base of layer `layer`: the family's local base for a local layer.
    pub fn rope_base_of(&self, layer: usize) -> f32 {
        if self.family.is_local(layer) {
            self.family.local_rope_base
        } else {
            self.rope_base
        }
    }

    /// The keys layer `layer` attends to at most (`usize::MAX` for a global layer).
    pub fn window_of(&self, layer: usize) -> usize {
        if self.family.is_local(layer) {
            self.sliding_window
        } else {
            usize::MAX
        }
    }

    /// The RoPE frequency of every pair of a head, in f64, for RoPE base `base` (a
    /// layer's: [`LlamaConfig::rope_base_of`]): `scale · base^(−2i/d) / factors[i]`,
    /// llama.cpp's `freq_scale` (linear scaling) and `freq_factors` (Llama-3's
    /// `rope_freqs.weight`, see [`LlamaWeights::rope_factors`]). The reference forward
    /// and the executors' RoPE tables both rotate by these.
    pub fn rope_frequencies(&self, base: f32, factors: Option<&[f32]>) -> Vec<f64> {
        let d = self.head_dim;
        let base = f64::from(base);
        let scale = f64::from(self.rope_freq_scale);
        (0..d / 2)
            .map(|i| {
                let factor = factors.map_or(1.0, |fs| f64::from(fs[i]));
                base.powf(-2.0 * i as f64 / d as f64) * scale / factor
            })
            .collect()
    }

    /// Width of the concatenated query heads: `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads: `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The tensors of one transformer block.
#[derive(Clone, Copy, Debug)]
pub struct LlamaLayerWeights<'a> {
    /// `blk.N.attn_norm.weight`, `[hidden]`.
    pub attn_norm: TensorView<'a>,
    /// `blk.N.attn_q.weight`, `[q_dim, hidden]`.
    pub attn_q: TensorView<'a>,
    /// `blk.N.attn_k.weight`, `[kv_dim, hidden]`.
    pub attn_k: TensorView<'a>,
    /// `blk.N.attn_v.weight`, `[kv_dim, hidden]`.
    pub attn_v: TensorView<'a>,
    /// `blk.N.attn_output.weight`, `[hidden, q_dim]`.
    pub attn_output: TensorView<'a>,
    /// `blk.N.ffn_norm.weight`, `[hidden]`.
    pub ffn_norm: TensorView<'a>,
    /// `blk.N.ffn_gate.weight`, `[ffn, hidden]`.
    pub ffn_gate: TensorView<'a>,
    /// `blk.N.ffn_up.weight`, `[ffn, hidden]`.
    pub ffn_up: TensorView<'a>,
    /// `blk.N.ffn_down.weight`, `[hidden, ffn]`.
    pub ffn_down: TensorView<'a>,
    /// `blk.N.attn_{q,k,v}.bias` (`[q_dim]`, `[kv_dim]`, `[kv_dim]`) for families with
    /// QKV biases.
    pub qkv_bias: Option<[TensorView<'a>; 3]>,
    /// `blk.N.attn_q_norm.weight`, `blk.N.attn_k_norm.weight` (`[head_dim]` each) for
    /// families with QK-norm.
    pub qk_norm: Option<[TensorView<'a>; 2]>,
    /// `blk.N.post_attention_norm.weight`, `blk.N.post_ffw_norm.weight` (`[hidden]`
    /// each) for families with post-norms.
    pub post_norms: Option<[TensorView<'a>; 2]>,
}

/// Every tensor of a llama model, borrowed from the file and shape-checked
/// against a [`LlamaConfig`]. [`TensorView::to_f32`] dequantizes one to a
/// row-major `[out_features, in_features]` (or `[len]`) `Vec<f32>`.
#[derive(Clone, Debug)]
pub struct LlamaWeights<'a> {
    /// `token_embd.weight`, `[vocab, hidden]`.
    pub token_embd: TensorView<'a>,
    /// The blocks, in order.
    pub layers: Vec<LlamaLayerWeights<'a>>,
    /// `output_norm.weight`, `[hidden]`.
    pub output_norm: TensorView<'a>,
    /// `output.weight`, `[vocab, hidden]`; `None` when tied.
    pub output: Option<TensorView<'a>>,
    /// `rope_freqs.weight`, `[head_dim / 2]`: Llama-3's RoPE frequency factors (pair `i`
    /// turns `factor[i]` times slower), when the file has them.
    pub rope_freqs: Option<TensorView<'a>>,
}

fn shaped<'a>(file: &'a GgufFile, name: &str, shape: &[usize]) -> Result<TensorView<'a>> {
    let t = file.require_tensor(name)?;
    let found = t.shape();
    if found != shape {
        return Err(ImportError::ShapeMismatch {
            name: name.to_owned(),
            expected: shape.to_vec(),
            found,
        });
    }
    Ok(t)
}

impl<'a> LlamaWeights<'a> {
    /// Looks up every tensor of `config` in `file` by its llama.cpp name and
    /// checks its shape ([`ImportError::MissingTensor`],
    /// [`ImportError::ShapeMismatch`]).
    pub fn from_gguf(file: &'a GgufFile, config: &LlamaConfig) -> Result<Self> {
        let c = config;
        let (h, q, kv) = (c.hidden, c.q_dim(), c.kv_dim());
        let token_embd = shaped(file, "token_embd.weight", &[c.vocab_size, h])?;
        let output_norm = shaped(file, "output_norm.weight", &[h])?;
        let output = match file.tensor("output.weight") {
            None if c.tied_output => None,
            None => return Err(ImportError::MissingTensor("output.weight".into())),
            Some(_) => Some(shaped(file, "output.weight", &[c.vocab_size, h])?),
        };
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            None => None,
            Some(_) => Some(shaped(file, "rope_freqs.weight", &[c.head_dim / 2])?),
        };
        let mut layers = Vec::new();
        for i in 0..c.n_layers {
            let t = |name: &str, shape: &[usize]| {
                shaped(file, &format!("blk.{i}.{name}.weight"), shape)
            };
            let bias =
                |name: &str, len: usize| shaped(file, &format!("blk.{i}.{name}.bias"), &[len]);
            let f = &c.family;
            layers.push(LlamaLayerWeights {
                qkv_bias: f
                    .qkv_bias
                    .then(|| {
                        Ok::<_, ImportError>([
                            bias("attn_q", q)?,
                            bias("attn_k", kv)?,
                            bias("attn_v", kv)?,
                        ])
                    })
                    .transpose()?,
                qk_norm: f
                    .qk_norm
                    .then(|| {
                        Ok::<_, ImportError>([
                            t("attn_q_norm", &[c.head_dim])?,
                            t("attn_k_norm", &[c.head_dim])?,
                        ])
                    })
                    .transpose()?,
                post_norms: f
                    .post_norms
                    .then(|| {
                        Ok::<_, ImportError>([
                            t("post_attention_norm", &[h])?,
                            t("post_ffw_norm", &[h])?,
                        ])
                    })
                    .transpose()?,
                attn_norm: t("attn_norm", &[h])?,
                attn_q: t("attn_q", &[q, h])?,
                attn_k: t("attn_k", &[kv, h])?,
                attn_v: t("attn_v", &[kv, h])?,
                attn_output: t("attn_output", &[h, q])?,
                ffn_norm: t("ffn_norm", &[h])?,
                ffn_gate: t("ffn_gate", &[c.ffn, h])?,
                ffn_up: t("ffn_up", &[c.ffn, h])?,
                ffn_down: t("ffn_down", &[h, c.ffn])?,
            });
        }
        Ok(Self {
            token_embd,
            layers,
            output_norm,
            output,
            rope_freqs,
        })
    }

    /// Llama-3's RoPE frequency factors (`rope_freqs.weight`, `[head_dim / 2]`) as f32,
    /// when the file has them: llama.cpp's converter writes them for a checkpoint whose
    /// `rope_scaling.rope_type` is `llama3` (1 for high frequencies, `factor` for low
    /// ones, a smooth blend between), and keeps no scaling type in the metadata. A factor
    /// that is not positive and finite is [`ImportError::InvalidConfig`] (it would turn
    /// every rotation into NaN).
    pub fn rope_factors(&self) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.rope_freqs else {
            return Ok(None);
        };
        let factors = t.to_f32()?;
        if let Some((i, f)) = factors
            .iter()
            .enumerate()
            .find(|(_, f)| !(f.is_finite() && **f > 0.0))
        {
            return Err(ImportError::InvalidConfig(format!(
                "rope_freqs.weight[{i}] = {f}: RoPE frequency factors must be positive and finite"
            )));
        }
        Ok(Some(factors))
    }

    /// The output projection: `output.weight`, or `token_embd.weight` when tied.
    pub fn output_or_tied(&self) -> TensorView<'a> {
        self.output.unwrap_or(self.token_embd)
    }
}
