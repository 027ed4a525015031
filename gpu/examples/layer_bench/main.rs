//! Where a resident prefill's device time goes: the GPU time of each dispatch of a
//! SmolLM2-135M decoder layer (the four fused GEMMs with f32 and with f16 weights, and
//! attention at every chunk position of a 4096-token prompt, alone and with the output
//! projection folded in, f16 W_o: `GpuBatch::attention_into_residual`), timed with GPU
//! timestamps, and the prefill times of 557, 2048 and 4096 tokens (chunks of 512) they add
//! up to: 5 dispatches per layer (f32 or f16 weights) and 4 (f16, o inside attention).
//!
//! ```sh
//! cargo run --release -p hetsched-gpu --example layer_bench            # H100: a few seconds
//! cargo run --release -p hetsched-gpu --example layer_bench -- --quick # lavapipe: 2 calls
//! cargo run --release -p hetsched-gpu --example layer_bench -- --attn-min-blocks 16,8,4
//! cargo run --release -p hetsched-gpu --example layer_bench -- --decode-only
//! cargo run --release -p hetsched-gpu --example layer_bench -- --decode-only --decode-min-blocks 1,4,16
//! ```
//!
//! First the decode rows: each fused GEMM of a layer at one row (the few-row kernel),
//! attention of one token over 128 to 4096 keys (the decode kernel), the head, and the
//! device time of a token they add up to.
//!
//! `--decode-min-blocks` times the decode attention once per value of
//! `GpuOptions::decode_min_key_blocks`.
//!
//! `--attn-min-blocks` times attention once per value of
//! `GpuOptions::attention_min_key_blocks` (default: 8 only); the prefill sums use the first.
//!
//! Each row: one batch of R back-to-back dispatches of the same kind (so the gaps between
//! dispatches count, as in a prefill), GPU time / R, the median of 5 batches after one
//! warm-up batch, after 0.5 s of GEMMs that ramp the GPU's clocks up (without it the first
//! rows ran at about half speed on an H100). The sums leave out the host (recording,
//! submissions) and the head.

use hetsched_gpu::{
    AttentionOutput, AttentionShape, Elem, FusedGemm, GemmEpilogue, GpuBatch, GpuContext,
    GpuMatrix, GpuOptions, RopeStyle,
};
use hetsched_kernels::seeded::SeededRng;

const HIDDEN: usize = 576;
const FFN: usize = 1536;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D: usize = 64;
const LAYERS: usize = 30;
const CHUNK: usize = 512;
const MAX_POS: usize = 4096;

type Record<'a> = Box<dyn Fn(&mut GpuBatch<&GpuContext>) -> hetsched_gpu::Result<()> + 'a>;

