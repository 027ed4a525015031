//! An input of a linear layer: f32 rows, or INT8 rows with their scales (per tensor,
//! with the outlier shadow's outliers; or per row and group of inputs).

/// The outliers of a shadowed activation: flat index into the `[rows, k]` activation, and
/// the part its saturated INT8 value misses.
pub type Outliers = Vec<(u32, f32)>;

/// An input of a linear layer.
#[derive(Debug, Clone)]
pub enum Act {
    /// f32 rows (the float path).
    F32(Vec<f32>),
    /// INT8 rows with one per-tensor scale.
    Int8 {
        /// Quantized values.
        q: Vec<i8>,
        /// Scale: real value = q × scale.
        scale: f32,
        /// Outliers beyond the scale's range (shadowing only): flat index and the part
        /// the saturated INT8 value misses.
        outliers: Outliers,
    },
    /// INT8 rows with one scale per row and group of 32 inputs ([`QuantRule::Groups`](crate::QuantRule::Groups)).
    Int8Groups {
        /// Quantized values, `[rows, k]`.
        q: Vec<i8>,
        /// `[rows, k / 32]` scales: real value = q × its group's scale.
        scales: Vec<f32>,
    },
    /// INT8 rows with one scale per row and group of 128 inputs
    /// ([`QuantRule::Groups128`](crate::QuantRule::Groups128)).
    Int8Groups128 {
        /// Quantized values, `[rows, k]`.
        q: Vec<i8>,
        /// `[rows, ceil(k / 128)]` scales: real value = q × its group's scale.
        scales: Vec<f32>,
    },
}
