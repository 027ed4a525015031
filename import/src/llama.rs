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
use super::family::Family;

mod metadata;
mod weights;

pub use weights::{LlamaLayerWeights, LlamaWeights};

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

impl LlamaConfig {
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
