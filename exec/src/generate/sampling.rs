//! Choosing the next token from logits: greedy, or sampling with temperature, top-k and
//! top-p (nucleus) from a seeded ChaCha8 generator, so that a seed gives the same text
//! on every run and machine.
//!
//! The distribution sampled from ([`Sampler::distribution`]): the softmax of
//! `logit / temperature` over the vocabulary; of it the `top_k` largest logits (ties:
//! the lower id first), renormalised; then, with `top_p` below 1, the smallest prefix
//! (most probable first) whose probability reaches `top_p`, renormalised. A draw walks
//! the kept tokens most probable first. Temperature 0 is greedy: the largest logit, the
//! lower id on a tie.
//!
//! A draw costs a few passes over the vocabulary, not a sort of it: the softmax in vector
//! lanes ([`softmax_in_place`]), and the ranking of the few tokens whose weight is within
//! [`FIRST_TIER_LN`] of the largest, past which a draw or a nucleus rarely reaches (when
//! it does, the top-k set is ranked whole). Sorting SmolLM2's 49152 logits for every
//! token, as a draw at temperature alone once did, took longer than a 4-bit decode step.

use hetsched_kernels::{max_f32, softmax_in_place};
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

/// The first tier of candidates: tokens whose `(logit - max) / temperature` is at least
/// this, so whose weight is at least e^-9.21 ≈ 1e-4 of the most probable token's. They
/// are ranked first; the rest only when a draw or a nucleus reaches past them.
pub const FIRST_TIER_LN: f32 = -9.21;

/// Picks tokens under one [`Sampling`] with its own generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    rng: ChaCha8Rng,
    /// The vocabulary's probabilities of the last draw, kept for the next one to write
    /// over.
    probabilities: Vec<f32>,
}

impl Sampler {
    /// A sampler for `sampling` (validated), its generator seeded with `sampling.seed`.
    pub fn new(sampling: Sampling) -> Result<Self, GenerateError> {
        sampling.validate()?;
        Ok(Self {
            sampling,
            rng: ChaCha8Rng::seed_from_u64(sampling.seed),
            probabilities: Vec::new(),
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
        // A uniform draw in [0, 1) with 53 random bits.
        let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut probabilities = std::mem::take(&mut self.probabilities);
        let token = draw(&self.sampling, logits, &mut probabilities, u);
        self.probabilities = probabilities;
        token.unwrap_or_else(|| argmax(logits))
    }

    /// The tokens this sampler can pick after `logits` and their probabilities (summing
    /// to 1), most probable first. Greedy: the one most probable token.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        if self.sampling.is_greedy() {
            return vec![(argmax(logits), 1.0)];
        }
        let mut probabilities = Vec::new();
        Candidates::new(&self.sampling, logits, &mut probabilities).kept()
    }
}

/// The token that the uniform draw `u` picks from the distribution of `sampling` after
/// `logits`: the first, most probable first, whose cumulative probability exceeds `u`
/// (the last kept one when rounding leaves the sum just below 1); `None` for no logits.
/// `probabilities` is scratch. Without a nucleus the kept tokens are the top-k set,
/// walked tier by tier: a draw that ends in the first tier ranks nothing else.
fn draw(sampling: &Sampling, logits: &[f32], probabilities: &mut Vec<f32>, u: f64) -> Option<u32> {
    let mut candidates = Candidates::new(sampling, logits, probabilities);
    let mut walk = Walk {
        u,
        cumulative: 0.0,
        last: None,
    };
    if sampling.top_p < 1.0 {
        return walk.over(candidates.kept()).or(walk.last);
    }
    let (first, k) = (candidates.k.min(candidates.first_tier.len()), candidates.k);
    for (from, to) in [(0, first), (first, k)] {
        let ids = candidates.ranked(to)[from..].to_vec();
        let kept = ids
            .iter()
            .map(|&id| (id, candidates.probability(id) as f32));
        if let Some(id) = walk.over(kept) {
            return Some(id);
        }
    }
    walk.last
}

/// A draw's walk over kept tokens, most probable first, across calls.
struct Walk {
    u: f64,
    cumulative: f64,
    last: Option<u32>,
}

impl Walk {
    /// The first of `kept` at which the cumulative probability passes the draw.
    fn over(&mut self, kept: impl IntoIterator<Item = (u32, f32)>) -> Option<u32> {
        for (id, p) in kept {
            self.cumulative += f64::from(p);
            self.last = Some(id);
            if self.u < self.cumulative {
                return Some(id);
            }
        }
        None
    }
}

