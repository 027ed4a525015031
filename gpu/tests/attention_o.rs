//! Attention with the output projection folded in (`GpuBatch::attention_into_residual`)
//! against the unfused path it replaces: `GpuBatch::attention` then the fused GEMM with the
//! residual epilogue, on the same inputs. The attention outputs must agree within 1e-6 (the
//! same kernel body); the residual streams agree within `1e-4 · (Σ|attn·w_o| + |x| + 1e-3)` per
//! element (the fused kernel adds the heads' products one by one with atomics, the GEMM
//! sums all of k first). f32 and f16 weights (f16: both paths round the attention output to
//! f16 and sum in f32), ragged shapes: query blocks cut short, head_dim off 64, n_out off
//! the 64-column groups, a past offset. Where the device cannot fuse (no float atomics, or
//! f32 weights on tensor cores) the call must say so; lavapipe must fuse.

mod common;

use hetsched_gpu::{
    AttentionOutput, AttentionShape, DeviceKind, Elem, FusedGemm, GemmEpilogue, GpuContext,
    GpuError, GpuMatrix,
};
use hetsched_kernels::seeded::SeededRng;

struct Case {
    s: AttentionShape,
    n_out: usize,
}

fn case(
    n_tokens: usize,
    pos0: usize,
    heads: (usize, usize),
    head_dim: usize,
    n_out: usize,
) -> Case {
    Case {
        s: AttentionShape {
            n_tokens,
            pos0,
            kv_len: pos0 + n_tokens,
            n_heads: heads.0,
            n_kv_heads: heads.1,
            head_dim,
        },
        n_out,
    }
}

fn upload(ctx: &GpuContext, w: &[f32], rows: usize, cols: usize, elem: Elem) -> GpuMatrix {
    match elem {
        Elem::F16 => ctx.upload_f32_as_f16(w, rows, cols).unwrap(),
        _ => ctx.upload_f32(w, rows, cols).unwrap(),
    }
}

/// Runs both paths for `c` with W_o of type `elem`; `None` where the device cannot fuse.
fn compare(ctx: &GpuContext, c: &Case, elem: Elem, seed: u64) -> Option<()> {
    let s = &c.s;
    let mut rng = SeededRng::new(seed);
    let (qc, kvc) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let q = ctx
        .upload_f32(&rng.f32s(s.n_tokens * qc), s.n_tokens, qc)
        .unwrap();
    let k = ctx
        .upload_f32(&rng.f32s(s.kv_len * kvc), s.kv_len, kvc)
        .unwrap();
    let v = ctx
        .upload_f32(&rng.f32s(s.kv_len * kvc), s.kv_len, kvc)
        .unwrap();
    let w_host: Vec<f32> = rng.f32s(c.n_out * qc).iter().map(|x| x * 0.5).collect();
    let w = upload(ctx, &w_host, c.n_out, qc, elem);
    let base = rng.f32s(s.n_tokens * c.n_out);
    let x_ref = ctx.upload_f32(&base, s.n_tokens, c.n_out).unwrap();
    let x_fused = ctx.upload_f32(&base, s.n_tokens, c.n_out).unwrap();
    let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
    let (out_ref, out_fused) = (
        ctx.alloc_matrix(s.n_tokens, qc, Elem::F32).unwrap(),
        ctx.alloc_matrix(s.n_tokens, qc, Elem::F32).unwrap(),
    );
    let o = AttentionOutput {
        w_o: &w,
        residual: &x_fused,
        flags: &flags,
        slot: 1,
    };
    if !ctx.attention_fuses_output(s, elem) {
        let mut b = ctx.batch().unwrap();
        let err = b.attention_into_residual(&q, (&k, &v), s, &out_fused, o);
        assert!(matches!(err, Err(GpuError::Unsupported { .. })), "{err:?}");
        return None;
    }
    let residual = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::Residual {
            flags: &flags,
            slot: 2,
        },
    };
    common::run_batch(ctx, |b| {
        b.attention(&q, (&k, &v), s, &out_ref)?;
        b.gemm_fused(&out_ref, &w, &x_ref, residual)
    });
    common::run_batch(ctx, |b| {
        b.attention_into_residual(&q, (&k, &v), s, &out_fused, o)
    });
    let what = format!("{s:?} n_out {} {elem:?}", c.n_out);
    let attn = ctx.download_f32(&out_ref).unwrap();
    // The same arithmetic in both kernels; a driver may still contract differently.
    let unit = vec![1.0; attn.len()];
    common::assert_close(
        &what,
        &ctx.download_f32(&out_fused).unwrap(),
        &attn,
        &unit,
        1e-6,
    );
    let want = ctx.download_f32(&x_ref).unwrap();
    let mut scale = common::abs_dot(&attn, &w_host, s.n_tokens, qc, c.n_out);
    for (sc, x) in scale.iter_mut().zip(&want) {
        *sc += x.abs() + 1e-3;
    }
    let got = ctx.download_f32(&x_fused).unwrap();
    common::assert_close(&what, &got, &want, &scale, 1e-4);
    assert_eq!(
        ctx.download_f32(&flags).unwrap(),
        vec![0.0; 4],
        "{what}: flags"
    );
    Some(())
}

