//! A [`LlamaConfig`] read from GGUF metadata under the architecture's key prefix, each
//! key checked for presence, type and range.

use super::LlamaConfig;
use crate::error::{ImportError, Result};
use crate::family;
use crate::gguf::{GgufFile, Metadata};

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
}
