//! Memory planner speed: `plan_offsets` (every strategy, the best kept) and one greedy
//! strategy, on 10K and 100K buffers shaped like a chunked prefill's: a steady hundred
//! or so live at any time (the horizon grows with the count), sizes log-uniform in
//! 64 B..1 MiB, lifetimes mostly short, one in twenty long. Throughput in buffers/s.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::systems::memory::{Buffer, Strategy, plan_offsets, plan_with};

const COUNTS: [u32; 2] = [10_000, 100_000];

/// splitmix64.
fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` buffers over `n` us: starts uniform, lifetimes up to 100 us, one in twenty up
/// to 2 ms (about 100 live at a time at any `n`).
fn buffers(n: u32) -> Vec<Buffer> {
    let mut seed = 7;
    let horizon = u64::from(n) * 1000;
    (0..n)
        .map(|id| {
            let bytes = (64 << (rng(&mut seed) % 15)) | (rng(&mut seed) % 64);
            let start = rng(&mut seed) % horizon;
            let max_len = if rng(&mut seed).is_multiple_of(20) {
                2_000_000
            } else {
                100_000
            };
            let end = start + 1 + rng(&mut seed) % max_len;
            Buffer {
                id,
                bytes,
                start,
                end,
            }
        })
        .collect()
}

fn planner(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory/planner");
    group.sample_size(10);
    for n in COUNTS {
        let set = buffers(n);
        group.throughput(Throughput::Elements(u64::from(n)));
        group.bench_with_input(BenchmarkId::new("plan_offsets", n), &set, |b, set| {
            b.iter(|| plan_offsets(black_box(set), 64).expect("valid buffers"));
        });
        group.bench_with_input(BenchmarkId::new("greedy-by-size", n), &set, |b, set| {
            b.iter(|| plan_with(black_box(set), 64, Strategy::GreedyBySize).expect("valid"));
        });
    }
    group.finish();
}

criterion_group!(benches, planner);
criterion_main!(benches);
