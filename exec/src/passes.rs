//! Element-wise passes of the float lane's stages split in blocks over the pool
//! ([`for_each_block`]): the residual add and the finiteness check of a block's output.
//!
//! Each is one pass over a chunk's `[rows, hidden]` activations (128 × 576 for SmolLM2's
//! chunk of 128): a few microseconds, but once per stage on the lane whose jobs are alone
//! on the pool most of the time at 2 threads (traced: docs/real-execution.md, "Thread
//! scaling"), so a serial pass there keeps the second worker idle. Both give exactly the
//! serial pass's result: the add is element by element, and the first non-finite index is
//! the smallest of the blocks' first ones.

use super::blocks::{ELEMENTS_PER_BLOCK, for_each_block};

/// `x[i] += d[i]` for every `i` (over the shorter of the two), in blocks over the pool.
pub fn add_assign(x: &mut [f32], d: &[f32]) {
    let blocks = x
        .chunks_mut(ELEMENTS_PER_BLOCK)
        .zip(d.chunks(ELEMENTS_PER_BLOCK))
        .collect();
    for_each_block(blocks, |(x, d): (&mut [f32], &[f32])| {
        for (x, d) in x.iter_mut().zip(d) {
            *x += d;
        }
    });
}

/// The index of the first value of `v` that is NaN or infinite, if any, searched in
/// blocks over the pool.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    let firsts: Vec<Option<usize>> = vec![None; v.len().div_ceil(ELEMENTS_PER_BLOCK)];
    let firsts = parking_lot::Mutex::new(firsts);
    let blocks = v.chunks(ELEMENTS_PER_BLOCK).enumerate().collect();
    for_each_block(blocks, |(b, block): (usize, &[f32])| {
        if let Some(i) = block.iter().position(|x| !x.is_finite()) {
            firsts.lock()[b] = Some(b * ELEMENTS_PER_BLOCK + i);
        }
    });
    firsts.into_inner().into_iter().flatten().next()
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::seeded::SeededRng;

    use super::*;

    fn on_pools(check: impl Fn() + Sync) {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(&check);
        }
    }

    #[test]
    fn the_add_in_blocks_equals_the_serial_add() {
        // A chunk's residual (128 x 576: several blocks and a partial one) and short ones.
        for len in [0, 1, 1000, ELEMENTS_PER_BLOCK, 128 * 576] {
            let x0 = SeededRng::new(1).f32s(len);
            let d = SeededRng::new(2).f32s(len);
            let serial: Vec<f32> = x0.iter().zip(&d).map(|(x, d)| x + d).collect();
            on_pools(|| {
                let mut x = x0.clone();
                add_assign(&mut x, &d);
                assert_eq!(x, serial, "length {len}");
            });
        }
    }

    #[test]
    fn the_first_non_finite_value_is_found_in_any_block() {
        let len = 128 * 576;
        let clean = SeededRng::new(3).f32s(len);
        on_pools(|| assert_eq!(first_non_finite(&clean), None));
        on_pools(|| assert_eq!(first_non_finite(&[]), None));
        // Several bad values in different blocks: the first one wins, as in a serial scan.
        for (bad, want) in [
            (vec![len - 1], len - 1),
            (vec![5, 3 * ELEMENTS_PER_BLOCK + 7], 5),
            (
                vec![2 * ELEMENTS_PER_BLOCK + 1, ELEMENTS_PER_BLOCK],
                ELEMENTS_PER_BLOCK,
            ),
        ] {
            for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut v = clean.clone();
                for &i in &bad {
                    v[i] = value;
                }
                let serial = v.iter().position(|x| !x.is_finite());
                assert_eq!(serial, Some(want));
                on_pools(|| assert_eq!(first_non_finite(&v), serial, "{bad:?} {value}"));
            }
        }
    }
}
