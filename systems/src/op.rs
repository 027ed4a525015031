//! Operators as declared: their kinds (what the cost model prices), their typed roles
//! (what an operator of the built-in llama layer *is*, the one fact executors bind
//! kernels and weights to) and the declaration of one operator of a layer graph.
//! Operator names are display labels (timeline, errors) and the keys of the graph
//! builder's input wiring, never bindings. What an operator costs on a model is
//! [`crate::model`]'s.
//!
//! A scene's own `layer_ops` may leave the role out: such operators simulate (the cost
//! model needs only their [`OpKind`]) but have no kernel, and a real run refuses them.

use serde::{Deserialize, Serialize};

use crate::shadow::ShadowSite;

/// A linear projection of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Projection {
    /// Queries.
    Q,
    /// Keys (kept for the KV cache).
    K,
    /// Values (kept for the KV cache).
    V,
    /// Attention output.
    O,
    /// FFN gate.
    Gate,
    /// FFN up.
    Up,
    /// FFN down.
    Down,
}

impl Projection {
    /// How many there are.
    pub const COUNT: usize = 7;

    /// Every projection, in declaration order.
    pub const ALL: [Projection; Projection::COUNT] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// Position in declaration order, below [`Projection::COUNT`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The projections reading `site`, in layer order.
    pub fn of_site(site: ShadowSite) -> &'static [Projection] {
        match site {
            ShadowSite::Qkv => &[Projection::Q, Projection::K, Projection::V],
            ShadowSite::O => &[Projection::O],
            ShadowSite::GateUp => &[Projection::Gate, Projection::Up],
            ShadowSite::Down => &[Projection::Down],
        }
    }

    /// The activation this projection reads.
    pub fn site(self) -> ShadowSite {
        ShadowSite::ALL
            .into_iter()
            .find(|&s| Projection::of_site(s).contains(&self))
            .expect("every projection reads one site")
    }

    /// Display label of its operator in the llama layer, e.g. `q_proj`.
    pub fn label(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }
}

/// Which RMSNorm weight a norm reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormSite {
    /// Before attention.
    Attention,
    /// Before the feed-forward block.
    Ffn,
    /// After the last layer.
    Final,
}

/// Which block's output a post-norm normalizes (families with post-norms, e.g. Gemma 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// The attention block (after its output projection).
    Attention,
    /// The feed-forward block (after its down projection).
    FeedForward,
}

/// What an operator of the built-in llama layer does, for the executors to bind.
///
/// In a model file: `role = "rope"`, or with its data, `role = { linear = "q" }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpRole {
    /// Token embedding rows into the residual stream.
    Embed,
    /// RMSNorm of the residual stream with the norm weight of a site.
    Norm(NormSite),
    /// Quantizes a site's activation for the linears reading it (the down site's is
    /// quantized by [`OpRole::SiluMul`]).
    Quantize(ShadowSite),
    /// A linear layer.
    Linear(Projection),
    /// Dequantizes the outputs of the linears reading a site, merging its shadow's
    /// result (Eq. 1): the queries (keys and values are dequantized where the KV cache is
    /// written), the attention output, or the previous layer's FFN output (the carry).
    /// Gate and up are dequantized by [`OpRole::SiluMul`].
    Dequantize(ShadowSite),
    /// RoPE on queries and keys.
    Rope,
    /// Causal attention over the KV cache.
    Attention,
    /// Adds the residual delta to the residual stream.
    Residual,
    /// SiLU(gate) * up, quantized for the down projection.
    SiluMul,
    /// GELU(gate) * up with GELU's tanh approximation (Gemma), quantized for the down
    /// projection: [`OpRole::SiluMul`] with the other activation.
    GeluMul,
    /// Multiplies the embedded tokens by √hidden (Gemma).
    EmbedScale,
    /// Adds the Q, K and V biases (Qwen2): to the queries here, to keys and values where
    /// the KV cache is written.
    QkvBias,
    /// RMSNorm of every query and key head with its `[head_dim]` weight (Gemma 3): the
    /// queries here, the keys where the KV cache is written.
    QkNorm,
    /// RMSNorm of a block's output before its residual add (Gemma).
    PostNorm(Block),
    /// The float shadow of a site's outliers (seed 000, Eq. 1).
    Shadow(ShadowSite),
    /// Final projection of the last token.
    LmHead,
}

