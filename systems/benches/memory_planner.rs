//! Memory planner speed: `plan_offsets` (every strategy, the best kept), greedy by size
//! (the general placer) and greedy by start (the sweep), on 10K and 100K buffers of two
//! shapes. `random`: a steady hundred or so live at any time (the horizon grows with the
//! count), sizes log-uniform in 64 B..1 MiB, lifetimes mostly short, one in twenty long.
//! `pipeline`: a chunked prefill's, chunks flowing through a chain of stages a few at a
//! time, each stage's output a few sizes and read one to three stages later, with long
//! residual-like buffers: many conflicts, as in `hetsched simulate` at short chunks.
//! Throughput in buffers/s.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_systems::memory::{Buffer, Strategy, plan_offsets, plan_with};

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

/// `n` buffers of a pipelined chunked prefill: 24 stages per chunk, a new chunk every
/// 4 stage times (about 6 chunks in flight); each stage's output is one of four sizes
/// and lives until a stage one to three later ends; every sixth is a residual that
/// lives twelve stages.
fn pipeline(n: u32) -> Vec<Buffer> {
    const STAGES: u64 = 24;
    let mut seed = 11;
    (0..n)
        .map(|id| {
            let (chunk, stage) = (u64::from(id) / STAGES, u64::from(id) % STAGES);
            let start = (chunk * 4 + stage) * 1000 + rng(&mut seed) % 300;
            let reach = if stage % 6 == 0 {
                12
            } else {
                1 + rng(&mut seed) % 3
            };
            Buffer {
                id,
                bytes: [8192, 16384, 22528, 45056][(stage % 4) as usize],
                start,
                end: start + reach * 1000 + rng(&mut seed) % 500,
            }
        })
        .collect()
}

fn planner(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory/planner");
    group.sample_size(10);
    for n in COUNTS {
        for (shape, set) in [("random", buffers(n)), ("pipeline", pipeline(n))] {
            group.throughput(Throughput::Elements(u64::from(n)));
            let id = |what: &str| BenchmarkId::new(format!("{shape}/{what}"), n);
            group.bench_with_input(id("plan_offsets"), &set, |b, set| {
                b.iter(|| plan_offsets(black_box(set), 64).expect("valid buffers"));
            });
            for strategy in [Strategy::GreedyBySize, Strategy::GreedyByStart] {
                group.bench_with_input(id(strategy.name()), &set, |b, set| {
                    b.iter(|| plan_with(black_box(set), 64, strategy).expect("valid"));
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, planner);
criterion_main!(benches);
