//! The fused GEMM with f16 weights (`GpuBatch::gemm_fused` on tensor cores where the device
//! has KHR cooperative matrices, else the same arithmetic on CUDA cores, which lavapipe
//! runs) against the f32 fused kernel, itself checked against the references in
//! `fused.rs`, on inputs already rounded to f16: both then multiply the same values and
//! differ only in the order of their f32 sums. Every epilogue (store with the norm,
//! residual add, SiLU·up, q/k/v with RoPE into the caches), rows and columns off the 64x64
//! tile, k off the 32-deep step and odd in vec4s (k = 36), a cache offset. Tolerance:
//! `1e-4 · (max |want| + 1)` per output, where a wrong index or a dropped k slice is of
//! the order of the values themselves.

mod common;

use half::f16;
use hetsched_gpu::{
    Elem, FusedGemm, GemmEpilogue, GpuContext, GpuMatrix, RopeStyle, interleave_rows,
    reorder_rope_rows,
};
use hetsched_kernels::seeded::SeededRng;

const EPS: f32 = 1e-5;
const BASE: f32 = 10_000.0;

fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

fn assert_near(what: &str, got: &[f32], want: &[f32]) {
    let peak = want.iter().fold(0f32, |p, v| p.max(v.abs()));
    let scale = vec![peak + 1.0; want.len()];
    common::assert_close(what, got, want, &scale, 1e-4);
}

/// The output of one fused GEMM of `x` `[m, k]` and weights `w` `[n, k]` (both already
/// f16 values), with `w` uploaded as f32 (`f16 == false`) or f16; `out` and `extra` are
/// made fresh per call by `alloc` and read back after it.
fn both<F>(ctx: &GpuContext, x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), call: F)
where
    F: Fn(&GpuMatrix, &GpuMatrix) -> Vec<Vec<f32>>,
{
    let xm = ctx.upload_f32(x, m, k).unwrap();
    let w32 = ctx.upload_f32(w, n, k).unwrap();
    let w16 = ctx.upload_f32_as_f16(w, n, k).unwrap();
    assert_eq!(w16.elem(), Elem::F16);
    let want = call(&xm, &w32);
    let got = call(&xm, &w16);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_near(
            &format!(
                "output {i} of {m}x{k}x{n} (tensor cores: {})",
                ctx.fused_gemm_on_tensor_cores()
            ),
            g,
            w,
        );
    }
}

#[test]
fn f16_weights_store_residual_and_silu_match_the_f32_kernel() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(21);
    for (m, k, n) in [(1, 4, 4), (5, 36, 20), (70, 100, 132), (130, 576, 68)] {
        let x = round_f16(&rng.f32s(m * k));
        let w = round_f16(&rng.f32s(n * k));
        let base = rng.f32s(m * n);
        both(ctx, &x, &w, (m, k, n), |xm, wm| {
            let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
            let f = FusedGemm {
                norm_eps: Some(EPS),
                epilogue: GemmEpilogue::Store,
            };
            common::run_batch(ctx, |b| b.gemm_fused(xm, wm, &out, f));
            let stream = ctx.upload_f32(&base, m, n).unwrap();
            let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
            let residual = FusedGemm {
                norm_eps: None,
                epilogue: GemmEpilogue::Residual {
                    flags: &flags,
                    slot: 3,
                },
            };
            common::run_batch(ctx, |b| b.gemm_fused(xm, wm, &stream, residual));
            assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0; 4]);
            vec![
                ctx.download_f32(&out).unwrap(),
                ctx.download_f32(&stream).unwrap(),
            ]
        });
        if n % 2 == 0 {
            let w = interleave_rows(&w[..n / 2 * k], &w[n / 2 * k..], k);
            both(ctx, &x, &w, (m, k, n), |xm, wm| {
                let out = ctx.alloc_matrix(m, n / 2, Elem::F32).unwrap();
                let f = FusedGemm {
                    norm_eps: Some(EPS),
                    epilogue: GemmEpilogue::SiluMul,
                };
                common::run_batch(ctx, |b| b.gemm_fused(xm, wm, &out, f));
                vec![ctx.download_f32(&out).unwrap()]
            });
        }
    }
}

#[test]
fn f16_weights_overflow_raises_the_flag() {
    let Some(ctx) = common::gpu() else { return };
    // An infinite activation stays infinite through the f16 rounding and the sums.
    let a = ctx.upload_f32(&[f32::INFINITY; 8], 2, 4).unwrap();
    let w = ctx.upload_f32_as_f16(&[1.0; 12], 3, 4).unwrap();
    let x = ctx.upload_f32(&[0.0; 6], 2, 3).unwrap();
    let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
    let f = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::Residual {
            flags: &flags,
            slot: 2,
        },
    };
    common::run_batch(ctx, |b| b.gemm_fused(&a, &w, &x, f));
    assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0, 0.0, 1.0, 0.0]);
}

#[test]
fn f16_weights_qkv_rope_matches_the_f32_kernel() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(23);
    // (heads, kv heads, head_dim, rows, k, pos0)
    let shapes = [
        (4, 2, 8, 5, 32, 3),
        (9, 3, 64, 70, 96, 17),
        (3, 1, 6, 3, 12, 0),
    ];
    for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
        for &(heads, kv_heads, d, m, k, pos0) in &shapes {
            let (qc, kvc) = (heads * d, kv_heads * d);
            let n = qc + 2 * kvc;
            let x = round_f16(&rng.f32s(m * k));
            let raw = rng.f32s(n * k);
            let mut w = reorder_rope_rows(&raw[..qc * k], k, d, style);
            w.extend(reorder_rope_rows(&raw[qc * k..(qc + kvc) * k], k, d, style));
            w.extend_from_slice(&raw[(qc + kvc) * k..]);
            let w = round_f16(&w);
            let positions: Vec<usize> = (pos0..pos0 + m).collect();
            let angles = ctx.rope_angles(&positions, d, BASE).unwrap();
            let cap = pos0 + m + 2;
            both(ctx, &x, &w, (m, k, n), |xm, wm| {
                let q = ctx.alloc_matrix(m, qc, Elem::F32).unwrap();
                let kc = ctx.upload_f32(&vec![7.0; cap * kvc], cap, kvc).unwrap();
                let vc = ctx.upload_f32(&vec![7.0; cap * kvc], cap, kvc).unwrap();
                let f = FusedGemm {
                    norm_eps: Some(EPS),
                    epilogue: GemmEpilogue::QkvRope {
                        angles: &angles,
                        caches: (&kc, &vc),
                        pos0,
                        n_heads: heads,
                        n_kv_heads: kv_heads,
                        style,
                    },
                };
                common::run_batch(ctx, |b| b.gemm_fused(xm, wm, &q, f));
                [&q, &kc, &vc]
                    .iter()
                    .map(|m| ctx.download_f32(m).unwrap())
                    .collect()
            });
        }
    }
}