impl OpRole {
    /// The operator kind (what the cost model prices) of an operator in this role.
    pub fn kind(self) -> OpKind {
        match self {
            OpRole::Embed => OpKind::Embed,
            OpRole::Norm(_) => OpKind::RmsNorm,
            OpRole::Quantize(_) => OpKind::Quantize,
            OpRole::Linear(_) => OpKind::Linear,
            OpRole::Dequantize(_) => OpKind::Dequantize,
            OpRole::Rope => OpKind::Rope,
            OpRole::Attention => OpKind::Attention,
            OpRole::Residual => OpKind::ResidualAdd,
            OpRole::SiluMul | OpRole::GeluMul => OpKind::SiluMul,
            OpRole::EmbedScale | OpRole::QkvBias => OpKind::Elementwise,
            OpRole::QkNorm | OpRole::PostNorm(_) => OpKind::RmsNorm,
            OpRole::Shadow(_) => OpKind::Shadow,
            OpRole::LmHead => OpKind::LmHead,
        }
    }

    /// The site whose activation this operator writes: what that site's shadow reads.
    pub fn writes_site(self) -> Option<ShadowSite> {
        match self {
            OpRole::Quantize(site) => Some(site),
            OpRole::SiluMul | OpRole::GeluMul => Some(ShadowSite::Down),
            _ => None,
        }
    }

    /// The site whose linears' outputs (and shadow result) this operator consumes.
    pub fn merges_site(self) -> Option<ShadowSite> {
        match self {
            OpRole::Dequantize(site) => Some(site),
            OpRole::SiluMul | OpRole::GeluMul => Some(ShadowSite::GateUp),
            _ => None,
        }
    }
}

/// Which kind of processor an operator needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum ExecClass {
    /// Float work: CPU or GPU.
    Float,
    /// Integer matmul work: the NPU (or a CPU INT8 path when there is no NPU).
    Int8,
}

/// The kinds of operator a decoder layer is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Token embedding lookup.
    Embed,
    /// Residual addition of two hidden-size activations.
    ResidualAdd,
    /// RMS normalisation over the hidden size.
    RmsNorm,
    /// Float -> INT8 per-tensor quantisation of a hidden-size activation.
    Quantize,
    /// INT32/INT8 -> float dequantisation.
    Dequantize,
    /// A linear layer `in_features -> out_features`.
    Linear,
    /// Rotary position embedding on queries and keys.
    Rope,
    /// Causal grouped-query attention over the KV cache (depends on chunk position).
    Attention,
    /// SiLU(gate) * up of the feed-forward block (or GELU(gate) * up: the gated
    /// activation product, whichever the family's activation).
    SiluMul,
    /// Final projection to the vocabulary (last token only during prefill).
    LmHead,
    /// An element-wise float operation over `out_features` (default hidden) columns: a
    /// bias add or a scale.
    Elementwise,
    /// The float shadow of a site's linears: the activation's outliers times the float
    /// weight rows of their channels (`in_features` -> `out_features`, every linear of
    /// the site together; seed 000, Eq. 1).
    Shadow,
}

impl OpKind {
    /// Dynamic operators depend on the chunk's position (not only its length) and so
    /// cannot be shared across chunks (seed 000 section 3.2).
    pub fn is_dynamic(self) -> bool {
        matches!(self, OpKind::Attention)
    }

    /// Operators that read state written by earlier chunks (the KV cache), giving the
    /// cross-chunk dependency of seed 000 Eq. 2.
    pub fn is_cross_chunk(self) -> bool {
        matches!(self, OpKind::Attention)
    }

    /// The processor class used when a declaration does not name one.
    pub fn default_class(self) -> ExecClass {
        match self {
            OpKind::Linear | OpKind::SiluMul => ExecClass::Int8,
            _ => ExecClass::Float,
        }
    }
}

/// Query heads `first .. first + count` of an attention operator: a part of a split
/// attention stage ([`crate::attention_split`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct HeadRange {
    /// First query head.
    pub first: u32,
    /// Query heads in the range, at least 1.
    pub count: u32,
}

