//! The tensors of a llama-like model borrowed from a GGUF file, each shape-checked
//! against its [`LlamaConfig`].

use super::LlamaConfig;
use crate::error::{ImportError, Result};
use crate::gguf::{GgufFile, TensorView};

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
