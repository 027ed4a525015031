//! Choosing the next token from logits: greedy, or sampling with temperature, top-k and
//! top-p (nucleus) from a seeded ChaCha8 generator, so that a seed gives the same text
//! on every run and machine.
//!
//! The distribution sampled from ([`Sampler::distribution`]): the `top_k` largest logits
//! (ties: the lower id first), softmax of `logit / temperature` over them, then the
//! smallest prefix (most probable first) whose probability reaches `top_p`,
//! renormalised. Temperature 0 is greedy: the largest logit, the lower id on a tie.

use hetsched_kernels::max_f32;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use super::error::GenerateError;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 picks the most probable token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most probable tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the most probable tokens whose probabilities sum to at least this, in (0, 1].
    pub top_p: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for Sampling {
    /// Greedy.
    fn default() -> Self {
        Self::greedy()
    }
}

impl Sampling {
    /// The most probable token every step.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Refuses a temperature below 0 (or not a number), top-k 0 and top-p outside (0, 1].
    pub fn validate(&self) -> Result<(), GenerateError> {
        let bad = |option: &'static str, message: String| {
            Err(GenerateError::InvalidSampling { option, message })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(
                "temperature",
                format!(
                    "{} (give 0 for greedy, or a finite value above 0)",
                    self.temperature
                ),
            );
        }
        if self.top_k == Some(0) {
            return bad("top-k", "0 keeps no token (give at least 1)".into());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top-p", format!("{} (give a value in (0, 1])", self.top_p));
        }
        Ok(())
    }

    /// Whether this picks the most probable token without drawing a random number.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }
}

/// Candidates sorted first when top-p alone cuts the vocabulary: the nucleus is almost
/// always among them, and sorting a few hundred costs nothing next to the full
/// vocabulary (when it is not, the whole vocabulary is sorted).
const NUCLEUS_FIRST: usize = 256;

/// Picks tokens under one [`Sampling`] with its own generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for `sampling` (validated), its generator seeded with `sampling.seed`.
    pub fn new(sampling: Sampling) -> Result<Self, GenerateError> {
        sampling.validate()?;
        Ok(Self {
            sampling,
            rng: ChaCha8Rng::seed_from_u64(sampling.seed),
        })
    }

    /// The settings.
    pub fn sampling(&self) -> &Sampling {
        &self.sampling
    }

    /// The next token after `logits` (`[vocab]`, finite, not empty).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.sampling.is_greedy() {
            return argmax(logits);
        }
        let candidates = self.distribution(logits);
        // A uniform draw in [0, 1) with 53 random bits.
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut cumulative = 0.0;
        for &(id, p) in &candidates {
            cumulative += f64::from(p);
            if u < cumulative {
                return id;
            }
        }
        // Rounding left the sum just below 1: the last candidate.
        candidates
            .last()
            .map_or_else(|| argmax(logits), |&(id, _)| id)
    }

    /// The tokens this sampler can pick after `logits` and their probabilities (summing
    /// to 1), most probable first. Greedy: the one most probable token.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let s = &self.sampling;
        if s.is_greedy() {
            return vec![(argmax(logits), 1.0)];
        }
        let k = s.top_k.unwrap_or(logits.len()).min(logits.len());
        let first = if s.top_p < 1.0 {
            k.min(NUCLEUS_FIRST)
        } else {
            k
        };
        let sorted = largest(logits, first);
        let Some(&best) = sorted.first() else {
            return Vec::new();
        };
        let max = logits[best as usize];
        let weight =
            |id: u32| (f64::from(logits[id as usize] - max) / f64::from(s.temperature)).exp();
        // The softmax's normaliser over the whole top-k set.
        let total: f64 = if first == k {
            sorted.iter().map(|&id| weight(id)).sum()
        } else if k == logits.len() {
            (0..logits.len() as u32).map(weight).sum()
        } else {
            largest(logits, k).iter().map(|&id| weight(id)).sum()
        };
        let probability = |id: u32| (id, weight(id) / total);
        match nucleus(sorted.iter().map(|&id| probability(id)), s.top_p) {
            Some(kept) => kept,
            None => nucleus(largest(logits, k).into_iter().map(probability), s.top_p)
                .unwrap_or_default(),
        }
    }
}

