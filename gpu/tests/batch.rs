//! `GpuBatch`: a decoder-layer-like chain of kernels on resident matrices, two chunks with a
//! KV cache kept on the device, against the scalar references chained on the host:
//! |diff| <= 1e-4 · (1 + |want|) per element. Plus the shape errors a caller can hit.

mod common;

use hetsched_gpu::{AttentionShape, Elem, GpuError, GpuOptions, RopeStyle};
use hetsched_kernels::{reference, seeded::SeededRng};

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const KV_COLS: usize = KV_HEADS * HEAD_DIM;
const BASE: f32 = 10_000.0;
const EPS: f32 = 1e-5;

fn assert_near(what: &str, got: &[f32], want: &[f32]) {
    let scale: Vec<f32> = want.iter().map(|w| 1.0 + w.abs()).collect();
    common::assert_close(what, got, want, &scale, 1e-4);
}

/// One chunk of the host reference: the same chain as the batch below.
struct HostLayer<'a> {
    norm: &'a [f32],
    wq: &'a [f32],
    wk: &'a [f32],
    wv: &'a [f32],
}

impl HostLayer<'_> {
    fn run(
        &self,
        x: &mut [f32],
        pos0: usize,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
    ) -> Vec<f32> {
        let t = x.len() / HIDDEN;
        let positions: Vec<usize> = (pos0..pos0 + t).collect();
        let mut normed = vec![0.0; x.len()];
        reference::rms_norm(x, self.norm, EPS, &mut normed, t, HIDDEN);
        let mut q = vec![0.0; t * HIDDEN];
        let mut k = vec![0.0; t * KV_COLS];
        let mut v = vec![0.0; t * KV_COLS];
        reference::matmul_f32(&normed, self.wq, &mut q, t, HIDDEN, HIDDEN);
        reference::matmul_f32(&normed, self.wk, &mut k, t, HIDDEN, KV_COLS);
        reference::matmul_f32(&normed, self.wv, &mut v, t, HIDDEN, KV_COLS);
        reference::rope(
            &mut q,
            &positions,
            HEADS,
            HEAD_DIM,
            BASE,
            RopeStyle::HalfSplit,
        );
        reference::rope(
            &mut k,
            &positions,
            KV_HEADS,
            HEAD_DIM,
            BASE,
            RopeStyle::HalfSplit,
        );
        k_cache[pos0 * KV_COLS..(pos0 + t) * KV_COLS].copy_from_slice(&k);
        v_cache[pos0 * KV_COLS..(pos0 + t) * KV_COLS].copy_from_slice(&v);
        let kv_len = pos0 + t;
        let mut attn = vec![0.0; t * HIDDEN];
        reference::attention_causal_gqa(
            &q,
            &k_cache[..kv_len * KV_COLS],
            &v_cache[..kv_len * KV_COLS],
            &mut attn,
            &shape(t, pos0),
        );
        reference::add_inplace(x, &attn);
        let mut gated = vec![0.0; x.len()];
        reference::silu_mul(x, &normed, &mut gated);
        gated
    }
}

fn shape(n_tokens: usize, pos0: usize) -> AttentionShape {
    AttentionShape {
        n_tokens,
        pos0,
        kv_len: pos0 + n_tokens,
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
    }
}

