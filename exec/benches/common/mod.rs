//! Set-up shared by the INT8 GEMM benches (`gemm_split`, `gemm_cold`): a module, not a
//! bench target of its own (Cargo takes only `benches/*.rs` and `benches/*/main.rs`).

use hetsched_exec::blocks::for_each_block;
use hetsched_kernels::{PackedI8Weights, gemm_i8_cols};

/// A rayon pool of `threads` workers.
pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool")
}

/// `out[rows, n] = a[rows, k] · wᵀ` in blocks of `rows_per_block` rows over the current
/// pool, through `for_each_block`: what the executor runs.
pub fn gemm_in_row_blocks(
    a: &[i8],
    k: usize,
    w: &PackedI8Weights,
    rows_per_block: usize,
    out: &mut [i32],
) {
    let n = w.n();
    let blocks = out
        .chunks_mut(rows_per_block * n)
        .zip(a.chunks(rows_per_block * k))
        .collect();
    for_each_block(blocks, |(o, a)| gemm_i8_cols(a, a.len() / k, w, 0..n, o));
}