/// The shortest prefix of `sorted` (token and probability, the most probable first) whose
/// probability reaches `top_p`, renormalised; `None` if all of `sorted` falls short (the
/// caller then looks at more candidates; with every candidate, the rounding of a sum
/// just below `top_p` keeps them all).
fn nucleus(sorted: impl Iterator<Item = (u32, f64)>, top_p: f32) -> Option<Vec<(u32, f32)>> {
    let mut kept = Vec::new();
    let mut mass = 0.0;
    // Probabilities come through exp(ln p): a sum meant to equal top_p may land a hair
    // below it.
    let target = f64::from(top_p) - 1e-6;
    for (id, p) in sorted {
        kept.push((id, p));
        mass += p;
        if mass >= target {
            return Some(
                kept.into_iter()
                    .map(|(id, p)| (id, (p / mass) as f32))
                    .collect(),
            );
        }
    }
    (mass >= 1.0 - 1e-6 && !kept.is_empty()).then(|| {
        kept.into_iter()
            .map(|(id, p)| (id, (p / mass) as f32))
            .collect()
    })
}

/// The ids of the `k` largest logits, largest first (ties: the lower id first).
fn largest(logits: &[f32], k: usize) -> Vec<u32> {
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    if k == 0 {
        return Vec::new();
    }
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
        ids.truncate(k);
    }
    ids.sort_unstable_by(order);
    ids
}