#[test]
fn chained_kernels_with_a_resident_kv_cache_match_the_reference() {
    // f32 attention: the chain is checked at 1e-4 (the tensor-core kernel's f16 inputs are
    // checked against the reference in tests/attention.rs).
    let Some(ctx) = common::gpu_with(GpuOptions {
        f32_attention: true,
        ..Default::default()
    }) else {
        return;
    };
    let ctx = &ctx;
    let mut rng = SeededRng::new(7);
    let norm: Vec<f32> = rng.f32s(HIDDEN).iter().map(|w| 1.0 + w).collect();
    let wq = rng.f32s(HIDDEN * HIDDEN);
    let wk = rng.f32s(KV_COLS * HIDDEN);
    let wv = rng.f32s(KV_COLS * HIDDEN);
    let host = HostLayer {
        norm: &norm,
        wq: &wq,
        wk: &wk,
        wv: &wv,
    };
    let chunks = [5usize, 3];
    let prompt: usize = chunks.iter().sum();
    let mut host_k = vec![0.0; prompt * KV_COLS];
    let mut host_v = vec![0.0; prompt * KV_COLS];

    let up = |w: &[f32], rows, cols| ctx.upload_f32(w, rows, cols).unwrap();
    let (g_norm, g_wq, g_wk, g_wv) = (
        up(&norm, 1, HIDDEN),
        up(&wq, HIDDEN, HIDDEN),
        up(&wk, KV_COLS, HIDDEN),
        up(&wv, KV_COLS, HIDDEN),
    );
    let k_cache = ctx.alloc_matrix(prompt, KV_COLS, Elem::F32).unwrap();
    let v_cache = ctx.alloc_matrix(prompt, KV_COLS, Elem::F32).unwrap();

    let mut pos0 = 0;
    for (c, &t) in chunks.iter().enumerate() {
        let mut x = rng.f32s(t * HIDDEN);
        let alloc = |cols| ctx.alloc_matrix(t, cols, Elem::F32).unwrap();
        let (g_x, normed, q, k, v, attn, gated) = (
            alloc(HIDDEN),
            alloc(HIDDEN),
            alloc(HIDDEN),
            alloc(KV_COLS),
            alloc(KV_COLS),
            alloc(HIDDEN),
            alloc(HIDDEN),
        );
        let positions: Vec<usize> = (pos0..pos0 + t).collect();
        let angles = ctx.rope_angles(&positions, HEAD_DIM, BASE).unwrap();
        let mut b = ctx.batch().unwrap();
        b.write(&g_x, 0, &x).unwrap();
        b.rms_norm(&g_x, &g_norm, EPS, &normed).unwrap();
        b.matmul_f32(&normed, &g_wq, &q).unwrap();
        b.matmul_f32(&normed, &g_wk, &k).unwrap();
        b.matmul_f32(&normed, &g_wv, &v).unwrap();
        b.rope(&q, &angles, HEADS, RopeStyle::HalfSplit).unwrap();
        b.rope(&k, &angles, KV_HEADS, RopeStyle::HalfSplit).unwrap();
        b.copy_rows(&k, 0..t, &k_cache, pos0).unwrap();
        b.copy_rows(&v, 0..t, &v_cache, pos0).unwrap();
        b.attention(&q, (&k_cache, &v_cache), &shape(t, pos0), &attn)
            .unwrap();
        b.add_assign(&g_x, &attn).unwrap();
        b.silu_mul(&g_x, &normed, &gated).unwrap();
        b.read(&gated, 0..t).unwrap();
        b.read(&g_x, t - 1..t).unwrap();
        let out = b.submit().unwrap();

        let want = host.run(&mut x, pos0, &mut host_k, &mut host_v);
        assert_near(&format!("chunk {c} gated"), &out.reads[0], &want);
        assert_near(
            &format!("chunk {c} residual, last row"),
            &out.reads[1],
            &x[(t - 1) * HIDDEN..],
        );
        pos0 += t;
    }
}

#[test]
fn shape_mistakes_are_errors_not_panics() {
    let Some(ctx) = common::gpu() else { return };
    let a = ctx.alloc_matrix(2, 8, Elem::F32).unwrap();
    let odd = ctx.alloc_matrix(2, 6, Elem::F32).unwrap();
    let ints = ctx.alloc_matrix(2, 8, Elem::I8).unwrap();
    let small_cache = ctx.alloc_matrix(1, 8, Elem::F32).unwrap();
    let mut b = ctx.batch().unwrap();
    let is_shape = |r: hetsched_gpu::Result<()>| matches!(r, Err(GpuError::Shape { .. }));
    assert!(is_shape(b.add_assign(&a, &odd)), "mismatched shapes");
    assert!(is_shape(b.silu_mul(&odd, &odd, &odd)), "padded rows");
    assert!(is_shape(b.add_assign(&ints, &ints)), "not f32");
    assert!(is_shape(b.write(&a, 1, &[0.0; 16])), "write past the end");
    assert!(is_shape(b.copy_rows(&a, 1..3, &a, 0)), "copy past the end");
    assert!(is_shape(b.read(&a, 0..3)), "read past the end");
    let s = AttentionShape {
        n_tokens: 2,
        pos0: 0,
        kv_len: 2,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 8,
    };
    assert!(
        is_shape(b.attention(&a, (&small_cache, &small_cache), &s, &a)),
        "cache shorter than kv_len"
    );
    // Nothing valid was recorded: submitting is harmless.
    assert!(b.submit().unwrap().reads.is_empty());
}