impl HeadRange {
    /// The KV heads the range's query heads read, of a model of `heads` query heads and
    /// `kv_heads` KV heads (grouped-query attention: query head `h` reads KV head
    /// `h / (heads / kv_heads)`).
    pub fn kv_heads(self, heads: u32, kv_heads: u32) -> u32 {
        let group = (heads / kv_heads.max(1)).max(1);
        let last = self.first + self.count.max(1) - 1;
        last / group - self.first / group + 1
    }
}

/// One operator as declared in a layer graph (built in, or from a scene's `layer_ops`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpDecl {
    /// Unique name inside the layer, e.g. `q_proj`.
    pub name: String,
    /// Operator kind (what the cost model prices).
    pub kind: OpKind,
    /// What the operator does, for real execution to bind a kernel and weights to; the
    /// built-in operators have one, a scene's own `layer_ops` may leave it out (they
    /// simulate, and a real run refuses them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<OpRole>,
    /// Names of the operators whose outputs this one reads.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Input features of a linear (defaults: hidden).
    #[serde(default)]
    pub in_features: Option<u32>,
    /// Output features of a linear, or the width of a quantize/dequantize (default: hidden).
    #[serde(default)]
    pub out_features: Option<u32>,
    /// Processor class override.
    #[serde(default)]
    pub class: Option<ExecClass>,
    /// Keys each query of an attention operator reads at most (a sliding window); the
    /// graph builder sets it on a local layer's attention ([`crate::ModelConfig::attention_window`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// The query heads an attention operator computes, when it is a part of a split
    /// attention stage ([`crate::attention_split`]); `None`: every head. Set by the plan,
    /// never read from a scene.
    #[serde(skip)]
    pub heads: Option<HeadRange>,
}

impl OpDecl {
    /// A built-in operator: its kind follows from its role; `name` labels it and is
    /// what other operators' `inputs` name.
    pub fn of_role(name: &str, role: OpRole, inputs: &[&str]) -> Self {
        OpDecl {
            name: name.to_string(),
            kind: role.kind(),
            role: Some(role),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            in_features: None,
            out_features: None,
            class: None,
            window: None,
            heads: None,
        }
    }

    pub(crate) fn linear(p: Projection, input: &str, in_features: u32, out_features: u32) -> Self {
        OpDecl {
            in_features: Some(in_features),
            out_features: Some(out_features),
            ..OpDecl::of_role(p.label(), OpRole::Linear(p), &[input])
        }
    }

    /// Whether running the operator reads all of its weights (not the embedding
    /// lookup's few rows).
    pub fn streams_weights(&self) -> bool {
        matches!(self.kind, OpKind::Linear | OpKind::LmHead)
    }

    /// Processor class of this operator.
    pub fn class(&self) -> ExecClass {
        self.class.unwrap_or(self.kind.default_class())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, OpDecl, layer_carry_ops, llama_layer};
    use crate::testing::tiny_model;

    #[test]
    fn the_llama_layer_writes_and_merges_every_site_once() {
        let model = tiny_model(2);
        let layer = llama_layer(&model);
        let with_carry: Vec<_> = layer
            .iter()
            .cloned()
            .chain(layer_carry_ops(&model))
            .collect();
        for site in ShadowSite::ALL {
            let count = |ops: &[OpDecl], probe: fn(OpRole) -> Option<ShadowSite>| {
                ops.iter()
                    .filter(|op| op.role.and_then(probe) == Some(site))
                    .count()
            };
            assert_eq!(count(&layer, OpRole::writes_site), 1, "{site:?}");
            assert_eq!(count(&with_carry, OpRole::merges_site), 1, "{site:?}");
            for &p in Projection::of_site(site) {
                assert_eq!(p.site(), site);
            }
        }
        for op in &with_carry {
            assert_eq!(op.role.map(OpRole::kind), Some(op.kind), "{}", op.name);
        }
    }

    #[test]
    fn a_role_that_does_not_fit_the_kind_is_refused() {
        let model = ModelConfig {
            layer_ops: Some(vec![OpDecl {
                kind: OpKind::RmsNorm,
                ..OpDecl::of_role("w", OpRole::Linear(Projection::Q), &[])
            }]),
            ..tiny_model(1)
        };
        let err = model.validate().unwrap_err().to_string();
        assert!(err.contains("`w`") && err.contains("role"), "{err}");
    }
}