/// The id of the largest logit, the lowest id on a tie; a NaN is passed over (0 for no
/// logits, or none but NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    // The largest value first, in vector lanes, then the first position holding it: a
    // running index compared element by element took 27 µs over SmolLM2's 49152 logits,
    // 1% of a 4-bit decode step, against 3 µs.
    let max = max_f32(logits);
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32, top_k: Option<usize>, top_p: f32) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            seed: 7,
        }
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f32]) -> Vec<f32> {
        probs.iter().map(|p| p.ln()).collect()
    }

    fn close(got: &[(u32, f32)], want: &[(u32, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.0, w.0, "{got:?} vs {want:?}");
            assert!((g.1 - w.1).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    /// The first position of the largest value, as a scan element by element finds it: at
    /// lengths with and without a tail of the 16 lanes, the largest in the body, in the
    /// tail and tied across both, NaN passed over (first among them), nothing but negative
    /// infinity.
    #[test]
    fn argmax_is_the_first_largest() {
        let scan = |v: &[f32]| {
            let mut best = 0;
            for (i, &x) in v.iter().enumerate() {
                if x > v[best] || (v[best].is_nan() && !x.is_nan()) {
                    best = i;
                }
            }
            best as u32
        };
        for len in [1, 2, 15, 16, 17, 33, 100, 49152] {
            let base: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1009) as f32 * -0.01)
                .collect();
            let mut cases = vec![base.clone()];
            for at in [0, len / 2, len - 1] {
                let mut v = base.clone();
                v[at] = 3.0;
                cases.push(v.clone());
                v[len - 1 - at / 2] = 3.0;
                cases.push(v.clone());
                v[(at + 1) % len] = f32::NAN;
                cases.push(v);
            }
            cases.push(vec![f32::NEG_INFINITY; len]);
            for v in cases {
                assert_eq!(argmax(&v), scan(&v), "{len}: {:?}", &v[..len.min(20)]);
            }
        }
    }

    #[test]
    fn temperature_one_keeps_the_softmax() {
        let s = Sampler::new(sampling(1.0, None, 1.0)).unwrap();
        let got = s.distribution(&logits_of(&[0.1, 0.2, 0.3, 0.4]));
        close(&got, &[(3, 0.4), (2, 0.3), (1, 0.2), (0, 0.1)]);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = logits_of(&[0.2, 0.8]);
        // T = 0.5 squares the odds: 0.04 : 0.64.
        let sharp = Sampler::new(sampling(0.5, None, 1.0)).unwrap();
        close(
            &sharp.distribution(&logits),
            &[(1, 0.64 / 0.68), (0, 0.04 / 0.68)],
        );
        // T = 2 takes their square roots.
        let flat = Sampler::new(sampling(2.0, None, 1.0)).unwrap();
        let (a, b) = (0.8f32.sqrt(), 0.2f32.sqrt());
        close(
            &flat.distribution(&logits),
            &[(1, a / (a + b)), (0, b / (a + b))],
        );
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let logits = logits_of(&[0.05, 0.5, 0.15, 0.3]);
        let top2 = Sampler::new(sampling(1.0, Some(2), 1.0)).unwrap();
        close(
            &top2.distribution(&logits),
            &[(1, 0.5 / 0.8), (3, 0.3 / 0.8)],
        );
        // 0.5 + 0.3 reaches 0.8: the nucleus stops there.
        let p = Sampler::new(sampling(1.0, None, 0.8)).unwrap();
        close(&p.distribution(&logits), &[(1, 0.5 / 0.8), (3, 0.3 / 0.8)]);
        let p = Sampler::new(sampling(1.0, None, 0.81)).unwrap();
        close(
            &p.distribution(&logits),
            &[(1, 0.5 / 0.95), (3, 0.3 / 0.95), (2, 0.15 / 0.95)],
        );
    }

    #[test]
    fn top_p_beyond_the_first_candidates_sorts_everything() {
        // 1000 equal logits: the nucleus of 0.5 is 500 tokens, past the first 256.
        let logits = vec![0.0; 1000];
        let s = Sampler::new(sampling(1.0, None, 0.5)).unwrap();
        let got = s.distribution(&logits);
        assert_eq!(got.len(), 500);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &(id, p))| id == i as u32 && (p - 1.0 / 500.0).abs() < 1e-6)
        );
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = logits_of(&[0.1, 0.6, 0.3]);
        let mut s = Sampler::new(sampling(1.0, None, 1.0)).unwrap();
        let mut counts = [0usize; 3];
        let draws = 30_000;
        for _ in 0..draws {
            counts[s.sample(&logits) as usize] += 1;
        }
        for (count, p) in counts.iter().zip([0.1, 0.6, 0.3]) {
            // 5 standard deviations of a binomial share at this many draws.
            let sd = (p * (1.0 - p) / draws as f64).sqrt();
            let share = *count as f64 / draws as f64;
            assert!((share - p).abs() < 5.0 * sd, "{counts:?}");
        }
    }

    #[test]
    fn a_seed_repeats_its_draws_and_greedy_takes_the_max() {
        let logits = logits_of(&[0.25, 0.25, 0.25, 0.25]);
        let draw = |seed| {
            let mut s = Sampler::new(Sampling {
                seed,
                ..sampling(1.0, None, 1.0)
            })
            .unwrap();
            (0..32).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let mut greedy = Sampler::new(Sampling::greedy()).unwrap();
        assert_eq!(greedy.sample(&[0.5, 2.0, 2.0, -1.0]), 1);
    }

    #[test]
    fn bad_settings_are_refused() {
        for (s, option) in [
            (sampling(-0.1, None, 1.0), "temperature"),
            (sampling(f32::NAN, None, 1.0), "temperature"),
            (sampling(1.0, Some(0), 1.0), "top-k"),
            (sampling(1.0, None, 0.0), "top-p"),
            (sampling(1.0, None, 1.5), "top-p"),
        ] {
            match Sampler::new(s) {
                Err(GenerateError::InvalidSampling { option: o, .. }) => assert_eq!(o, option),
                other => panic!("{s:?}: {other:?}"),
            }
        }
    }
}