/// Median GPU microseconds per dispatch of `record`, `repeat` per batch.
fn time_us(ctx: &GpuContext, record: &Record<'_>, repeat: usize, batches: usize) -> f64 {
    let mut times = Vec::new();
    for i in 0..=batches {
        let mut b = ctx.batch().expect("batch");
        for _ in 0..repeat {
            record(&mut b).expect("record");
        }
        let ns = b.submit().expect("submit").gpu_ns.unwrap_or(0);
        if i > 0 {
            times.push(ns as f64 / 1e3 / repeat as f64);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One layer's weights in the fused layouts' shapes (random values), as `elem`.
struct Weights {
    qkv: GpuMatrix,
    o: GpuMatrix,
    gate_up: GpuMatrix,
    down: GpuMatrix,
}

fn weights(ctx: &GpuContext, rng: &mut SeededRng, elem: Elem) -> Weights {
    let mut up = |rows: usize, cols: usize| {
        let w: Vec<f32> = rng.f32s(rows * cols).iter().map(|v| v * 0.05).collect();
        match elem {
            Elem::F16 => ctx.upload_f32_as_f16(&w, rows, cols),
            _ => ctx.upload_f32(&w, rows, cols),
        }
        .expect("upload")
    };
    Weights {
        qkv: up(HIDDEN + 2 * KV_HEADS * D, HIDDEN),
        o: up(HIDDEN, HIDDEN),
        gate_up: up(2 * FFN, HIDDEN),
        down: up(HIDDEN, FFN),
    }
}

/// A chunk's activations and a layer's caches.
struct Acts {
    x: GpuMatrix,
    q: GpuMatrix,
    attn: GpuMatrix,
    hidden: GpuMatrix,
    angles: GpuMatrix,
    caches: (GpuMatrix, GpuMatrix),
    flags: GpuMatrix,
}

fn acts(ctx: &GpuContext, rng: &mut SeededRng, rows: usize) -> Acts {
    let mut up = |r: usize, c: usize| ctx.upload_f32(&rng.f32s(r * c), r, c).expect("upload");
    let positions: Vec<usize> = (0..rows).collect();
    Acts {
        x: up(rows, HIDDEN),
        q: up(rows, HEADS * D),
        attn: up(rows, HEADS * D),
        hidden: up(rows, FFN),
        angles: ctx.rope_angles(&positions, D, 1e5).expect("angles"),
        caches: (up(MAX_POS, KV_HEADS * D), up(MAX_POS, KV_HEADS * D)),
        flags: up(1, 4),
    }
}

/// The four fused GEMMs of a layer, in order, with their names.
fn gemms<'a>(w: &'a Weights, a: &'a Acts) -> Vec<(&'static str, Record<'a>)> {
    let eps = Some(1e-5);
    vec![
        (
            "qkv+norm+rope",
            Box::new(move |b| {
                let epilogue = GemmEpilogue::QkvRope {
                    angles: &a.angles,
                    caches: (&a.caches.0, &a.caches.1),
                    pos0: 0,
                    n_heads: HEADS,
                    n_kv_heads: KV_HEADS,
                    style: RopeStyle::HalfSplit,
                };
                b.gemm_fused(
                    &a.x,
                    &w.qkv,
                    &a.q,
                    FusedGemm {
                        norm_eps: eps,
                        epilogue,
                    },
                )
            }),
        ),
        (
            "o+residual",
            Box::new(move |b| residual(b, &a.attn, &w.o, a)),
        ),
        (
            "gate_up+norm+silu",
            Box::new(move |b| {
                let f = FusedGemm {
                    norm_eps: eps,
                    epilogue: GemmEpilogue::SiluMul,
                };
                b.gemm_fused(&a.x, &w.gate_up, &a.hidden, f)
            }),
        ),
        (
            "down+residual",
            Box::new(move |b| residual(b, &a.hidden, &w.down, a)),
        ),
    ]
}

fn residual(
    b: &mut GpuBatch<&GpuContext>,
    input: &GpuMatrix,
    w: &GpuMatrix,
    a: &Acts,
) -> hetsched_gpu::Result<()> {
    let epilogue = GemmEpilogue::Residual {
        flags: &a.flags,
        slot: 0,
    };
    b.gemm_fused(
        input,
        w,
        &a.x,
        FusedGemm {
            norm_eps: None,
            epilogue,
        },
    )
}

fn shape(rows: usize, pos0: usize) -> AttentionShape {
    AttentionShape {
        n_tokens: rows,
        pos0,
        kv_len: pos0 + rows,
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: D,
    }
}

/// Attention of a `rows`-token chunk at `pos0`; with `w_o`, the output projection folded
/// in (adding into the chunk's residual stream).
fn attention<'a>(a: &'a Acts, rows: usize, pos0: usize, w_o: Option<&'a GpuMatrix>) -> Record<'a> {
    let s = shape(rows, pos0);
    let caches = (&a.caches.0, &a.caches.1);
    match w_o {
        None => Box::new(move |b| b.attention(&a.q, caches, &s, &a.attn)),
        Some(w_o) => Box::new(move |b| {
            let o = AttentionOutput {
                w_o,
                residual: &a.x,
                flags: &a.flags,
                slot: 0,
            };
            b.attention_into_residual(&a.q, caches, &s, &a.attn, o)
        }),
    }
}

/// Repetitions per batch and batches per row.
#[derive(Clone, Copy)]
struct Timing {
    repeat: usize,
    batches: usize,
}

const ROWS_45: usize = 557 - CHUNK;

/// Per chunk size (512, then 45 rows): one layer's summed GEMM µs with f32 and f16
/// weights, and the f16 output projection's share of the latter.
fn time_gemms(ctx: &GpuContext, rng: &mut SeededRng, t: Timing) -> Vec<(f64, f64, f64)> {
    let w32 = weights(ctx, rng, Elem::F32);
    let w16 = weights(ctx, rng, Elem::F16);
    let (big, small) = (acts(ctx, rng, CHUNK), acts(ctx, rng, ROWS_45));
    // The GPU's clocks ramp up only under load.
    let start = std::time::Instant::now();
    let warm = &gemms(&w32, &big)[2].1;
    while start.elapsed().as_secs_f64() < if t.batches > 1 { 0.5 } else { 0.0 } {
        time_us(ctx, warm, t.repeat, 1);
    }
    println!("{:<34} {:>10} {:>10}", "dispatch", "f32 us", "f16 us");
    let mut layer_gemm = Vec::new();
    for (rows, a) in [(CHUNK, &big), (ROWS_45, &small)] {
        let (g32, g16) = (gemms(&w32, a), gemms(&w16, a));
        let mut sums = (0.0, 0.0, 0.0);
        for ((name, r32), (_, r16)) in g32.iter().zip(&g16) {
            let (t32, t16) = (
                time_us(ctx, r32, t.repeat, t.batches),
                time_us(ctx, r16, t.repeat, t.batches),
            );
            sums = (sums.0 + t32, sums.1 + t16, sums.2);
            if name.starts_with("o+") {
                sums.2 = t16;
            }
            println!(
                "{:<34} {t32:>10.1} {t16:>10.1}",
                format!("{name} {rows} rows")
            );
        }
        layer_gemm.push(sums);
    }
    layer_gemm
}

/// Attention µs of the 512-token chunks at 0, 512, ... 3584 and of the 45-token chunk at
/// 512, with at least `min_blocks` key blocks per range: alone, and with the output
/// projection (f16 W_o) folded in, where the device can.
struct AttentionTimes {
    chunks: Vec<f64>,
    t45: f64,
    fused: Option<(Vec<f64>, f64)>,
}

fn time_attention(min_blocks: usize, rng: &mut SeededRng, t: Timing) -> AttentionTimes {
    let options = GpuOptions {
        attention_min_key_blocks: Some(min_blocks),
        ..Default::default()
    };
    let ctx = GpuContext::new(options).expect("a Vulkan device");
    let (big, small) = (acts(&ctx, rng, CHUNK), acts(&ctx, rng, ROWS_45));
    let w_o = weights(&ctx, rng, Elem::F16).o;
    let fuses = ctx.attention_fuses_output(&shape(CHUNK, 0), Elem::F16);
    let mut runs = vec![(None, "attention")];
    if fuses {
        runs.push((Some(&w_o), "attention+o"));
    }
    let mut out = Vec::new();
    for (w, what) in runs {
        let mut chunks = Vec::new();
        for pos0 in (0..MAX_POS).step_by(CHUNK) {
            let us = time_us(&ctx, &attention(&big, CHUNK, pos0, w), t.repeat, t.batches);
            let name = format!("{what} 512 @{pos0}, >= {min_blocks} blocks/range");
            println!("{name:<44} {us:>10.1}");
            chunks.push(us);
        }
        let record = attention(&small, ROWS_45, CHUNK, w);
        let t45 = time_us(&ctx, &record, t.repeat, t.batches);
        let name = format!("{what} {ROWS_45} @{CHUNK}, >= {min_blocks} blocks/range");
        println!("{name:<44} {t45:>10.1}");
        let total: f64 = chunks.iter().sum();
        println!(
            "sum of the 8 chunks of 4096, {what}, >= {min_blocks} blocks/range: {total:.1} us"
        );
        out.push((chunks, t45));
    }
    let fused = if fuses { out.pop() } else { None };
    let (chunks, t45) = out.pop().expect("timed");
    AttentionTimes { chunks, t45, fused }
}

/// Per prompt length: the attention µs of one layer (its full chunks and the 45-token one).
fn per_prompt(chunks: &[f64], t45: f64, tokens: usize) -> f64 {
    let mut us: f64 = chunks[..tokens / CHUNK].iter().sum();
    if !tokens.is_multiple_of(CHUNK) {
        us += t45;
    }
    us
}

/// The prefill sums: 30 layers of the chunks each prompt length has; the last column with
/// 4 dispatches per layer (f16 weights, o inside attention).
fn print_prefill(layer_gemm: &[(f64, f64, f64)], attn: &AttentionTimes) {
    println!(
        "tokens  attention ms  GEMM ms f32  GEMM ms f16  attention share (f32 / f16 GEMMs)  \
         f16 5 dispatches ms  f16 4 dispatches ms"
    );
    for tokens in [557, 2048, 4096] {
        let full = (tokens / CHUNK) as f64;
        let rest = usize::from(!tokens.is_multiple_of(CHUNK)) as f64;
        let g = |f: fn(&(f64, f64, f64)) -> f64| {
            (full * f(&layer_gemm[0]) + rest * f(&layer_gemm[1])) * LAYERS as f64 / 1e3
        };
        let (g32, g16, o16) = (g(|x| x.0), g(|x| x.1), g(|x| x.2));
        let a_ms = per_prompt(&attn.chunks, attn.t45, tokens) * LAYERS as f64 / 1e3;
        let four = attn.fused.as_ref().map_or(f64::NAN, |(c, t45)| {
            per_prompt(c, *t45, tokens) * LAYERS as f64 / 1e3 + g16 - o16
        });
        println!(
            "{tokens:>6} {a_ms:>13.2} {g32:>12.2} {g16:>12.2}  {:>17.0}% / {:.0}%  {:>19.2} {four:>20.2}",
            100.0 * a_ms / (a_ms + g32),
            100.0 * a_ms / (a_ms + g16),
            a_ms + g16
        );
    }
}

/// Vocabulary of the head (SmolLM2).
const VOCAB: usize = 49_152;

/// One decode token: the four fused GEMMs at 1 row (f32 and f16 weights, the few-row
/// kernel), attention of one token over 128 .. 4096 keys (the decode kernel), the head
/// GEMM, and the device time of a token they add up to at 600 keys.
fn time_decode(ctx: &GpuContext, rng: &mut SeededRng, t: Timing) {
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

/// The comma-separated numbers after `flag`, if given.
fn list_arg(flag: &str) -> Option<Vec<usize>> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .map(|v| v.split(',').filter_map(|b| b.parse().ok()).collect())
}

/// Decode attention of one token over 128 .. 4096 keys with each split walking at least
/// `min_blocks` 64-key blocks (`GpuOptions::decode_min_key_blocks`).
fn time_decode_attention(min_blocks: usize, rng: &mut SeededRng, t: Timing) {
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let t = if quick {
        Timing {
            repeat: 1,
            batches: 1,
        }
    } else {
        Timing {
            repeat: 20,
            batches: 5,
        }
    };
    let ctx = GpuContext::new(Default::default()).expect("a Vulkan device");
    ctx.prepare().expect("prepare");
    let info = ctx.info();
    let probe = AttentionShape {
        n_tokens: CHUNK,
        pos0: 0,
        kv_len: CHUNK,
        n_heads: HEADS,
        n_kv_heads: KV_HEADS,
        head_dim: D,
    };
    println!(
        "device {} ({:?}); subgroups of {:?}, arithmetic {}; f16 fused GEMMs on tensor cores: {}; \
         attention on tensor cores: {}",
        info.name,
        info.kind,
        info.subgroup_size,
        info.subgroup_arithmetic,
        ctx.fused_gemm_on_tensor_cores(),
        ctx.attention_on_tensor_cores(&probe)
    );
    let mut rng = SeededRng::new(3);
    time_decode(&ctx, &mut rng, t);
    for min_blocks in list_arg("--decode-min-blocks").unwrap_or_default() {
        time_decode_attention(min_blocks, &mut rng, t);
    }
    if std::env::args().any(|a| a == "--decode-only") {
        return;
    }
    let layer_gemm = time_gemms(&ctx, &mut rng, t);
    let blocks = list_arg("--attn-min-blocks").unwrap_or_else(|| vec![8]);
    let mut first = None;
    for &min_blocks in &blocks {
        let timed = time_attention(min_blocks, &mut rng, t);
        first.get_or_insert(timed);
    }
    let Some(attn) = first else { return };
    println!(
        "\nprefill (chunks of 512, {LAYERS} layers, device time of the dispatches only, \
         attention with >= {} blocks/range):",
        blocks[0]
    );
    print_prefill(&layer_gemm, &attn);
}
