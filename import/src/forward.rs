//! Unchunked f32 reference prefill of a llama-like model: any row of
//! [`crate::family`] (llama, Qwen2, Gemma 3), each step gated by the family's fields.
//!
//! Built only from `hetsched-kernels`: the scalar references for RMSNorm,
//! RoPE, causal GQA attention, SiLU·mul and residual adds, and the f32 GEMM
//! ([`matmul_f32_packed`], tested against the f64-accumulating reference
//! matmul) for the projections. Weights are dequantized to f32 once, at
//! load, and packed for the GEMM.
//!
//! Per block, for the whole prompt `x[n, hidden]` at positions `0..n`:
//!
//! ```text
//! x = embed(tokens) · (√hidden if the family scales embeddings)
//! h = rms_norm(x, attn_norm)
//! q, k, v = h·Wqᵀ (+ bq), h·Wkᵀ (+ bk), h·Wvᵀ (+ bv)      biases: qkv_bias
//! q, k = rms_norm per head (q_norm, k_norm)              qk_norm
//! rope(q), rope(k)   base: local or global; × freq scale, ÷ rope_freqs
//! a = attention(q, k, v) · Woᵀ      local layers: keys within the sliding window
//! x += rms_norm(a, post_attention_norm) or a             post_norms
//! h = rms_norm(x, ffn_norm)
//! f = (act(h·Wgateᵀ) ⊙ h·Wupᵀ) · Wdownᵀ                  act: SiLU or GELU(tanh)
//! x += rms_norm(f, post_ffw_norm) or f                   post_norms
//! ```
//!
//! then `logits = rms_norm(x, output_norm) · Woutᵀ` (`Wout` = `token_embd`
//! when tied).

#[cfg(test)]
mod family_tests;
mod ops;

use hetsched_kernels::{
    AttentionShape, PackedF32Weights, add_inplace, matmul_f32_packed, rms_norm, silu_mul,
};

use super::error::{ImportError, Result};
use super::family::{Activation, EmbeddingScale};
use super::gguf::{GgufFile, TensorView};
use super::llama::{LlamaConfig, LlamaLayerWeights, LlamaWeights};

struct Layer {
    attn_norm: Vec<f32>,
    wq: PackedF32Weights,
    wk: PackedF32Weights,
    wv: PackedF32Weights,
    wo: PackedF32Weights,
    ffn_norm: Vec<f32>,
    w_gate: PackedF32Weights,
    w_up: PackedF32Weights,
    w_down: PackedF32Weights,
    /// Q, K, V biases (families with QKV biases).
    qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head Q and K norm weights (families with QK-norm).
    qk_norm: Option<[Vec<f32>; 2]>,
    /// Post-attention and post-FFN norm weights (families with post-norms).
    post_norms: Option<[Vec<f32>; 2]>,
}

fn f32s<const N: usize>(views: Option<[TensorView<'_>; N]>) -> Result<Option<[Vec<f32>; N]>> {
    views
        .map(|vs| {
            let v: Vec<Vec<f32>> = vs.iter().map(TensorView::to_f32).collect::<Result<_>>()?;
            Ok(v.try_into().expect("N views give N vectors"))
        })
        .transpose()
}

impl Layer {
    fn load(l: &LlamaLayerWeights<'_>) -> Result<Self> {
        Ok(Self {
            attn_norm: l.attn_norm.to_f32()?,
            wq: packed(l.attn_q)?,
            wk: packed(l.attn_k)?,
            wv: packed(l.attn_v)?,
            wo: packed(l.attn_output)?,
            ffn_norm: l.ffn_norm.to_f32()?,
            w_gate: packed(l.ffn_gate)?,
            w_up: packed(l.ffn_up)?,
            w_down: packed(l.ffn_down)?,
            qkv_bias: f32s(l.qkv_bias)?,
            qk_norm: f32s(l.qk_norm)?,
            post_norms: f32s(l.post_norms)?,
        })
    }
}

/// A llama model with every weight dequantized to f32, ready for the
/// reference forward pass.
pub struct LlamaModel {
    config: LlamaConfig,
    token_embd: Vec<f32>,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: PackedF32Weights,
    rope_freqs: Option<Vec<f32>>,
}

impl std::fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaModel")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn packed(t: TensorView<'_>) -> Result<PackedF32Weights> {
    let shape = t.shape();
    let w = t.to_f32()?;
    Ok(PackedF32Weights::pack(&w, shape[0], shape[1]))
}

/// `out[m, w.n()] = a[m, w.k()] · wᵀ`.
fn linear(a: &[f32], m: usize, w: &PackedF32Weights) -> Vec<f32> {
    let mut out = vec![0f32; m * w.n()];
    matmul_f32_packed(a, m, w, &mut out);
    out
}

