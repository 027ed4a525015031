//! Fitting a [`StageCost`] to measured samples (`hetsched profile`).
//!
//! The samples of each shape (tokens, past) are first reduced to their mean, each sample
//! clipped at [`CLIP_TO_MEDIAN`] times the shape's median: a lane's busy time is the
//! *sum* of its instances, so the cost to predict is the mean time, slow instances that
//! recur included (a shape's median sat 1-9% under its mean on this machine, and every
//! prediction with it), while an instance slowed tenfold by another process pulls at most
//! to the clip; coefficients are then fitted by least squares of the *relative* error and kept non-negative (a negative launch or rate would price a
//! short chunk below zero); [`fit_stage_cost`] reports the fit's relative error.
//!
//! Why relative: an attention stage's shapes span 70 us (64 tokens, nothing cached) to
//! 4 ms (256 tokens after 1792). Least squares of the absolute error fits the long ones
//! and left the short ones 47-125% too slow on this machine (the flash kernel's
//! per-pair cost is not constant at small sizes), which made a 128-token prompt's
//! prediction 28% long; weighting each shape by 1/duration keeps every shape within about
//! 20% (RMS 7%).

use super::stage::{StageCost, features};
use crate::model::ChunkShape;

/// One measured instance of a stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageSample {
    /// Tokens in the chunk.
    pub tokens: u64,
    /// Tokens before the chunk.
    pub past: u64,
    /// Measured duration, in ns.
    pub ns: f64,
}

/// Fits a [`StageCost`] for `stage` / `precision` to `samples` (least squares,
/// coefficients non-negative), with the pairs term only when `attention`, counted through
/// the stage's sliding `window` if it has one. `None` without samples or when a duration
/// is not positive and finite.
pub fn fit_stage_cost(
    stage: &str,
    precision: &str,
    attention: bool,
    window: Option<u64>,
    samples: &[StageSample],
) -> Option<StageCost> {
    let count = samples.len();
    if samples.is_empty() || samples.iter().any(|s| !(s.ns.is_finite() && s.ns > 0.0)) {
        return None;
    }
    let (means, noise) = shape_means(samples);
    let samples = means.as_slice();
    let features = |s: &StageSample| {
        let shape = ChunkShape {
            tokens: s.tokens,
            past: s.past,
        };
        features(shape, window)
    };
    let terms: &[usize] = match (attention, window) {
        (true, Some(_)) => &[0, 1, 2, 3],
        (true, None) => &[0, 1, 2],
        (false, _) => &[0, 1],
    };
    // Every subset of the terms, the full one first: the best fit whose coefficients are
    // all non-negative (the zero model, always allowed, is the last resort).
    let mut best: Option<([f64; 4], f64)> = None;
    for mask in (1u32..(1 << terms.len())).rev() {
        let used: Vec<usize> = (0..terms.len())
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| terms[i])
            .collect();
        let Some(coef) = least_squares(&used, samples, &features) else {
            continue;
        };
        if coef.iter().any(|&c| c < 0.0) {
            continue;
        }
        let sse: f64 = samples
            .iter()
            .map(|s| ((dot(&coef, &features(s)) - s.ns) / s.ns).powi(2))
            .sum();
        if best.is_none_or(|(_, b)| sse < b) {
            best = Some((coef, sse));
        }
    }
    let coef = best.map_or([0.0; 4], |(c, _)| c);
    let rel_sq: f64 = samples
        .iter()
        .map(|s| ((dot(&coef, &features(s)) - s.ns) / s.ns).powi(2))
        .sum();
    Some(StageCost {
        stage: stage.to_string(),
        precision: precision.to_string(),
        launch_us: coef[0] / 1e3,
        per_token_us: coef[1] / 1e3,
        per_pair_us: coef[2] / 1e3,
        window: window.filter(|_| attention),
        per_window_pair_us: coef[3] / 1e3,
        samples: count as u64,
        fit_error: (rel_sq / samples.len() as f64).sqrt(),
        noise,
    })
}

/// A sample slower than this many times its shape's median counts as this many: another
/// process took the core (the fit's mean keeps slow instances that recur, not those).
pub const CLIP_TO_MEDIAN: f64 = 3.0;

/// The mean duration of each shape's samples (each clipped at [`CLIP_TO_MEDIAN`] times
/// the shape's median), and the median relative deviation of a sample from its shape's
/// median.
fn shape_means(samples: &[StageSample]) -> (Vec<StageSample>, f64) {
    let mut by_shape: std::collections::BTreeMap<(u64, u64), Vec<f64>> = Default::default();
    for s in samples {
        by_shape.entry((s.tokens, s.past)).or_default().push(s.ns);
    }
    let mut deviations = Vec::with_capacity(samples.len());
    let medians = by_shape
        .into_iter()
        .map(|((tokens, past), mut ns)| {
            let median = median(&mut ns);
            deviations.extend(ns.iter().map(|v| (v - median).abs() / median));
            let clip = CLIP_TO_MEDIAN * median;
            let mean = ns.iter().map(|v| v.min(clip)).sum::<f64>() / ns.len() as f64;
            StageSample {
                tokens,
                past,
                ns: mean,
            }
        })
        .collect();
    (medians, median(&mut deviations))
}

