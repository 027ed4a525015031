//! The fused GEMM (`GpuBatch::gemm_fused`) against the scalar references chained on the
//! host: RMSNorm then GEMM then RoPE into q and the caches, SiLU·up, the residual add with
//! its non-finite flag. Ragged shapes (rows and columns off the 64x64 tile and the vec4s,
//! k off the 16-deep step), both RoPE styles, a cache offset. Tolerance: `1e-4 · (Σ|a·w| ·
//! rstd + |want|)` per element (the kernel scales the product by the row's norm after the
//! sum instead of scaling the inputs first).

mod common;

use hetsched_gpu::{
    Elem, FusedGemm, GemmEpilogue, RopeStyle, fold_norm, interleave_rows, reorder_rope_rows,
};
use hetsched_kernels::{reference, seeded::SeededRng};

const EPS: f32 = 1e-5;
const BASE: f32 = 10_000.0;

fn normed(x: &[f32], g: &[f32], rows: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    reference::rms_norm(x, g, EPS, &mut out, rows, k);
    out
}

/// The error scale of `norm(x) · wᵀ`: Σ|normed·w| plus the result's magnitude.
fn scale(a: &[f32], w: &[f32], want: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
    common::abs_dot(a, w, m, k, n)
        .iter()
        .zip(want)
        .map(|(s, w)| s + w.abs() + 1e-3)
        .collect()
}

#[test]
fn norm_then_gemm_and_residual_match_the_references() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(7);
    for (m, k, n) in [(1, 4, 4), (5, 36, 20), (70, 100, 132), (130, 576, 68)] {
        let x = rng.f32s(m * k);
        let g = rng.f32s(k);
        let w = rng.f32s(n * k);
        let a = normed(&x, &g, m, k);
        let mut want = vec![0.0; m * n];
        reference::matmul_f32(&a, &w, &mut want, m, k, n);
        let sc = scale(&a, &w, &want, (m, k, n));
        let xm = ctx.upload_f32(&x, m, k).unwrap();
        let wm = ctx.upload_f32(&fold_norm(&w, k, &g), n, k).unwrap();
        let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
        let store = FusedGemm {
            norm_eps: Some(EPS),
            epilogue: GemmEpilogue::Store,
        };
        common::run_batch(ctx, |b| b.gemm_fused(&xm, &wm, &out, store));
        let got = ctx.download_f32(&out).unwrap();
        common::assert_close(&format!("norm+gemm {m}x{k}x{n}"), &got, &want, &sc, 1e-4);

        // Residual: the stream plus the plain product, and no flag for finite sums.
        let base = rng.f32s(m * n);
        let stream = ctx.upload_f32(&base, m, n).unwrap();
        let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
        let wplain = ctx.upload_f32(&w, n, k).unwrap();
        let xa = ctx.upload_f32(&a, m, k).unwrap();
        let residual = FusedGemm {
            norm_eps: None,
            epilogue: GemmEpilogue::Residual {
                flags: &flags,
                slot: 2,
            },
        };
        common::run_batch(ctx, |b| b.gemm_fused(&xa, &wplain, &stream, residual));
        let got = ctx.download_f32(&stream).unwrap();
        let want_sum: Vec<f32> = want.iter().zip(&base).map(|(p, s)| p + s).collect();
        common::assert_close(&format!("residual {m}x{k}x{n}"), &got, &want_sum, &sc, 1e-4);
        assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0; 4]);
    }
}

#[test]
fn residual_raises_its_flag_on_overflow() {
    let Some(ctx) = common::gpu() else { return };
    let a = ctx.upload_f32(&[3e38; 8], 2, 4).unwrap();
    let w = ctx.upload_f32(&[1.0; 12], 3, 4).unwrap();
    let x = ctx.upload_f32(&[0.0; 6], 2, 3).unwrap();
    let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
    let f = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::Residual {
            flags: &flags,
            slot: 1,
        },
    };
    common::run_batch(ctx, |b| b.gemm_fused(&a, &w, &x, f));
    assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0, 1.0, 0.0, 0.0]);
}

