//! Element-wise passes split in blocks over the pool ([`for_each_block`]): the float
//! lane's residual add and finiteness check of a block's output, and the FFN's
//! dequantize of gate and up fused with their gated activation.
//!
//! Each is one pass over a chunk's `[rows, hidden]` activations (128 × 576 for SmolLM2's
//! chunk of 128): a few microseconds, but once per stage on the lane whose jobs are alone
//! on the pool most of the time at 2 threads (traced: docs/real-execution.md, "Thread
//! scaling"), so a serial pass there keeps the second worker idle. Both give exactly the
//! serial pass's result: the add is element by element, and the first non-finite index is
//! the smallest of the blocks' first ones.

use std::cell::RefCell;

use hetsched_import::Activation;
use hetsched_kernels::{dequantize_i32_acc_fast, gelu_tanh_mul_fast, silu_mul_fast};

use hetsched_systems::shadow::ShadowSite;

use super::blocks::{ELEMENTS_PER_BLOCK, for_each_block};
use super::error::ExecError;
use super::values::LinearOut;
use super::weights::LinearWeights;

/// `Ok` when `x`, the input of INT8 linears about to be quantized (`site` of `layer`, or
/// the LM head for `None`), is finite; otherwise the error naming where it broke. The
/// quantizer's scale comes from max |x|: an infinity makes it infinite and every quantized
/// value zero, an answer computed from nothing that looks like any other.
pub fn finite_quantize_input(
    x: &[f32],
    at: Option<(usize, ShadowSite)>,
    chunk: usize,
) -> Result<(), ExecError> {
    match first_non_finite(x) {
        None => Ok(()),
        Some(index) => Err(ExecError::NonFiniteQuantizeInput {
            linears: match at {
                Some((layer, site)) => format!("layer {layer}'s {} linears", site.as_str()),
                None => "the LM head".to_string(),
            },
            chunk,
            index,
            value: x[index],
        }),
    }
}

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
    if v.len() <= ELEMENTS_PER_BLOCK {
        // One block (a decode step's rows): no helpers to share it with, so nothing to
        // allocate for them.
        return first_non_finite_in(v);
    }
    let firsts: Vec<Option<usize>> = vec![None; v.len().div_ceil(ELEMENTS_PER_BLOCK)];
    let firsts = parking_lot::Mutex::new(firsts);
    let blocks = v.chunks(ELEMENTS_PER_BLOCK).enumerate().collect();
    for_each_block(blocks, |(b, block): (usize, &[f32])| {
        if let Some(i) = first_non_finite_in(block) {
            firsts.lock()[b] = Some(b * ELEMENTS_PER_BLOCK + i);
        }
    });
    firsts.into_inner().into_iter().flatten().next()
}

/// The first non-finite value of `v`: one pass without an early exit (it vectorizes),
/// then the search only when there is one (a decode step checks every linear's input).
fn first_non_finite_in(v: &[f32]) -> Option<usize> {
    if v.iter().fold(false, |bad, x| bad | !x.is_finite()) {
        v.iter().position(|x| !x.is_finite())
    } else {
        None
    }
}

/// INT32 accumulators without a shadow, their activation scale and weight row scales.
fn plain_int32<'a>(
    out: &'a LinearOut,
    w: &'a LinearWeights,
) -> Option<(&'a [i32], f32, &'a [f32])> {
    let LinearOut::Int32 {
        acc,
        a_scale,
        shadow: None,
    } = out
    else {
        return None;
    };
    Some((acc, *a_scale, w.row_scales()?))
}