impl LlamaModel {
    /// Loads the model of `file` with its [`LlamaConfig::from_gguf`] config.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_gguf_with_config(file, LlamaConfig::from_gguf(file)?)
    }

    /// Loads the model of `file` with an explicit `config` (e.g. another
    /// [`LlamaConfig::rope_style`]); it is [validated](LlamaConfig::validate)
    /// and the tensors are shape-checked against it.
    pub fn from_gguf_with_config(file: &GgufFile, config: LlamaConfig) -> Result<Self> {
        config.validate()?;
        let w = LlamaWeights::from_gguf(file, &config)?;
        let token_embd = w.token_embd.to_f32()?;
        let output = match w.output {
            Some(o) => packed(o)?,
            None => PackedF32Weights::pack(&token_embd, config.vocab_size, config.hidden),
        };
        let layers = w.layers.iter().map(Layer::load).collect::<Result<_>>()?;
        Ok(Self {
            rope_freqs: w.rope_factors()?,
            output_norm: w.output_norm.to_f32()?,
            config,
            token_embd,
            layers,
            output,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Row `id` of the token embedding, `[hidden]`.
    pub fn embedding(&self, id: u32) -> Result<&[f32]> {
        let h = self.config.hidden;
        let i = id as usize;
        if i >= self.config.vocab_size {
            return Err(ImportError::TokenOutOfRange {
                id,
                vocab: self.config.vocab_size,
            });
        }
        Ok(&self.token_embd[i * h..(i + 1) * h])
    }

    /// Final hidden states after `output_norm`, row-major `[tokens.len(), hidden]`,
    /// for the prompt `tokens` at positions `0..tokens.len()`.
    pub fn final_hidden(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(ImportError::EmptyPrompt);
        }
        if n > c.context_length {
            return Err(ImportError::PromptTooLong {
                len: n,
                context: c.context_length,
            });
        }
        let h = c.hidden;
        let mut x = Vec::with_capacity(n * h);
        for &id in tokens {
            x.extend_from_slice(self.embedding(id)?);
        }
        if c.family.embedding_scale == EmbeddingScale::SqrtHidden {
            let scale = (h as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let mut normed = vec![0f32; n * h];
        for (i, l) in self.layers.iter().enumerate() {
            rms_norm(&x, &l.attn_norm, c.norm_eps, &mut normed, n, h);
            let attn = self.attention(i, l, &normed, n);
            self.residual(&mut x, attn, l.post_norms.as_ref().map(|p| &p[0]));

            rms_norm(&x, &l.ffn_norm, c.norm_eps, &mut normed, n, h);
            let gate = linear(&normed, n, &l.w_gate);
            let up = linear(&normed, n, &l.w_up);
            let mut act = vec![0f32; n * c.ffn];
            match c.family.activation {
                Activation::SiluGlu => silu_mul(&gate, &up, &mut act),
                Activation::GeluTanhGlu => ops::gelu_tanh_mul(&gate, &up, &mut act),
            }
            let down = linear(&act, n, &l.w_down);
            self.residual(&mut x, down, l.post_norms.as_ref().map(|p| &p[1]));
        }
        rms_norm(&x, &self.output_norm, c.norm_eps, &mut normed, n, h);
        Ok(normed)
    }

    /// `x += y`, after RMS-normalizing `y` with `post_norm` when the family has one.
    fn residual(&self, x: &mut [f32], mut y: Vec<f32>, post_norm: Option<&Vec<f32>>) {
        if let Some(w) = post_norm {
            let input = y.clone();
            rms_norm(
                &input,
                w,
                self.config.norm_eps,
                &mut y,
                x.len() / w.len(),
                w.len(),
            );
        }
        add_inplace(x, &y);
    }

    /// Layer `i`'s attention block on the normed input `h` (`[n, hidden]`), through the
    /// output projection.
    fn attention(&self, i: usize, l: &Layer, h: &[f32], n: usize) -> Vec<f32> {
        let c = &self.config;
        let mut q = linear(h, n, &l.wq);
        let mut k = linear(h, n, &l.wk);
        let mut v = linear(h, n, &l.wv);
        if let Some([bq, bk, bv]) = &l.qkv_bias {
            ops::add_bias(&mut q, bq);
            ops::add_bias(&mut k, bk);
            ops::add_bias(&mut v, bv);
        }
        if let Some([nq, nk]) = &l.qk_norm {
            ops::rms_norm_heads(&mut q, nq, c.norm_eps);
            ops::rms_norm_heads(&mut k, nk, c.norm_eps);
        }
        let freqs = c.rope_frequencies(c.rope_base_of(i), self.rope_freqs.as_deref());
        ops::rope_at_frequencies(&mut q, c.n_heads, c.rope_style, &freqs);
        ops::rope_at_frequencies(&mut k, c.n_kv_heads, c.rope_style, &freqs);
        let d = c.head_dim;
        let shape = AttentionShape {
            n_tokens: n,
            pos0: 0,
            kv_len: n,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: d,
        };
        let attn = ops::attention_windowed(&q, &k, &v, &shape, c.window_of(i));
        linear(&attn, n, &l.wo)
    }

    /// Logits of every position, row-major `[tokens.len(), vocab]`.
    pub fn forward_all(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.final_hidden(tokens)?;
        Ok(linear(&hidden, tokens.len(), &self.output))
    }

    /// Logits of the last position, `[vocab]`: the next-token distribution
    /// after the prompt.
    pub fn forward_last(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.final_hidden(tokens)?;
        let h = self.config.hidden;
        Ok(linear(&hidden[hidden.len() - h..], 1, &self.output))
    }
}

/// `ln Σ exp(logits)`, in f64, shifted by the maximum so that no term overflows.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    logits
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max
}

/// `−ln softmax(logits)[next]`, in f64: one position's negative log-likelihood (the term
/// of a perplexity).
pub fn token_nll(logits: &[f32], next: u32) -> f64 {
    log_sum_exp(logits) - logits[next as usize] as f64
}

/// The `k` most likely tokens of `logits` with their softmax probabilities,
/// most likely first (ties by lower id). NaN logits are ignored.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let denom: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| f64::from(v - max).exp())
        .sum();
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.into_iter()
        .map(|i| {
            (
                i,
                (f64::from(logits[i as usize] - max).exp() / denom) as f32,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::{GgufWriter, TinyModel};

    pub(super) fn rand(len: usize, seed: u64) -> Vec<f32> {
        hetsched_kernels::seeded::SeededRng::new(seed)
            .f32s(len)
            .into_iter()
            .map(|x| x * 0.3)
            .collect()
    }

    /// A 2-layer llama with hidden 8, 2 heads, 1 KV head, ffn 12, vocab 10.
    fn tiny_model(tied: bool) -> GgufFile {
        let m = TinyModel {
            arch: "llama",
            layers: 2,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            ffn: 12,
            vocab: 10,
            context: 16,
            tied,
        };
        let mut seed = 0;
        let w = GgufWriter::tiny_model(&m, |_, n| {
            seed += 1;
            rand(n, seed)
        });
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    #[test]
    fn causal_and_last_row_consistent() {
        for tied in [true, false] {
            let file = tiny_model(tied);
            let model = LlamaModel::from_gguf(&file).unwrap();
            assert_eq!(model.config().tied_output, tied);
            let tokens = [3, 1, 4, 1, 5, 9];
            let all = model.forward_all(&tokens).unwrap();
            assert_eq!(all.len(), 6 * 10);
            assert!(all.iter().all(|v| v.is_finite()));
            let last = model.forward_last(&tokens).unwrap();
            for (a, b) in all[50..].iter().zip(&last) {
                assert!((a - b).abs() < 1e-5);
            }
            // Causality: a prefix's logits equal the full prompt's rows.
            let prefix = model.forward_all(&tokens[..3]).unwrap();
            for (a, b) in prefix.iter().zip(&all[..30]) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
            // Changing a later token changes the last logits.
            let other = model.forward_last(&[3, 1, 4, 1, 5, 2]).unwrap();
            assert_ne!(other, last);
        }
    }

    #[test]
    fn bad_prompts_are_errors() {
        let model = LlamaModel::from_gguf(&tiny_model(true)).unwrap();
        assert!(matches!(
            model.forward_last(&[]),
            Err(ImportError::EmptyPrompt)
        ));
        assert!(matches!(
            model.forward_last(&[10]),
            Err(ImportError::TokenOutOfRange { id: 10, vocab: 10 })
        ));
        assert!(matches!(
            model.forward_last(&[0; 17]),
            Err(ImportError::PromptTooLong {
                len: 17,
                context: 16
            })
        ));
    }

    #[test]
    fn inconsistent_configs_are_errors_not_kernel_panics() {
        let file = tiny_model(true);
        let good = LlamaConfig::from_gguf(&file).unwrap();
        let bad = [
            LlamaConfig {
                n_kv_heads: 3,
                ..good.clone()
            },
            LlamaConfig {
                head_dim: 3,
                ..good.clone()
            },
            LlamaConfig {
                rope_dims: 2,
                ..good.clone()
            },
            LlamaConfig {
                norm_eps: -1.0,
                ..good.clone()
            },
        ];
        for config in bad {
            let err = LlamaModel::from_gguf_with_config(&file, config).unwrap_err();
            assert!(matches!(err, ImportError::InvalidConfig(_)), "{err}");
        }
    }

    #[test]
    fn top_k_orders_and_normalizes() {
        let top = top_k(&[0.0, 2.0, f32::NAN, 1.0, 2.0], 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4, 3]);
        let e = 1f32.exp();
        let z = 1.0 + 2.0 * e * e + e;
        assert!((top[0].1 - e * e / z).abs() < 1e-6);
        assert!((top[2].1 - e / z).abs() < 1e-6);
    }
}