#[test]
fn padded_matrices_read_back_dense() {
    let Some(ctx) = common::gpu() else { return };
    // 3 rows of 10 columns: stored with padded rows, read back as 30 dense values.
    let values: Vec<f32> = (0..30).map(|i| i as f32).collect();
    let m = ctx.upload_f32(&values, 3, 10).unwrap();
    let mut b = ctx.batch().unwrap();
    b.read(&m, 1..3).unwrap();
    assert_eq!(b.submit().unwrap().reads[0], values[10..].to_vec());
}

#[test]
fn the_checked_add_flags_only_non_finite_sums() {
    let Some(ctx) = common::gpu() else { return };
    let x = ctx.upload_f32(&[1.0; 8], 1, 8).unwrap();
    let mut huge = vec![0.5; 8];
    huge[5] = f32::MAX;
    let fine = ctx.upload_f32(&[0.5; 8], 1, 8).unwrap();
    let overflow = ctx.upload_f32(&huge, 1, 8).unwrap();
    let flags = ctx.alloc_matrix(1, 4, Elem::F32).unwrap();
    let mut b = ctx.batch().unwrap();
    b.add_assign_checked(&x, &fine, &flags, 1).unwrap();
    b.add_assign_checked(&x, &overflow, &flags, 2).unwrap();
    b.add_assign_checked(&x, &overflow, &flags, 3).unwrap();
    assert!(matches!(
        b.add_assign_checked(&x, &fine, &flags, 4),
        Err(GpuError::Shape { .. })
    ));
    b.read(&flags, 0..1).unwrap();
    b.read(&x, 0..1).unwrap();
    let out = b.submit().unwrap();
    // 1 + 0.5 is finite, and so is 1.5 + f32::MAX (it rounds to f32::MAX); a second
    // f32::MAX overflows to infinity, at index 5 only.
    assert_eq!(out.reads[0], vec![0.0, 0.0, 0.0, 1.0]);
    assert_eq!(out.reads[1][0], 1.0 + 0.5 + 0.5 + 0.5);
    assert!(out.reads[1][5].is_infinite());
}

#[test]
fn batches_submitted_without_waiting_run_in_order() {
    let Some(ctx) = common::gpu() else { return };
    // Each batch reads what the previous one wrote: x <- x + x, sixteen times, nobody
    // waiting in between; a final waited batch reads the result.
    let n = 4096;
    let x = ctx.upload_f32(&vec![1.0; n], 1, n).unwrap();
    for _ in 0..16 {
        let mut b = ctx.batch_untimed().unwrap();
        b.add_assign(&x, &x).unwrap();
        b.submit_async().unwrap();
    }
    let mut b = ctx.batch().unwrap();
    b.read(&x, 0..1).unwrap();
    let got = b.submit().unwrap().reads.remove(0);
    assert!(got.iter().all(|&v| v == 65_536.0), "{:?}", &got[..4]);
    // A batch with reads cannot go without waiting.
    let mut b = ctx.batch_untimed().unwrap();
    b.read(&x, 0..1).unwrap();
    assert!(matches!(b.submit_async(), Err(GpuError::Shape { .. })));
    ctx.wait_idle().unwrap();
}

#[test]
fn timestamps_bracket_queued_work_and_are_written_once() {
    let Some(ctx) = common::gpu() else { return };
    let Some(timer) = ctx.timer(3).unwrap() else {
        println!("skipped: this device's compute queue has no timestamps");
        return;
    };
    let x = ctx
        .upload_f32(&vec![1.0; 1 << 16], 1 << 4, 1 << 12)
        .unwrap();
    let mut b = ctx.batch_untimed().unwrap();
    b.timestamp(&timer, 0).unwrap();
    for _ in 0..8 {
        b.add_assign(&x, &x).unwrap();
    }
    b.timestamp(&timer, 1).unwrap();
    assert!(matches!(
        b.timestamp(&timer, 1),
        Err(GpuError::Shape { .. })
    ));
    assert!(matches!(
        b.timestamp(&timer, 3),
        Err(GpuError::Shape { .. })
    ));
    b.submit_async().unwrap();
    ctx.wait_idle().unwrap();
    let t = timer.read_ns().unwrap();
    let (start, end) = (t[0].unwrap(), t[1].unwrap());
    assert!(end >= start, "{start} .. {end}");
    assert_eq!(t[2], None, "never written");
}
