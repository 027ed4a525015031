//! The weights of a model family's optional decoder-layer steps (QKV biases, per-head
//! QK-norm, post-norms), loaded with the layer; `family.rs` runs the steps.

use hetsched_import::{FamilyTensor, ImportError, LlamaConfig, LlamaSource};
use hetsched_systems::op::Block;

use super::checked;

/// The weights of one layer's optional steps; `None` where the family has no such step.
#[derive(Debug, Default)]
pub struct FamilyWeights {
    /// Q, K and V biases (`[q_dim]`, `[kv_dim]`, `[kv_dim]`).
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Query and key per-head norm weights (`[head_dim]` each).
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// Post-attention and post-FFN norm weights (`[hidden]` each).
    pub post_norms: Option<[Vec<f32>; 2]>,
}

impl FamilyWeights {
    /// Layer `layer`'s optional weights from `source`, the ones `config`'s family has,
    /// each checked for its length.
    pub fn load(
        source: &dyn LlamaSource,
        config: &LlamaConfig,
        layer: usize,
    ) -> Result<Self, ImportError> {
        use FamilyTensor::{KBias, KNorm, PostAttentionNorm, PostFfnNorm, QBias, QNorm, VBias};
        let read = |which: FamilyTensor| {
            let data = source.family_tensor(layer, which)?;
            checked(&which.gguf_name(layer), data, &[which.len(config)])
        };
        let f = &config.family;
        Ok(Self {
            qkv_bias: f
                .qkv_bias
                .then(|| Ok::<_, ImportError>([read(QBias)?, read(KBias)?, read(VBias)?]))
                .transpose()?,
            qk_norm: f
                .qk_norm
                .then(|| Ok::<_, ImportError>([read(QNorm)?, read(KNorm)?]))
                .transpose()?,
            post_norms: f
                .post_norms
                .then(|| Ok::<_, ImportError>([read(PostAttentionNorm)?, read(PostFfnNorm)?]))
                .transpose()?,
        })
    }

    /// The post-norm weight of `block`, if the family has post-norms.
    pub fn post_norm(&self, block: Block) -> Option<&[f32]> {
        let [attention, ffn] = self.post_norms.as_ref()?;
        Some(match block {
            Block::Attention => attention,
            Block::FeedForward => ffn,
        })
    }
}