/// The median of `values` (the upper middle of an even count; 0 if empty), sorting them.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn dot(coef: &[f64; 4], x: &[f64; 4]) -> f64 {
    coef.iter().zip(x).map(|(c, x)| c * x).sum()
}

/// Least squares of the relative error over the feature columns `used` (the others
/// zero): each shape's row and duration divided by its duration, then the normal equations
/// with the columns scaled to unit size; `None` when they are singular.
fn least_squares(
    used: &[usize],
    samples: &[StageSample],
    features: &dyn Fn(&StageSample) -> [f64; 4],
) -> Option<[f64; 4]> {
    let n = used.len();
    let rows: Vec<[f64; 4]> = samples.iter().map(features).collect();
    let scale: Vec<f64> = used
        .iter()
        .map(|&j| {
            rows.iter()
                .map(|r| r[j].abs())
                .fold(0.0, f64::max)
                .max(1e-300)
        })
        .collect();
    // [A | b] of the normal equations, n x (n + 1).
    let mut a = vec![vec![0.0; n + 1]; n];
    // Weight 1 / duration (durations are positive: checked by the caller), scaled so the
    // smallest weight is 1 and the pivots stay far from the singularity threshold.
    let longest = samples.iter().map(|s| s.ns).fold(0.0, f64::max);
    for (r, s) in rows.iter().zip(samples) {
        let w = longest / s.ns;
        for i in 0..n {
            let xi = w * r[used[i]] / scale[i];
            for j in 0..n {
                a[i][j] += xi * w * r[used[j]] / scale[j];
            }
            a[i][n] += xi * w * s.ns;
        }
    }
    let solution = gauss(a)?;
    let mut coef = [0.0; 4];
    for (i, &j) in used.iter().enumerate() {
        coef[j] = solution[i] / scale[i];
    }
    Some(coef)
}

