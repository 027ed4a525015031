//! Traversal of a GEMM output in register tiles, shared by the packed GEMMs.
//!
//! Packed weights come in blocks of [`BLOCK`] output columns. A microkernel
//! computes up to [`MR_MAX`] rows × up to [`TILE_COLS`] columns (whole
//! blocks) into a stack [`Tile`]; [`for_each_tile`] then copies the part that
//! lies inside the requested column range and the real matrix into `out`.
//! Tails (odd `m`, `n` or unaligned column ranges) are therefore handled
//! here, once, in safe code, and the SIMD microkernels only see whole
//! blocks.
//!
//! Every SIMD GEMM (f32, INT8, the W4 variants) is one [`MicroKernel`], its inner
//! product over a register tile, run by one driver, [`for_each_microtile`], which picks
//! the instantiation of the kernel for the rows and blocks each tile has.

use std::ops::Range;

/// Output columns per packed weight block.
pub(crate) const BLOCK: usize = 16;
/// Most rows a microkernel computes at once.
pub(crate) const MR_MAX: usize = 8;
/// Most columns a microkernel computes at once (two blocks).
pub(crate) const TILE_COLS: usize = 2 * BLOCK;
/// Rows of `a` per cache block: a `[MC, k]` slab of activations stays in
/// L1/L2 while every column block of the weights streams past it.
pub(crate) const MC: usize = 64;

/// Microkernel output: row `r`, tile column `c` at `r * TILE_COLS + c`.
pub(crate) type Tile<T> = [T; MR_MAX * TILE_COLS];

/// Calls `kernel(row0, rows, block0, n_blocks, tile)` for every microtile of
/// the `[m, cols]` output and copies the valid part of each tile into `out`,
/// a compact `[m, cols.len()]` matrix.
///
/// `mr <= MR_MAX` rows and `nb * BLOCK <= TILE_COLS` columns per call; the
/// kernel must fill `tile[r * TILE_COLS + c]` for `r < rows` and
/// `c < n_blocks * BLOCK`.
#[inline(always)]
pub(crate) fn for_each_tile<T: Copy + Default>(
    m: usize,
    cols: Range<usize>,
    out: &mut [T],
    mr: usize,
    nb: usize,
    mut kernel: impl FnMut(usize, usize, usize, usize, &mut Tile<T>),
) {
    debug_assert!((1..=MR_MAX).contains(&mr) && nb >= 1 && nb * BLOCK <= TILE_COLS);
    let nc = cols.len();
    debug_assert_eq!(out.len(), m * nc);
    if m == 0 || nc == 0 {
        return;
    }
    let first_block = cols.start / BLOCK;
    let end_block = cols.end.div_ceil(BLOCK);
    let mut tile = [T::default(); MR_MAX * TILE_COLS];
    for r0 in (0..m).step_by(MC) {
        let r1 = (r0 + MC).min(m);
        for b0 in (first_block..end_block).step_by(nb) {
            let nbl = nb.min(end_block - b0);
            let c0 = (b0 * BLOCK).max(cols.start);
            let c1 = ((b0 + nbl) * BLOCK).min(cols.end);
            let src_off = c0 - b0 * BLOCK;
            let dst_off = c0 - cols.start;
            let width = c1 - c0;
            for rr in (r0..r1).step_by(mr) {
                let rows = mr.min(r1 - rr);
                kernel(rr, rows, b0, nbl, &mut tile);
                for i in 0..rows {
                    let dst = (rr + i) * nc + dst_off;
                    let src = i * TILE_COLS + src_off;
                    out[dst..dst + width].copy_from_slice(&tile[src..src + width]);
                }
            }
        }
    }
}