/// One step's candidates: the vocabulary's probabilities under the temperature, the
/// first tier ranked, and the top-k set's mass.
struct Candidates<'a> {
    sampling: &'a Sampling,
    logits: &'a [f32],
    /// Softmax of `logit / temperature` over the vocabulary.
    probabilities: &'a [f32],
    /// How many tokens the top-k cut keeps (the vocabulary without one).
    k: usize,
    /// The tokens of the first tier ([`FIRST_TIER_LN`]), ranked.
    first_tier: Vec<u32>,
    /// The top-k set ranked whole, once something reaches past the first tier.
    all: Option<Vec<u32>>,
    /// The summed probability of the top-k set (1 when it is the vocabulary).
    top_k_mass: f64,
}

impl<'a> Candidates<'a> {
    fn new(sampling: &'a Sampling, logits: &'a [f32], probabilities: &'a mut Vec<f32>) -> Self {
        let max = max_f32(logits);
        let temperature = sampling.temperature;
        probabilities.clear();
        probabilities.extend(logits.iter().map(|&l| (l - max) / temperature));
        // A prefix of the ranking: a larger logit never scales to a smaller value.
        let mut first_tier = positions_where(probabilities, |v| v >= FIRST_TIER_LN);
        first_tier.sort_unstable_by(|a, b| by_logit(logits, a, b));
        softmax_in_place(probabilities);
        let k = sampling.top_k.unwrap_or(logits.len()).min(logits.len());
        let mut candidates = Self {
            sampling,
            logits,
            probabilities,
            k,
            first_tier,
            all: None,
            top_k_mass: 1.0,
        };
        if k < logits.len() {
            let probabilities = candidates.probabilities;
            candidates.top_k_mass = (candidates.ranked(k).iter())
                .map(|&id| f64::from(probabilities[id as usize]))
                .sum();
        }
        candidates
    }

    /// The `n` (at most `k`) most probable tokens, ranked.
    fn ranked(&mut self, n: usize) -> &[u32] {
        if n <= self.first_tier.len() {
            return &self.first_tier[..n];
        }
        let (logits, k) = (self.logits, self.k);
        &self.all.get_or_insert_with(|| largest(logits, k))[..n]
    }

    /// A top-k candidate's probability within the top-k set (before any nucleus).
    fn probability(&self, id: u32) -> f64 {
        f64::from(self.probabilities[id as usize]) / self.top_k_mass
    }

    /// The first `n` of the top-k set, ranked, each with its [`Candidates::probability`].
    fn ranked_with_probability(&mut self, n: usize) -> Vec<(u32, f64)> {
        let ids = self.ranked(n).to_vec();
        ids.into_iter()
            .map(|id| (id, self.probability(id)))
            .collect()
    }

    /// The kept tokens and their probabilities, most probable first: the top-k set, then
    /// the nucleus of it.
    fn kept(&mut self) -> Vec<(u32, f32)> {
        let (top_p, k) = (self.sampling.top_p, self.k);
        if top_p >= 1.0 {
            return self
                .ranked_with_probability(k)
                .into_iter()
                .map(|(id, p)| (id, p as f32))
                .collect();
        }
        let first = k.min(self.first_tier.len());
        nucleus(self.ranked_with_probability(first).into_iter(), top_p)
            .or_else(|| nucleus(self.ranked_with_probability(k).into_iter(), top_p))
            .unwrap_or_default()
    }
}

/// The ranking of tokens: the larger logit first, the lower id on a tie.
fn by_logit(logits: &[f32], a: &u32, b: &u32) -> std::cmp::Ordering {
    logits[*b as usize]
        .total_cmp(&logits[*a as usize])
        .then(a.cmp(b))
}

