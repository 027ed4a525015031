//! Which model a calibration belongs to, so that a file made for another model is refused.

use serde::{Deserialize, Serialize};

use hetsched_import::{ImportError, LayerTensor, LlamaConfig, LlamaSource};

/// Which model a calibration belongs to: shapes, name and a fingerprint of its norm
/// weights (FNV-1a over their bits; they differ between checkpoints of one architecture
/// and are stored unquantized in every format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// `general.name` or the checkpoint directory's name.
    pub name: String,
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// FFN size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hex FNV-1a 64 of every norm weight's f32 bits.
    pub fingerprint: String,
    /// Width of the query heads together (the O site's channels), written only where it
    /// is not the hidden size (Gemma 3: 4 heads of 256 on a hidden of 640).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_dim: Option<usize>,
}

impl std::fmt::Display for ModelIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} ({} layers, hidden {}, ffn {}, vocab {}, fingerprint {})",
            self.name, self.layers, self.hidden, self.ffn, self.vocab, self.fingerprint
        )
    }
}

impl ModelIdentity {
    pub(crate) fn new<'a>(
        name: String,
        c: &LlamaConfig,
        norms: impl Iterator<Item = &'a [f32]>,
    ) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for v in norms.flatten() {
            for b in v.to_bits().to_le_bytes() {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Self {
            q_dim: (c.q_dim() != c.hidden).then_some(c.q_dim()),
            name,
            layers: c.n_layers,
            hidden: c.hidden,
            ffn: c.ffn,
            vocab: c.vocab_size,
            fingerprint: format!("{hash:016x}"),
        }
    }

    /// The identity of a model file, read from its norm weights only.
    pub fn of_source(source: &dyn LlamaSource) -> Result<Self, ImportError> {
        let c = source.config();
        let mut norms = Vec::with_capacity(2 * c.n_layers + 1);
        for l in 0..c.n_layers {
            norms.push(source.layer(l, LayerTensor::AttnNorm)?);
            norms.push(source.layer(l, LayerTensor::FfnNorm)?);
        }
        norms.push(source.output_norm()?);
        Ok(Self::new(source.name(), c, norms.iter().map(|v| &v[..])))
    }
}
