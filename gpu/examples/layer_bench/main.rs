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
    GpuMatrix, RopeStyle,
};
use hetsched_kernels::seeded::SeededRng;

mod decode;
mod prefill;

use decode::{time_decode, time_decode_attention};
use prefill::{print_prefill, time_attention, time_gemms};

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

/// The comma-separated numbers after `flag`, if given.
fn list_arg(flag: &str) -> Option<Vec<usize>> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .map(|v| v.split(',').filter_map(|b| b.parse().ok()).collect())
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
