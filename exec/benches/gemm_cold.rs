//! The INT8 GEMM of one chunk (128 rows, SmolLM2-135M's gate/up shape) with *cold*
//! weights, as in a prefill: each product reads a different weight matrix of a set larger
//! than the last-level cache (48 × 884 KiB), at 1 and 2 workers. Row blocks (16, 32, 64
//! rows: what the executor runs is 16) each stream the whole weight matrix, so the block
//! size sets how often each core reads it from memory; column blocks (4 or 8, every row)
//! read each weight once in all, at the cost of biasing the activations once per block
//! and placing each block's columns. Measured in docs/real-execution.md ("Thread
//! scaling"): row blocks of 16 scale 1.95x with cold weights, column blocks
//! 2.1-2.2x.

mod common;

use common::gemm_in_row_blocks;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched_exec::blocks::for_each_block;
use hetsched_kernels::seeded::SeededRng;
use hetsched_kernels::{PackedI8Weights, gemm_i8_cols};

const ROWS: usize = 128;
const MATRICES: usize = 48;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_i8_chunk_cold");
    group.sample_size(20);
    let (k, n) = (576, 1536);
    let ws: Vec<PackedI8Weights> = (0..MATRICES)
        .map(|i| PackedI8Weights::pack(&SeededRng::new(i as u64 + 1).i8s(n * k), n, k))
        .collect();
    let a = SeededRng::new(100).i8s(ROWS * k);
    group.throughput(Throughput::Elements((2 * ROWS * k * n) as u64));
    for threads in [1, 2] {
        let pool = common::pool(threads);
        let mut out = vec![0i32; ROWS * n];
        let mut cold = |id: String, product: &(dyn Fn(&PackedI8Weights, &mut [i32]) + Sync)| {
            // Each product reads the next matrix of the set: cold in every cache.
            let mut next = 0;
            group.bench_function(BenchmarkId::new("blocks", id), |b| {
                b.iter(|| {
                    let w = &ws[next % MATRICES];
                    next += 1;
                    pool.install(|| product(w, &mut out));
                });
            });
        };
        for rows_per_block in [16, 32, 64] {
            cold(
                format!("{k}x{n}/rows{rows_per_block}/t{threads}"),
                &|w, out| gemm_in_row_blocks(&a, k, w, rows_per_block, out),
            );
        }
        for col_blocks in [4, 8] {
            cold(format!("{k}x{n}/cols{col_blocks}/t{threads}"), &|w, out| {
                by_column_blocks(&a, ROWS, w, col_blocks, out)
            });
        }
    }
    group.finish();
}

/// `a[m, k] · wᵀ` in column blocks over the pool, each block's columns placed in `out`.
fn by_column_blocks(a: &[i8], m: usize, w: &PackedI8Weights, col_blocks: usize, out: &mut [i32]) {
    let n = w.n();
    let width = n.div_ceil(32).div_ceil(col_blocks) * 32;
    let ranges: Vec<std::ops::Range<usize>> = (0..n)
        .step_by(width)
        .map(|c| c..(c + width).min(n))
        .collect();
    let mut segs: Vec<Vec<&mut [i32]>> = ranges.iter().map(|_| Vec::with_capacity(m)).collect();
    for row in out.chunks_mut(n) {
        let mut rest = row;
        for (seg, r) in segs.iter_mut().zip(&ranges) {
            let (s, tail) = rest.split_at_mut(r.len());
            seg.push(s);
            rest = tail;
        }
    }
    let blocks = ranges.into_iter().zip(segs).collect();
    for_each_block(
        blocks,
        |(cols, rows): (std::ops::Range<usize>, Vec<&mut [i32]>)| {
            let mut tmp = vec![0i32; m * cols.len()];
            gemm_i8_cols(a, m, w, cols.clone(), &mut tmp);
            for (dst, src) in rows.into_iter().zip(tmp.chunks(cols.len())) {
                dst.copy_from_slice(src);
            }
        },
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