#[test]
fn gate_up_silu_matches_the_references() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(11);
    for (m, k, n) in [(1, 4, 2), (9, 40, 34), (67, 96, 130)] {
        let x = rng.f32s(m * k);
        let g = rng.f32s(k);
        let (wg, wu) = (rng.f32s(n * k), rng.f32s(n * k));
        let a = normed(&x, &g, m, k);
        let (mut gate, mut up) = (vec![0.0; m * n], vec![0.0; m * n]);
        reference::matmul_f32(&a, &wg, &mut gate, m, k, n);
        reference::matmul_f32(&a, &wu, &mut up, m, k, n);
        let mut want = vec![0.0; m * n];
        reference::silu_mul(&gate, &up, &mut want);
        // silu(g)·u moves by at most (|u| + |g|)·δ for errors δ of g and u.
        let (sg, su) = (
            common::abs_dot(&a, &wg, m, k, n),
            common::abs_dot(&a, &wu, m, k, n),
        );
        let sc: Vec<f32> = (0..m * n)
            .map(|i| (sg[i] + su[i]) * (1.0 + gate[i].abs() + up[i].abs()) + 1e-3)
            .collect();
        let xm = ctx.upload_f32(&x, m, k).unwrap();
        let w = fold_norm(&interleave_rows(&wg, &wu, k), k, &g);
        let wm = ctx.upload_f32(&w, 2 * n, k).unwrap();
        let out = ctx.alloc_matrix(m, n, Elem::F32).unwrap();
        let f = FusedGemm {
            norm_eps: Some(EPS),
            epilogue: GemmEpilogue::SiluMul,
        };
        common::run_batch(ctx, |b| b.gemm_fused(&xm, &wm, &out, f));
        let got = ctx.download_f32(&out).unwrap();
        common::assert_close(&format!("silu {m}x{k}x{n}"), &got, &want, &sc, 1e-4);
    }
}

struct Qkv {
    heads: usize,
    kv_heads: usize,
    d: usize,
}