/// Solves the augmented system by Gaussian elimination with partial pivoting.
fn gauss(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (row, values) in a.iter_mut().enumerate() {
            if row != col {
                let f = values[col] / pivot_row[col];
                for (v, p) in values.iter_mut().zip(&pivot_row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::stage::attended_pairs;

    fn samples(launch: f64, per_token: f64, per_pair: f64, noise: f64) -> Vec<StageSample> {
        let mut out = Vec::new();
        let mut k = 0u32;
        for tokens in [32u64, 64, 128, 256] {
            for chunk in 0..8u64 {
                let shape = ChunkShape {
                    tokens,
                    past: chunk * tokens,
                };
                // A deterministic +-noise pattern.
                k += 1;
                let wobble = 1.0 + noise * if k.is_multiple_of(2) { 1.0 } else { -1.0 };
                let ns =
                    1e3 * (launch + per_token * tokens as f64 + per_pair * attended_pairs(shape));
                out.push(StageSample {
                    tokens,
                    past: shape.past,
                    ns: ns * wobble,
                });
            }
        }
        out
    }

    #[test]
    fn a_fit_recovers_known_coefficients() {
        let fit = fit_stage_cost(
            "attention",
            "w8a8",
            true,
            None,
            &samples(40.0, 1.5, 0.002, 0.0),
        )
        .unwrap();
        assert!((fit.launch_us - 40.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.per_token_us - 1.5).abs() < 1e-9, "{fit:?}");
        assert!((fit.per_pair_us - 0.002).abs() < 1e-12, "{fit:?}");
        assert!(fit.fit_error < 1e-9);
        assert_eq!(fit.samples, 32);
        let linear =
            fit_stage_cost("q", "w8a8", false, None, &samples(10.0, 3.0, 0.0, 0.0)).unwrap();
        assert!((linear.launch_us - 10.0).abs() < 1e-6 && (linear.per_token_us - 3.0).abs() < 1e-9);
        assert_eq!(linear.per_pair_us, 0.0);
    }

    #[test]
    fn noise_shows_in_the_fit_error_and_coefficients_stay_close() {
        let fit = fit_stage_cost(
            "attention",
            "f32",
            true,
            None,
            &samples(40.0, 1.5, 0.002, 0.05),
        )
        .unwrap();
        assert!(fit.fit_error > 0.02 && fit.fit_error < 0.1, "{fit:?}");
        assert!((fit.per_token_us - 1.5).abs() < 0.3, "{fit:?}");
    }

    #[test]
    fn coefficients_are_never_negative() {
        // Time falling with tokens: the best non-negative fit is a constant.
        let falling: Vec<StageSample> = [(32, 900.0), (64, 800.0), (128, 700.0)]
            .into_iter()
            .map(|(tokens, ns)| StageSample {
                tokens,
                past: 0,
                ns,
            })
            .collect();
        let fit = fit_stage_cost("x", "w8a8", false, None, &falling).unwrap();
        assert!(fit.launch_us >= 0.0 && fit.per_token_us >= 0.0, "{fit:?}");
        // The constant of least relative error: sum(1/y) / sum(1/y^2).
        let (s1, s2) = falling.iter().fold((0.0, 0.0), |(a, b), s| {
            (a + 1.0 / s.ns, b + 1.0 / (s.ns * s.ns))
        });
        assert!((fit.launch_us - s1 / s2 / 1e3).abs() < 1e-9, "{fit:?}");
    }

    /// Medians measured by `hetsched profile` on a Zen 5 (SmolLM2-135M, w8a8, 2 threads):
    /// the attention stage, (tokens, past, us). The per-pair cost is higher at small sizes,
    /// so no one line fits every shape; least squares of the absolute error priced
    /// (64, 0) at 157 us (+125%) and (128, 0) at +47%.
    const MEASURED_ATTENTION: [(u64, u64, f64); 14] = [
        (64, 0, 70.0),
        (64, 64, 130.0),
        (64, 256, 267.0),
        (64, 512, 400.0),
        (64, 1024, 679.0),
        (64, 1984, 1288.0),
        (128, 0, 157.0),
        (128, 256, 534.0),
        (128, 1024, 1407.0),
        (128, 1920, 2318.0),
        (256, 0, 496.0),
        (256, 512, 1617.0),
        (256, 1024, 2697.0),
        (256, 1792, 4287.0),
    ];

    #[test]
    fn short_shapes_are_fitted_as_closely_as_long_ones() {
        let samples: Vec<StageSample> = MEASURED_ATTENTION
            .iter()
            .map(|&(tokens, past, us)| StageSample {
                tokens,
                past,
                ns: us * 1e3,
            })
            .collect();
        let fit = fit_stage_cost("attention", "w8a8", true, None, &samples).unwrap();
        let worst = samples
            .iter()
            .map(|s| {
                let shape = ChunkShape {
                    tokens: s.tokens,
                    past: s.past,
                };
                (fit.ns(shape) - s.ns).abs() / s.ns
            })
            .fold(0.0, f64::max);
        assert!(worst < 0.3, "worst relative error {worst}: {fit:?}");
        assert!(fit.fit_error < 0.12, "{fit:?}");
    }

    /// `clean` repeated `reps` times, the first repetition of every shape `slower` times
    /// slower, fitted.
    fn fit_with_one_slow_repetition(reps: usize, slower: f64) -> StageCost {
        let clean = samples(40.0, 1.5, 0.0, 0.0);
        let mut repeated: Vec<StageSample> =
            (0..reps).flat_map(|_| clean.iter().copied()).collect();
        for s in repeated.iter_mut().take(clean.len()) {
            s.ns *= slower;
        }
        let fit = fit_stage_cost("x", "w8a8", false, None, &repeated).unwrap();
        assert_eq!(fit.samples, repeated.len() as u64);
        assert!(fit.fit_error < 1e-9 && fit.noise == 0.0, "{fit:?}");
        fit
    }

    /// A lane's busy time sums its instances: one in ten 1.5x slower makes the mean 5%
    /// longer, and so the cost.
    #[test]
    fn slow_instances_that_recur_count_in_the_cost() {
        let fit = fit_with_one_slow_repetition(10, 1.5);
        assert!((fit.per_token_us - 1.5 * 1.05).abs() < 1e-9, "{fit:?}");
        assert!((fit.launch_us - 40.0 * 1.05).abs() < 1e-9, "{fit:?}");
    }

    /// One repetition in twenty 10x slower (another process took the core) counts as 3x:
    /// the cost grows by 2/20, not by 9/20.
    #[test]
    fn a_preempted_repetition_pulls_the_fit_only_to_the_clip() {
        let fit = fit_with_one_slow_repetition(20, 10.0);
        assert!((fit.per_token_us - 1.5 * 1.1).abs() < 1e-9, "{fit:?}");
    }

    #[test]
    fn bad_durations_give_no_fit() {
        let zero = [StageSample {
            tokens: 8,
            past: 0,
            ns: 0.0,
        }];
        assert!(fit_stage_cost("x", "w8a8", false, None, &zero).is_none());
        assert!(fit_stage_cost("x", "w8a8", false, None, &[]).is_none());
    }
}
