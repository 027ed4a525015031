//! The decode rows: one token's fused GEMMs, attention and head, the probes that tell a
//! dispatch's fixed cost from its kernel's, and the decode kernels' tuning options.

use hetsched_gpu::{Elem, FusedGemm, GemmEpilogue, GpuContext, GpuMatrix, GpuOptions};
use hetsched_kernels::seeded::SeededRng;

use super::{
    Acts, HIDDEN, LAYERS, Record, Timing, Weights, acts, attention, gemms, time_us, weights,
};

/// Vocabulary of the head (SmolLM2).
const VOCAB: usize = 49_152;

/// One decode token: the four fused GEMMs at 1 row (f32 and f16 weights, the few-row
/// kernel), attention of one token over 128 .. 4096 keys (the decode kernel), the head
/// GEMM, and the device time of a token they add up to at 600 keys.
pub(super) fn time_decode(ctx: &GpuContext, rng: &mut SeededRng, t: Timing) {
    let w32 = weights(ctx, rng, Elem::F32);
    let w16 = weights(ctx, rng, Elem::F16);
    let one = acts(ctx, rng, 1);
    println!("\ndecode, one token (device us per dispatch):");
    // What any dispatch costs here, barrier included: one 4-float add in place.
    let tiny = ctx.upload_f32(&[1.0; 4], 1, 4).expect("upload");
    let delta = ctx.upload_f32(&[0.5; 4], 1, 4).expect("upload");
    let floor: Record<'_> = Box::new(|b| b.add_assign(&tiny, &delta));
    let t_floor = time_us(ctx, &floor, t.repeat, t.batches);
    println!("{:<34} {t_floor:>10.1}", "floor: add of 4 floats");
    // The same adds on 20 matrices of their own: no write-read hazard, so no barrier
    // between them; against the row above, what a barrier between dependent dispatches
    // costs.
    let apart: Vec<GpuMatrix> = (0..20)
        .map(|_| ctx.upload_f32(&[1.0; 4], 1, 4).expect("upload"))
        .collect();
    let next = std::cell::Cell::new(0usize);
    let independent: Record<'_> = Box::new(|b| {
        let i = next.get();
        next.set((i + 1) % apart.len());
        b.add_assign(&apart[i], &delta)
    });
    let t_apart = time_us(ctx, &independent, t.repeat, t.batches);
    println!("{:<34} {t_apart:>10.1}", "add of 4 floats, no dependency");
    time_decode_probes(ctx, &w32, &one, t);
    time_tree_gemv(rng, t);
    let mut layer = (0.0, 0.0);
    for ((name, r32), (_, r16)) in gemms(&w32, &one).iter().zip(&gemms(&w16, &one)) {
        let (t32, t16) = (
            time_us(ctx, r32, t.repeat, t.batches),
            time_us(ctx, r16, t.repeat, t.batches),
        );
        layer = (layer.0 + t32, layer.1 + t16);
        println!("{:<34} {t32:>10.1} {t16:>10.1}", format!("{name} 1 row"));
    }
    let mut at600 = 0.0;
    for keys in [128, 600, 1024, 4096] {
        let us = time_us(
            ctx,
            &attention(&one, 1, keys - 1, None),
            t.repeat,
            t.batches,
        );
        if keys == 600 {
            at600 = us;
        }
        println!(
            "{:<34} {us:>10.1}",
            format!("attention 1 token, {keys} keys")
        );
    }
    let head: Vec<f32> = rng.f32s(VOCAB * HIDDEN).iter().map(|v| v * 0.05).collect();
    let head = ctx.upload_f32(&head, VOCAB, HIDDEN).expect("upload");
    let logits = ctx.alloc_matrix(1, VOCAB, Elem::F32).expect("logits");
    let record: Record<'_> = Box::new(|b| {
        let f = FusedGemm {
            norm_eps: Some(1e-5),
            epilogue: GemmEpilogue::Store,
        };
        b.gemm_fused(&one.x, &head, &logits, f)
    });
    let t_head = time_us(ctx, &record, t.repeat, t.batches);
    println!("{:<34} {t_head:>10.1}", "head f32 1 row");
    let token = |gemm: f64| LAYERS as f64 * (gemm + at600) + t_head;
    println!(
        "a token at 600 keys, {LAYERS} layers + head: {:.1} us with f32 weights ({:.0} tokens/s), \
         {:.1} us with f16 ({:.0} tokens/s), device time of the dispatches only",
        token(layer.0),
        1e6 / token(layer.0),
        token(layer.1),
        1e6 / token(layer.1)
    );
}

