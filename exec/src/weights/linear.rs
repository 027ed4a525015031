//! The linears' weights in each precision the kernels take: packed f32, per-row INT8 or
//! INT4 with scales, with their outlier shadow rows where the site keeps one.

use hetsched_kernels::reference::quantize_weights_per_row;
use hetsched_kernels::{PackedF32Weights, PackedI8Weights, PackedW4Weights};
use serde::{Deserialize, Serialize};

use crate::shadow::ShadowRows;

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
    ///
    /// [`QuantRule::Groups`]: crate::shadow::QuantRule::Groups
    #[serde(rename = "w4a8-g32")]
    W4a8G32,
    /// W4A8 with INT8 activations scaled per row and group of 128 inputs
    /// ([`QuantRule::Groups128`]): the four weight groups under one activation scale add
    /// their sub-scaled products in i32 before one float step, a faster kernel than
    /// `w4a8-g32`'s at a coarser activation resolution (docs/real-execution.md).
    ///
    /// [`QuantRule::Groups128`]: crate::shadow::QuantRule::Groups128
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

    pub(super) fn new(
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
    ///
    /// [`ExecModel::shadow_report`]: super::ExecModel::shadow_report
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
