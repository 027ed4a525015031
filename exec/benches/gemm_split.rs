//! The INT8 GEMM of one chunk (128 rows, SmolLM2-135M's shapes) split over a pool of 1
//! and 2 workers, in operations per second ("elem/s": 2·m·k·n per product): blocks of
//! 16 rows through `for_each_block` (what the executor runs) beside the same blocks
//! through a rayon parallel iterator (what it ran before). The pool is idle but for the
//! product: this is a job's speed alone, the upper bound of what a lane gets when the
//! other lane has nothing to run.

mod common;

use common::gemm_in_row_blocks;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{PackedI8Weights, gemm_i8_cols};
use rayon::prelude::*;

const ROWS: usize = 128;
const ROWS_PER_TASK: usize = 16;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_i8_chunk_split");
    group.sample_size(30);
    // gate/up, down, O (k, n).
    for (k, n) in [(576, 1536), (1536, 576), (576, 576)] {
        let w = PackedI8Weights::pack(&SeededRng::new(1).i8s(n * k), n, k);
        let a = SeededRng::new(2).i8s(ROWS * k);
        group.throughput(Throughput::Elements((2 * ROWS * k * n) as u64));
        for threads in [1, 2] {
            let pool = common::pool(threads);
            let mut out = vec![0i32; ROWS * n];
            let id = format!("{k}x{n}/t{threads}");
            group.bench_function(BenchmarkId::new("blocks", &id), |b| {
                b.iter(|| {
                    pool.install(|| gemm_in_row_blocks(&a, k, &w, ROWS_PER_TASK, &mut out));
                });
            });
            group.bench_function(BenchmarkId::new("rayon", &id), |b| {
                b.iter(|| {
                    pool.install(|| {
                        out.par_chunks_mut(ROWS_PER_TASK * n)
                            .zip(a.par_chunks(ROWS_PER_TASK * k))
                            .for_each(|(o, a)| gemm_i8_cols(a, a.len() / k, &w, 0..n, o));
                    });
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
