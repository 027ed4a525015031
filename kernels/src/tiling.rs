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
//! The integer GEMMs read their activations as rows padded to whole groups of the
//! packed weights ([`pad_rows`]), so that the microkernels have no tail in `k` either.
//!
//! Every SIMD GEMM (f32, INT8, the W4 variants) is a microkernel, its inner product over
//! a register tile, run by one driver, [`for_each_microtile!`], which picks the
//! microkernel's instantiation for the rows and blocks each tile has.

use std::ops::Range;

/// Output columns per packed weight block.
pub(crate) const BLOCK: usize = 16;
/// Most rows a microkernel computes at once (the row counts `by_rows!` lists).
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

/// Copies activations `a[m, k]` into rows of `row_bytes >= k` bytes (the weights'
/// packed reduction length), XOR-ing every byte with `xor` and filling the padding with
/// `xor` (an encoded zero).
///
/// Done once per GEMM call (O(m·k)) so the microkernels read whole groups with no tail
/// handling.
pub(crate) fn pad_rows(a: &[i8], m: usize, k: usize, row_bytes: usize, xor: u8) -> Vec<u8> {
    assert_eq!(a.len(), m * k, "a must be [m, k]");
    assert!(row_bytes >= k);
    let mut out = vec![xor; m * row_bytes];
    if k == 0 {
        return out;
    }
    for (src, dst) in a.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = (v as u8) ^ xor;
        }
    }
    out
}

/// Runs a microkernel over every tile of the `[m, cols]` output ([`for_each_tile`]):
///
/// ```text
/// for_each_microtile!(m, cols, out, MR, NB, |r0, R, b0, N, tile| body)
/// ```
///
/// tiles of `MR` rows (fewer in the last) and `NB` blocks (1 or 2; fewer at the end).
/// `body` fills rows `0..R` × columns `0..N · BLOCK` of `tile` with output rows
/// `r0..r0 + R` and blocks `b0..b0 + N`; it is compiled once per tile shape, with `R` and
/// `N` constants, so that a microkernel `micro::<R, N>` keeps its accumulators in
/// registers. A closure, so that inside a `#[target_feature]` function the body is
/// compiled with its features and calls the microkernel without `unsafe`.
macro_rules! for_each_microtile {
    (
        $m:expr, $cols:expr, $out:expr, $mr:expr, $nb:expr,
        |$r0:ident, $rows:ident, $b0:ident, $blocks:ident, $tile:ident| $body:expr
    ) => {{
        const { assert!($mr >= 1 && $mr <= $crate::tiling::MR_MAX && ($nb == 1 || $nb == 2)) };
        $crate::tiling::for_each_tile($m, $cols, $out, $mr, $nb, |$r0, rows, $b0, nb, $tile| {
            if $nb == 2 && nb == 2 {
                #[allow(dead_code)]
                const $blocks: usize = 2;
                $crate::tiling::by_rows!(rows, $mr, $rows, $body)
            } else {
                #[allow(dead_code)]
                const $blocks: usize = 1;
                $crate::tiling::by_rows!(rows, $mr, $rows, $body)
            }
        })
    }};
}

/// `body` with the constant `R` equal to `rows` (in `1..=mr`, `mr <= MR_MAX`); the arms
/// past `mr` are constant-false, unreachable code the optimizer drops.
macro_rules! by_rows {
    ($rows:expr, $mr:expr, $R:ident, $body:expr) => {
        $crate::tiling::by_rows!(@arms $rows, $mr, $R, $body, 1 2 3 4 5 6 7 8)
    };
    (@arms $rows:expr, $mr:expr, $R:ident, $body:expr, $($n:literal)*) => {
        match $rows {
            $($n if $n <= $mr => {
                const $R: usize = $n;
                $body
            })*
            _ => unreachable!("rows must be in 1..=MR"),
        }
    };
}

pub(crate) use {by_rows, for_each_microtile};

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

    /// Writes `(row, global column)` codes into rows `0..R` × blocks `0..N` of `tile`.
    fn codes<const R: usize, const N: usize>(r0: usize, b0: usize, tile: &mut Tile<usize>) {
        for r in 0..R {
            for c in 0..N * BLOCK {
                tile[r * TILE_COLS + c] = (r0 + r) * 1000 + b0 * BLOCK + c;
            }
        }
    }

    #[test]
    fn microtile_driver_instantiates_each_tile_shape() {
        for (m, cols) in [
            (1, 0..1),
            (3, 5..40),
            (70, 17..50),
            (9, 0..16),
            (130, 31..65),
        ] {
            let nc = cols.len();
            let check = |out: &[usize]| {
                for i in 0..m {
                    for (t, j) in cols.clone().enumerate() {
                        assert_eq!(out[i * nc + t], i * 1000 + j, "m={m} cols={cols:?}");
                    }
                }
            };
            let mut out = vec![usize::MAX; m * nc];
            for_each_microtile!(m, cols.clone(), &mut out, 1, 1, |r0, R, b0, N, tile| {
                codes::<R, N>(r0, b0, tile)
            });
            check(&out);
            out.fill(usize::MAX);
            let mut largest = (0, 0);
            for_each_microtile!(m, cols.clone(), &mut out, 3, 1, |r0, R, b0, N, tile| {
                largest = (largest.0.max(R), largest.1.max(N));
                codes::<R, N>(r0, b0, tile)
            });
            check(&out);
            assert_eq!(largest, (m.min(3), 1));
            out.fill(usize::MAX);
            for_each_microtile!(m, cols.clone(), &mut out, 8, 2, |r0, R, b0, N, tile| {
                codes::<R, N>(r0, b0, tile)
            });
            check(&out);
        }
    }
}