/// The inner product of one register tile: the part of a SIMD GEMM that differs between
/// number formats and instruction sets, run over the output by [`for_each_microtile`].
pub(crate) trait MicroKernel {
    /// The output element (i32 accumulators or f32).
    type Out: Copy + Default;
    /// Most rows a tile has (at most [`MR_MAX`]).
    const MR: usize;
    /// Blocks of [`BLOCK`] columns a full tile has (1 or 2).
    const NB: usize;
    /// Fills rows `0..R` × columns `0..N · BLOCK` of `tile` with the products of output
    /// rows `r0..r0 + R` and blocks `b0..b0 + N`. Implementations are
    /// `#[inline(always)]`: the driver is inlined into a `#[target_feature]` function, and
    /// so must be the kernel for its SIMD code to be compiled with those features.
    fn tile<const R: usize, const N: usize>(&self, r0: usize, b0: usize, tile: &mut Tile<Self::Out>);
}

/// Runs `kernel` over every tile of the `[m, cols]` output (see [`for_each_tile`]): tiles
/// of [`MicroKernel::MR`] rows (fewer in the last) and [`MicroKernel::NB`] blocks (fewer
/// at the end), each with the kernel instantiated for its exact row and block counts.
#[inline(always)]
pub(crate) fn for_each_microtile<K: MicroKernel>(
    kernel: &K,
    m: usize,
    cols: Range<usize>,
    out: &mut [K::Out],
) {
    const { assert!(K::MR >= 1 && K::MR <= MR_MAX && (K::NB == 1 || K::NB == 2)) };
    for_each_tile(m, cols, out, K::MR, K::NB, |r0, rows, b0, nb, tile| {
        if K::NB == 2 && nb == 2 {
            by_rows::<K, 2>(kernel, rows, r0, b0, tile);
        } else {
            by_rows::<K, 1>(kernel, rows, r0, b0, tile);
        }
    });
}

/// Calls the instantiation of `kernel` for `rows` rows and `N` blocks. The arms past
/// [`MicroKernel::MR`] are constant-false, so they are never compiled in.
#[inline(always)]
fn by_rows<K: MicroKernel, const N: usize>(
    kernel: &K,
    rows: usize,
    r0: usize,
    b0: usize,
    tile: &mut Tile<K::Out>,
) {
    match rows {
        1 => kernel.tile::<1, N>(r0, b0, tile),
        2 if K::MR >= 2 => kernel.tile::<2, N>(r0, b0, tile),
        3 if K::MR >= 3 => kernel.tile::<3, N>(r0, b0, tile),
        4 if K::MR >= 4 => kernel.tile::<4, N>(r0, b0, tile),
        5 if K::MR >= 5 => kernel.tile::<5, N>(r0, b0, tile),
        6 if K::MR >= 6 => kernel.tile::<6, N>(r0, b0, tile),
        7 if K::MR >= 7 => kernel.tile::<7, N>(r0, b0, tile),
        8 if K::MR >= 8 => kernel.tile::<8, N>(r0, b0, tile),
        _ => unreachable!("rows must be in 1..=MR"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_output_element_exactly_once() {
        // Kernel writes (row, global column) codes; check the copy-out.
        for (m, cols, mr, nb) in [
            (1, 0..1, 1, 1),
            (3, 5..40, 2, 2),
            (70, 17..50, 8, 2),
            (9, 0..16, 3, 1),
            (130, 31..33, 6, 1),
        ] {
            let nc = cols.len();
            let mut out = vec![usize::MAX; m * nc];
            let mut calls = 0;
            for_each_tile(
                m,
                cols.clone(),
                &mut out,
                mr,
                nb,
                |r0, rows, b0, nbl, tile| {
                    calls += 1;
                    assert!(rows <= mr && nbl <= nb);
                    for r in 0..rows {
                        for c in 0..nbl * BLOCK {
                            tile[r * TILE_COLS + c] = (r0 + r) * 1000 + b0 * BLOCK + c;
                        }
                    }
                },
            );
            assert!(calls > 0);
            for i in 0..m {
                for (t, j) in cols.clone().enumerate() {
                    assert_eq!(out[i * nc + t], i * 1000 + j, "m={m} cols={cols:?}");
                }
            }
        }
    }
}