/// `activation(gate) · up` of the FFN's two INT32 products, each dequantized (× activation
/// scale × weight row scale) block of rows by block of rows into a scratch the gated
/// product reads at once: one pass over the accumulators instead of three over full
/// f32 copies (the dequantized gate and up of a chunk are 768 KiB each), with the same
/// kernels, so the same values. `None` where a product is not plain INT32 (an outlier
/// shadow to merge, a float or group-scaled product): the caller takes the unfused path.
pub fn dequantize_gated(
    activation: Activation,
    (gate, gate_w): (&LinearOut, &LinearWeights),
    (up, up_w): (&LinearOut, &LinearWeights),
) -> Option<Vec<f32>> {
    let (gate, gate_scale, gate_rows) = plain_int32(gate, gate_w)?;
    let (up, up_scale, up_rows) = plain_int32(up, up_w)?;
    let n = gate_rows.len();
    if n == 0 || up_rows.len() != n || gate.len() != up.len() || gate.len() % n != 0 {
        return None;
    }
    let mut out = vec![0f32; gate.len()];
    let block = (ELEMENTS_PER_BLOCK / n).max(1) * n;
    let blocks = out
        .chunks_mut(block)
        .zip(gate.chunks(block).zip(up.chunks(block)))
        .collect();
    for_each_block(
        blocks,
        |(out, (gate, up)): (&mut [f32], (&[i32], &[i32]))| {
            let rows = gate.len() / n;
            GATED_SCRATCH.with_borrow_mut(|scratch| {
                // Every element is written by the dequantize before it is read: the scratch
                // keeps the last block's values, never needs zeroing, and is allocated once
                // per worker instead of twice per block.
                if scratch.len() < 2 * gate.len() {
                    scratch.resize(2 * gate.len(), 0.0);
                }
                let (g, u) = scratch[..2 * gate.len()].split_at_mut(gate.len());
                dequantize_i32_acc_fast(gate, rows, n, gate_scale, gate_rows, g);
                dequantize_i32_acc_fast(up, rows, n, up_scale, up_rows, u);
                match activation {
                    Activation::SiluGlu => silu_mul_fast(g, u, out),
                    Activation::GeluTanhGlu => gelu_tanh_mul_fast(g, u, out),
                }
            });
        },
    );
    Some(out)
}

thread_local! {
    /// [`dequantize_gated`]'s dequantized gate and up of one block, per worker: two
    /// blocks of f32 (128 KiB), reused from block to block.
    static GATED_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
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

    /// An INT8 linear of `n` outputs (its weights unused here) and a product of `rows`.
    fn int8_product(seed: u64, rows: usize, n: usize) -> (LinearOut, LinearWeights) {
        let mut rng = SeededRng::new(seed);
        let scales: Vec<f32> = rng.f32s(n).iter().map(|s| s.abs() * 0.01 + 1e-4).collect();
        let acc = rng
            .f32s(rows * n)
            .iter()
            .map(|v| (v * 40_000.0) as i32)
            .collect();
        let w = LinearWeights::Int8 {
            packed: hetsched_kernels::PackedI8Weights::pack(&vec![1; n * 4], n, 4),
            scales,
            shadow: None,
        };
        let out = LinearOut::Int32 {
            acc,
            a_scale: 0.0123,
            shadow: None,
        };
        (out, w)
    }

    #[test]
    fn the_fused_gated_dequantize_equals_the_three_passes() {
        // A chunk's FFN (128 x 1536: whole blocks of 10 rows and a partial one), a width
        // that does not divide a block, and a single row.
        for (rows, n) in [(128, 1536), (37, 1000), (1, 64)] {
            let (gate, gate_w) = int8_product(1, rows, n);
            let (up, up_w) = int8_product(2, rows, n);
            for activation in [Activation::SiluGlu, Activation::GeluTanhGlu] {
                let unfused = crate::family::gated(
                    activation,
                    &crate::values::dequantize(gate.clone(), &gate_w).unwrap(),
                    &crate::values::dequantize(up.clone(), &up_w).unwrap(),
                );
                on_pools(|| {
                    let fused = dequantize_gated(activation, (&gate, &gate_w), (&up, &up_w));
                    let fused = fused.expect("plain INT32 products fuse");
                    assert_eq!(fused, unfused, "{rows} x {n}, {activation:?}");
                });
            }
        }
    }

    #[test]
    fn a_shadowed_or_float_product_is_left_to_the_unfused_path() {
        let (gate, gate_w) = int8_product(1, 4, 64);
        let (up, up_w) = int8_product(2, 4, 64);
        let LinearOut::Int32 { acc, a_scale, .. } = up.clone() else {
            unreachable!("an INT32 product")
        };
        let shadowed = LinearOut::Int32 {
            acc,
            a_scale,
            shadow: Some(vec![0.0; 4 * 64]),
        };
        let act = Activation::SiluGlu;
        assert!(dequantize_gated(act, (&gate, &gate_w), (&shadowed, &up_w)).is_none());
        let float = LinearOut::F32(vec![0.0; 4 * 64]);
        assert!(dequantize_gated(act, (&float, &gate_w), (&up, &up_w)).is_none());
        assert!(dequantize_gated(act, (&gate, &gate_w), (&up, &up_w)).is_some());
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