/// Rows that tell a dispatch's fixed cost from its kernel's: what a trivial kernel streams
/// from device memory (an add over 64 MiB vectors), the o GEMV with no epilogue (a store),
/// and the same GEMV 20 times into 20 outputs, which need no barrier between them.
fn time_decode_probes(ctx: &GpuContext, w: &Weights, one: &Acts, t: Timing) {
    let big = 16 << 20;
    let x = ctx.upload_f32(&vec![1.0; big], 1, big).expect("upload");
    let d = ctx.upload_f32(&vec![0.5; big], 1, big).expect("upload");
    let stream: Record<'_> = Box::new(|b| b.add_assign(&x, &d));
    let us = time_us(ctx, &stream, 4, t.batches);
    let gb_s = 3.0 * (big * 4) as f64 / (us * 1e3);
    println!(
        "{:<34} {us:>10.1}   ({gb_s:.0} GB/s over reads and writes)",
        "add of 16M floats"
    );
    let store = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::Store,
    };
    let plain: Record<'_> = Box::new(|b| b.gemm_fused(&one.attn, &w.o, &one.q, store));
    let us = time_us(ctx, &plain, t.repeat, t.batches);
    println!("{:<34} {us:>10.1}", "o 1 row, store");
    let outs: Vec<GpuMatrix> = (0..20)
        .map(|_| ctx.alloc_matrix(1, HIDDEN, Elem::F32).expect("alloc"))
        .collect();
    let next = std::cell::Cell::new(0usize);
    let apart: Record<'_> = Box::new(|b| {
        let i = next.get();
        next.set((i + 1) % outs.len());
        b.gemm_fused(&one.attn, &w.o, &outs[i], store)
    });
    let us = time_us(ctx, &apart, t.repeat, t.batches);
    println!("{:<34} {us:>10.1}", "o 1 row, store, no dependency");
}

/// Decode attention of one token over 128 .. 4096 keys with each split walking at least
/// `min_blocks` 64-key blocks (`GpuOptions::decode_min_key_blocks`).
pub(super) fn time_decode_attention(min_blocks: usize, rng: &mut SeededRng, t: Timing) {
    let options = GpuOptions {
        decode_min_key_blocks: Some(min_blocks),
        ..Default::default()
    };
    let ctx = GpuContext::new(options).expect("a Vulkan device");
    let one = acts(&ctx, rng, 1);
    for keys in [128, 256, 600, 1024, 4096] {
        let us = time_us(
            &ctx,
            &attention(&one, 1, keys - 1, None),
            t.repeat,
            t.batches,
        );
        let name = format!("attention 1 token, {keys} keys, >= {min_blocks} blocks/split");
        println!("{name:<44} {us:>10.1}");
    }
}

/// The four fused GEMMs at one row with the one-row GEMV's 64-thread shared-memory tree
/// (`GpuOptions::one_row_gemv_tree`), against the rows above (the subgroup kernel where
/// the device has subgroup arithmetic).
fn time_tree_gemv(rng: &mut SeededRng, t: Timing) {
    let options = GpuOptions {
        one_row_gemv_tree: true,
        ..Default::default()
    };
    let ctx = GpuContext::new(options).expect("a Vulkan device");
    let (w32, w16, one) = (
        weights(&ctx, rng, Elem::F32),
        weights(&ctx, rng, Elem::F16),
        acts(&ctx, rng, 1),
    );
    for ((name, r32), (_, r16)) in gemms(&w32, &one).iter().zip(&gemms(&w16, &one)) {
        let (t32, t16) = (
            time_us(&ctx, r32, t.repeat, t.batches),
            time_us(&ctx, r16, t.repeat, t.batches),
        );
        println!(
            "{:<34} {t32:>10.1} {t16:>10.1}",
            format!("{name} 1 row, tree")
        );
    }
}
