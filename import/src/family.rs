//! The model families as data: one row per GGUF `general.architecture`, saying how its
//! decoder block computes. The importer ([`crate::LlamaConfig`] reads the row named by
//! the file and the keys it prefixes with the architecture), the reference forward
//! ([`crate::LlamaModel`]) and the executors read these fields instead of keeping a code
//! path per architecture; a new llama-like family is a new row.
//!
//! What is per *file* rather than per family lives in the config: the RoPE base of
//! global and local layers, RoPE scaling (a linear factor, or Llama-3's per-frequency
//! factors in `rope_freqs.weight`), the sliding window, the head dimension.
//!
//! | row | activation | RoPE pairs | QKV bias | QK-norm | post-norms | embedding × | local layers |
//! |-----|-----------|-----------|----------|---------|------------|-------------|--------------|
//! | `llama` (SmolLM2, Llama-2/3) | SiLU-GLU | adjacent | no | no | no | 1 | none |
//! | `qwen2` | SiLU-GLU | half-split | yes | no | no | 1 | none |
//! | `gemma3` | GELU(tanh)-GLU | half-split | no | yes | yes | √hidden | 5 of every 6 |
//!
//! Every row uses RMSNorm with the weight as stored (llama.cpp's Gemma converter stores
//! Gemma's `1 + w`), and a tied output head when the file has no `output.weight`.

use hetsched_kernels::RopeStyle;

use super::error::{ImportError, Result};

/// The normalization every norm of the block uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormStyle {
    /// `x / rms(x) · w`. (LayerNorm families such as Phi-2 are not rows yet.)
    Rms,
}

/// The gated feed-forward's activation: `act(x·Wgate) ⊙ x·Wup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (llama, Qwen2).
    SiluGlu,
    /// GELU with the tanh approximation (Gemma; ggml's `ggml_gelu`).
    GeluTanhGlu,
}

/// What the token embedding is multiplied by before the first block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddingScale {
    /// Nothing (1).
    One,
    /// `√hidden` (Gemma).
    SqrtHidden,
}

/// One model family: how its decoder block computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Family {
    /// The GGUF `general.architecture` string, also the prefix of its metadata keys.
    pub arch: &'static str,
    /// The norm of every block and of the output.
    pub norm: NormStyle,
    /// The feed-forward's activation.
    pub activation: Activation,
    /// Which elements RoPE pairs (llama.cpp's NORM vs NEOX rope types).
    pub rope_style: RopeStyle,
    /// Whether Q, K and V projections add a bias (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// Whether Q and K are RMS-normalized per head before RoPE
    /// (`blk.N.attn_{q,k}_norm.weight`, `[head_dim]`).
    pub qk_norm: bool,
    /// Whether the attention and FFN outputs are RMS-normalized before their residual add
    /// (`blk.N.post_attention_norm.weight`, `blk.N.post_ffw_norm.weight`).
    pub post_norms: bool,
    /// The embedding's scale.
    pub embedding_scale: EmbeddingScale,
    /// Local (sliding-window) layers: with period `p > 0`, layer `i` is global when
    /// `(i + 1) % p == 0` and local otherwise; 0 makes every layer global.
    pub sliding_window_period: usize,
    /// The RoPE base of local layers (llama.cpp hard-codes Gemma 3's 10000; files do not
    /// carry it); global layers use the file's `rope.freq_base`.
    pub local_rope_base: f32,
}

impl Family {
    /// Whether layer `layer` attends through the sliding window (and uses the local RoPE
    /// base).
    pub fn is_local(&self, layer: usize) -> bool {
        let p = self.sliding_window_period;
        p > 0 && !(layer + 1).is_multiple_of(p)
    }

    /// Whether this family computes exactly as the llama row does, so that an executor
    /// written for llama runs it (SmolLM2 and Llama-2/3 do; Qwen2 and Gemma 3 do not).
    pub fn is_llama_like(&self) -> bool {
        *self == LLAMA
    }

    /// The metadata key `arch.suffix` (e.g. `gemma3.block_count`).
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }
}

/// Llama (SmolLM2, Llama-2, Llama-3: RoPE scaling comes from the file).
pub const LLAMA: Family = Family {
    arch: "llama",
    norm: NormStyle::Rms,
    activation: Activation::SiluGlu,
    rope_style: RopeStyle::Adjacent,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    embedding_scale: EmbeddingScale::One,
    sliding_window_period: 0,
    local_rope_base: 10_000.0,
};

/// Qwen2: llama with Q/K/V biases and NEOX (half-split) RoPE.
pub const QWEN2: Family = Family {
    arch: "qwen2",
    rope_style: RopeStyle::HalfSplit,
    qkv_bias: true,
    ..LLAMA
};

/// Gemma 3: GELU-GLU, QK-norm, post-norms, √hidden embedding scale, five local
/// (sliding-window) layers for every global one.
pub const GEMMA3: Family = Family {
    arch: "gemma3",
    norm: NormStyle::Rms,
    activation: Activation::GeluTanhGlu,
    rope_style: RopeStyle::HalfSplit,
    qkv_bias: false,
    qk_norm: true,
    post_norms: true,
    embedding_scale: EmbeddingScale::SqrtHidden,
    sliding_window_period: 6,
    local_rope_base: 10_000.0,
};

/// Every row.
pub const FAMILIES: [Family; 3] = [LLAMA, QWEN2, GEMMA3];

/// The row of architecture `arch`, or [`ImportError::UnsupportedArchitecture`].
pub fn family(arch: &str) -> Result<Family> {
    FAMILIES
        .into_iter()
        .find(|f| f.arch == arch)
        .ok_or_else(|| ImportError::UnsupportedArchitecture(arch.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_by_name_and_gemma_layer_pattern() {
        assert_eq!(family("qwen2").unwrap(), QWEN2);
        assert!(matches!(
            family("gpt2"),
            Err(ImportError::UnsupportedArchitecture(a)) if a == "gpt2"
        ));
        let local: Vec<bool> = (0..12).map(|i| GEMMA3.is_local(i)).collect();
        let global: Vec<usize> = (0..12).filter(|&i| !local[i]).collect();
        assert_eq!(global, [5, 11]);
        assert!(!LLAMA.is_local(0));
        assert!(LLAMA.is_llama_like());
        assert!(!QWEN2.is_llama_like() && !GEMMA3.is_llama_like());
        assert_eq!(GEMMA3.key("block_count"), "gemma3.block_count");
    }
}