#[test]
fn qkv_rope_writes_q_and_the_caches_like_the_references() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(13);
    let shapes = [
        (
            Qkv {
                heads: 4,
                kv_heads: 2,
                d: 8,
            },
            5,
            32,
            3,
        ),
        (
            Qkv {
                heads: 9,
                kv_heads: 3,
                d: 64,
            },
            70,
            96,
            17,
        ),
        (
            Qkv {
                heads: 3,
                kv_heads: 1,
                d: 6,
            },
            3,
            12,
            0,
        ),
    ];
    for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
        for (s, m, k, pos0) in &shapes {
            let (m, k, pos0) = (*m, *k, *pos0);
            let (qc, kvc) = (s.heads * s.d, s.kv_heads * s.d);
            let x = rng.f32s(m * k);
            let g = rng.f32s(k);
            let (wq, wk, wv) = (rng.f32s(qc * k), rng.f32s(kvc * k), rng.f32s(kvc * k));
            let a = normed(&x, &g, m, k);
            let positions: Vec<usize> = (pos0..pos0 + m).collect();
            let project = |w: &[f32], n: usize, heads: Option<usize>| {
                let mut y = vec![0.0; m * n];
                reference::matmul_f32(&a, w, &mut y, m, k, n);
                if let Some(h) = heads {
                    reference::rope(&mut y, &positions, h, s.d, BASE, style);
                }
                // RoPE mixes a head's pairs: the scale is twice the head's largest Σ|a·w|.
                let sc = common::abs_dot(&a, w, m, k, n);
                let scale: Vec<f32> = (0..m * n)
                    .map(|i| {
                        let (row, col) = (i / n, i % n);
                        let head0 = row * n + col - col % s.d;
                        let peak = sc[head0..head0 + s.d].iter().fold(0f32, |p, &v| p.max(v));
                        2.0 * peak + y[i].abs() + 1e-3
                    })
                    .collect();
                (y, scale)
            };
            let (q, q_sc) = project(&wq, qc, Some(s.heads));
            let (kk, k_sc) = project(&wk, kvc, Some(s.kv_heads));
            let (v, v_sc) = project(&wv, kvc, None);
            let mut w = reorder_rope_rows(&wq, k, s.d, style);
            w.extend(reorder_rope_rows(&wk, k, s.d, style));
            w.extend_from_slice(&wv);
            let wm = ctx
                .upload_f32(&fold_norm(&w, k, &g), qc + 2 * kvc, k)
                .unwrap();
            let xm = ctx.upload_f32(&x, m, k).unwrap();
            let qm = ctx.alloc_matrix(m, qc, Elem::F32).unwrap();
            let cap = pos0 + m + 2;
            let kcache = ctx.upload_f32(&vec![7.0; cap * kvc], cap, kvc).unwrap();
            let vcache = ctx.upload_f32(&vec![7.0; cap * kvc], cap, kvc).unwrap();
            let angles = ctx.rope_angles(&positions, s.d, BASE).unwrap();
            let f = FusedGemm {
                norm_eps: Some(EPS),
                epilogue: GemmEpilogue::QkvRope {
                    angles: &angles,
                    caches: (&kcache, &vcache),
                    pos0,
                    n_heads: s.heads,
                    n_kv_heads: s.kv_heads,
                    style,
                },
            };
            common::run_batch(ctx, |b| b.gemm_fused(&xm, &wm, &qm, f));
            let what = format!(
                "{style:?} {m}x{k} heads {}/{} x {}",
                s.heads, s.kv_heads, s.d
            );
            let got_q = ctx.download_f32(&qm).unwrap();
            common::assert_close(&format!("q {what}"), &got_q, &q, &q_sc, 1e-4);
            for (name, cache, want, sc) in [("k", &kcache, &kk, &k_sc), ("v", &vcache, &v, &v_sc)] {
                let got = ctx.download_f32(cache).unwrap();
                let rows = pos0 * kvc..(pos0 + m) * kvc;
                common::assert_close(
                    &format!("{name} {what}"),
                    &got[rows.clone()],
                    want,
                    sc,
                    1e-4,
                );
                // Rows outside the chunk's are left alone.
                assert!(
                    got[..rows.start]
                        .iter()
                        .chain(&got[rows.end..])
                        .all(|&v| v == 7.0)
                );
            }
        }
    }
}

#[test]
fn bad_shapes_are_refused() {
    let Some(ctx) = common::gpu() else { return };
    let a = ctx.alloc_matrix(4, 8, Elem::F32).unwrap();
    let w = ctx.alloc_matrix(6, 8, Elem::F32).unwrap();
    let wrong_k = ctx.alloc_matrix(6, 12, Elem::F32).unwrap();
    let out = ctx.alloc_matrix(4, 6, Elem::F32).unwrap();
    let store = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::Store,
    };
    let mut b = ctx.batch().unwrap();
    assert!(b.gemm_fused(&a, &wrong_k, &out, store).is_err());
    // SiLU needs an output half as wide.
    let silu = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::SiluMul,
    };
    assert!(b.gemm_fused(&a, &w, &out, silu).is_err());
    // q/k/v rows must add up, and the cache must hold the chunk's rows.
    let angles = ctx.rope_angles(&[0, 1, 2, 3], 2, BASE).unwrap();
    let cache = ctx.alloc_matrix(3, 2, Elem::F32).unwrap();
    let qkv = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::QkvRope {
            angles: &angles,
            caches: (&cache, &cache),
            pos0: 0,
            n_heads: 1,
            n_kv_heads: 1,
            style: RopeStyle::Adjacent,
        },
    };
    let q = ctx.alloc_matrix(4, 2, Elem::F32).unwrap();
    assert!(b.gemm_fused(&a, &w, &q, qkv).is_err());
}
