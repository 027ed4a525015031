//! Comparing logits in the integration tests.

/// The largest absolute difference between `got` and `want`, relative to the largest
/// magnitude in `want` (the tolerance the logit tests state).
pub fn max_relative_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}