#[test]
fn attention_with_the_output_projection_matches_attention_then_the_gemm() {
    let Some(ctx) = common::gpu() else { return };
    let cases = [
        case(37, 20, (4, 2), 64, 100),
        case(70, 0, (3, 1), 32, 64),
        case(3, 5, (2, 2), 20, 36),
        case(130, 70, (9, 3), 64, 576),
    ];
    let mut fused = 0;
    for (i, c) in cases.iter().enumerate() {
        for elem in [Elem::F32, Elem::F16] {
            fused += usize::from(compare(ctx, c, elem, 11 + i as u64).is_some());
        }
    }
    // Up to 8 tokens run the decode kernel and the few-row o GEMM instead (refused
    // here with Unsupported, checked in `compare`): the 3-token case.
    if ctx.info().kind == DeviceKind::Cpu {
        assert_eq!(
            fused,
            2 * (cases.len() - 1),
            "lavapipe must fuse every case of more than 8 tokens"
        );
    }
}

#[test]
fn a_non_finite_product_raises_the_flag() {
    let Some(ctx) = common::gpu() else { return };
    let s = case(4, 0, (1, 1), 64, 8).s;
    if !ctx.attention_fuses_output(&s, Elem::F16) {
        return;
    }
    let q = ctx.upload_f32(&[0.1; 4 * 64], 4, 64).unwrap();
    let kv = ctx.upload_f32(&[1.0; 4 * 64], 4, 64).unwrap();
    let w = ctx.upload_f32_as_f16(&[6e4; 8 * 64], 8, 64).unwrap();
    let x = ctx.upload_f32(&[0.0; 32], 4, 8).unwrap();
    let flags = ctx.upload_f32(&[0.0; 4], 1, 4).unwrap();
    let out = ctx.alloc_matrix(4, 64, Elem::F32).unwrap();
    // Each product is 64 · 6e4 · 1 (the attention output is all ones): finite in f32.
    let o = AttentionOutput {
        w_o: &w,
        residual: &x,
        flags: &flags,
        slot: 3,
    };
    common::run_batch(ctx, |b| {
        b.attention_into_residual(&q, (&kv, &kv), &s, &out, o)
    });
    assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0; 4]);
    let inf = ctx.upload_f32(&[f32::INFINITY; 4 * 64], 4, 64).unwrap();
    common::run_batch(ctx, |b| {
        b.attention_into_residual(&q, (&kv, &inf), &s, &out, o)
    });
    assert_eq!(ctx.download_f32(&flags).unwrap(), vec![0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn mismatched_operands_are_refused() {
    let Some(ctx) = common::gpu() else { return };
    let s = case(4, 0, (2, 1), 64, 8).s;
    let q = ctx.alloc_matrix(4, 128, Elem::F32).unwrap();
    let kv = ctx.alloc_matrix(4, 64, Elem::F32).unwrap();
    let out = ctx.alloc_matrix(4, 128, Elem::F32).unwrap();
    let flags = ctx.alloc_matrix(1, 4, Elem::F32).unwrap();
    let w_bad = ctx.alloc_matrix(8, 64, Elem::F16).unwrap();
    let x = ctx.alloc_matrix(4, 8, Elem::F32).unwrap();
    let x_bad = ctx.alloc_matrix(3, 8, Elem::F32).unwrap();
    let w = ctx.alloc_matrix(8, 128, Elem::F16).unwrap();
    for (w_o, residual, slot) in [(&w_bad, &x, 0), (&w, &x_bad, 0), (&w, &x, 4)] {
        let o = AttentionOutput {
            w_o,
            residual,
            flags: &flags,
            slot,
        };
        let mut b = ctx.batch().unwrap();
        let err = b.attention_into_residual(&q, (&kv, &kv), &s, &out, o);
        assert!(matches!(err, Err(GpuError::Shape { .. })), "{err:?}");
    }
}
