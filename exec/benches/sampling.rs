//! The host's choice of the next token over a vocabulary of SmolLM2's size (49152), as a
//! decode step pays it once per sequence and token: greedy, temperature alone (every
//! token a candidate), temperature with top-p and with top-k. The logits are shaped as
//! a language model's are: most spread around zero, a few hundred well above, one or two
//! far ahead.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hetsched_exec::generate::{Sampler, Sampling};

const VOCAB: usize = 49152;

/// Deterministic logits: a bell around 0 (sums of uniform draws), 300 tokens lifted by 6
/// to 12, and two leaders at 14 and 13.
fn logits() -> Vec<f32> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v: Vec<f32> = (0..VOCAB)
        .map(|_| (0..4).map(|_| uniform()).sum::<f32>() * 2.0 - 4.0)
        .collect();
    for i in 0..300 {
        v[(i * 163) % VOCAB] += 6.0 + 6.0 * uniform();
    }
    v[1234] = 14.0;
    v[4321] = 13.0;
    v
}

fn sampling(c: &mut Criterion) {
    let logits = logits();
    let mut group = c.benchmark_group("sample_49152");
    let settings = [
        ("greedy", Sampling::greedy()),
        (
            "temperature_0.8",
            Sampling {
                temperature: 0.8,
                ..Sampling::greedy()
            },
        ),
        (
            "temperature_0.8_top_p_0.95",
            Sampling {
                temperature: 0.8,
                top_p: 0.95,
                ..Sampling::greedy()
            },
        ),
        (
            "temperature_0.8_top_k_40",
            Sampling {
                temperature: 0.8,
                top_k: Some(40),
                ..Sampling::greedy()
            },
        ),
    ];
    for (name, setting) in settings {
        let mut sampler = Sampler::new(setting).expect("valid settings");
        group.bench_function(name, |b| b.iter(|| sampler.sample(black_box(&logits))));
    }
    group.finish();
}

criterion_group!(benches, sampling);
criterion_main!(benches);