/// The shortest prefix of `sorted` (token and probability, the most probable first) whose
/// probability reaches `top_p`, renormalised; `None` if all of `sorted` falls short (the
/// caller then looks at more candidates; with every candidate, the rounding of a sum
/// just below `top_p` keeps them all).
fn nucleus(sorted: impl Iterator<Item = (u32, f64)>, top_p: f32) -> Option<Vec<(u32, f32)>> {
    let mut kept = Vec::new();
    let mut mass = 0.0;
    // Probabilities come through the softmax's rounding: a sum meant to equal top_p may
    // land a hair below it.
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

/// The ids of the `k` largest logits, ranked ([`by_logit`]).
fn largest(logits: &[f32], k: usize) -> Vec<u32> {
    let order = |a: &u32, b: &u32| by_logit(logits, a, b);
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
    // The largest value first, in vector lanes, then the first block of 16 holding it
    // (each block tested whole, without an early exit), then its position there: a
    // running index compared element by element took 27 µs over SmolLM2's 49152 logits,
    // 1% of a 4-bit decode step.
    let max = max_f32(logits);
    let first_block = logits
        .chunks(16)
        .position(|block| block.iter().fold(false, |any, &v| any | (v == max)));
    first_block.map_or(0, |b| {
        let at = b * 16;
        (at + logits[at..].iter().position(|&v| v == max).unwrap_or(0)) as u32
    })
}

/// The positions of `values` that pass `keep`, in order. Blocks of 16 are tested whole
/// first (a test without an early exit, which vectorizes): most hold none, and a scan
/// value by value with a branch each cost several times more over a vocabulary.
fn positions_where(values: &[f32], keep: impl Fn(f32) -> bool) -> Vec<u32> {
    let mut kept = Vec::new();
    for (b, block) in values.chunks(16).enumerate() {
        if block.iter().fold(false, |any, &v| any | keep(v)) {
            let at = b * 16;
            kept.extend(
                (at..at + block.len())
                    .filter(|&i| keep(values[i]))
                    .map(|i| i as u32),
            );
        }
    }
    kept
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
    fn top_p_beyond_the_first_tier_ranks_everything() {
        // 1000 equal logits are one tier: the nucleus of 0.5 is its first 500 tokens.
        let s = Sampler::new(sampling(1.0, None, 0.5)).unwrap();
        let got = s.distribution(&[0.0; 1000]);
        assert_eq!(got.len(), 500);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &(id, p))| id == i as u32 && (p - 1.0 / 500.0).abs() < 1e-6)
        );
        // One token 10 above 1000 others: it alone is the first tier (0.9566 of the
        // mass), and a nucleus of 0.99 reaches about 770 of the others, the lower ids first.
        let mut logits = vec![-10.0; 1001];
        logits[500] = 0.0;
        let s = Sampler::new(sampling(1.0, None, 0.99)).unwrap();
        let got = s.distribution(&logits);
        let tail = (-10f64).exp();
        let needed = ((0.99 - 1e-6) * (1.0 + 1000.0 * tail) - 1.0) / tail;
        assert_eq!(got.len(), 1 + needed.ceil() as usize);
        assert_eq!(got[0].0, 500);
        assert!(
            got[1..]
                .iter()
                .enumerate()
                .all(|(i, &(id, _))| { id == if i < 500 { i as u32 } else { i as u32 + 1 } })
        );
    }

    /// Walks `distribution`'s kept tokens as a draw of `u` does.
    fn reference_draw(s: &Sampler, logits: &[f32], u: f64) -> Option<u32> {
        let kept = s.distribution(logits);
        let mut cumulative = 0.0;
        for &(id, p) in &kept {
            cumulative += f64::from(p);
            if u < cumulative {
                return Some(id);
            }
        }
        kept.last().map(|&(id, _)| id)
    }

    proptest::proptest! {
        /// A draw ranks tier by tier, yet picks the token the whole distribution's walk
        /// picks: random logits (a bell, a lifted few, ties), temperatures, top-k, top-p
        /// and draws, those past the first tier included.
        #[test]
        fn a_draw_picks_the_token_the_distribution_walk_picks(
            seed in 0u64..u64::MAX,
            vocab in 1usize..3000,
            spread in 0.1f32..30.0,
            temperature in 0.05f32..4.0,
            top_k in proptest::option::of(1usize..400),
            top_p in proptest::sample::select(vec![1.0f32, 0.999, 0.95, 0.5, 0.1]),
            u in 0.0f64..1.0,
        ) {
            let mut state = seed | 1;
            let logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Coarse steps, so that ties occur.
                    ((state >> 40) % 64) as f32 / 64.0 * spread
                })
                .collect();
            let setting = sampling(temperature, top_k, top_p);
            proptest::prop_assume!(!setting.is_greedy());
            let s = Sampler::new(setting).unwrap();
            let got = draw(&setting, &logits, &mut Vec::new(), u);
            proptest::prop_assert_eq!(got, reference_draw(&s, &logits, u));
        }
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
