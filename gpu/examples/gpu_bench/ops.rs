//! The second table: GPU time of the non-GEMM kernels at SmolLM2 shapes.

use std::io::Write;

use hetsched_gpu::{AttentionShape, GpuContext, GpuOptions, RopeStyle};
use hetsched_kernels::seeded::SeededRng;

/// The operands of the ops table: one 512-token chunk at position 512 (hidden 576, ffn
/// 1536, 9 query and 3 key/value heads of 64), and the attention of longer prompts.
struct OpsInputs {
    t: usize,
    hidden: usize,
    ffn: usize,
    heads: usize,
    d: usize,
    x: Vec<f32>,
    w: Vec<f32>,
    gate: Vec<f32>,
    q: Vec<f32>,
    kc: Vec<f32>,
    vc: Vec<f32>,
    acc: Vec<i32>,
    scales: Vec<f32>,
    positions: Vec<usize>,
    shape: AttentionShape,
    /// The last 512-token chunk of a 4096-token prefill: 4 · 64 · 9 · Σ(3585..=4096) keys
    /// = 4.53 GFLOP of attention (causal, q·kᵀ and p·v).
    long: AttentionShape,
    kc_long: Vec<f32>,
    vc_long: Vec<f32>,
    /// The last 2048 of an 8192-token prefill with 2048-token chunks: 4 · 64 · 9 ·
    /// Σ(6145..=8192) keys = 33.0 GFLOP.
    long_8k: AttentionShape,
    q_8k: Vec<f32>,
    kc_8k: Vec<f32>,
    vc_8k: Vec<f32>,
}

/// Seeded operands of the ops table.
fn ops_inputs() -> OpsInputs {
    let (t, hidden, ffn, heads, kv_heads, d) = (512, 576, 1536, 9, 3, 64);
    let mut rng = SeededRng::new(5);
    let x = rng.f32s(t * hidden);
    let w = rng.f32s(hidden);
    let gate = rng.f32s(t * ffn);
    let q = rng.f32s(t * heads * d);
    let kv_len = 1024;
    let kc = rng.f32s(kv_len * kv_heads * d);
    let vc = rng.f32s(kv_len * kv_heads * d);
    let acc: Vec<i32> = (0..t * ffn).map(|i| i as i32 - 1000).collect();
    let scales = rng.f32s(ffn);
    let shape = AttentionShape {
        n_tokens: t,
        pos0: 512,
        kv_len,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: d,
    };
    let long_kv = 4096;
    let (kc_long, vc_long) = (
        rng.f32s(long_kv * kv_heads * d),
        rng.f32s(long_kv * kv_heads * d),
    );
    let q_8k = rng.f32s(2048 * heads * d);
    let (kc_8k, vc_8k) = (rng.f32s(8192 * kv_heads * d), rng.f32s(8192 * kv_heads * d));
    OpsInputs {
        t,
        hidden,
        ffn,
        heads,
        d,
        x,
        w,
        gate,
        q,
        kc,
        vc,
        acc,
        scales,
        positions: (512..512 + t).collect(),
        shape,
        long: AttentionShape {
            pos0: long_kv - t,
            kv_len: long_kv,
            ..shape
        },
        kc_long,
        vc_long,
        long_8k: AttentionShape {
            n_tokens: 2048,
            pos0: 6144,
            kv_len: 8192,
            ..shape
        },
        q_8k,
        kc_8k,
        vc_8k,
    }
}

/// GPU time of the non-GEMM kernels at SmolLM2 shapes (one 512-token chunk at position 512):
/// the best of five calls, uploads and downloads excluded.
pub(super) fn ops_table(ctx: &GpuContext, json: &mut Option<std::fs::File>) -> bool {
    let inputs = ops_inputs();
    // The f32 kernel beside the tensor-core one, where the device has both.
    let f32_ctx = GpuContext::new(GpuOptions {
        f32_attention: true,
        ..Default::default()
    });
    let Ok(f32_ctx) = f32_ctx else {
        println!("no second context for the f32 attention row");
        return false;
    };
    println!(
        "attention on tensor cores: {}",
        ctx.attention_on_tensor_cores(&inputs.long)
    );
    time_ops(&ops(ctx, &f32_ctx, &inputs), json)
}

/// The rows of the ops table, in order.
fn ops<'a>(ctx: &'a GpuContext, f32_ctx: &'a GpuContext, i: &'a OpsInputs) -> Vec<Op<'a>> {
    let (t, hidden, ffn, heads, d) = (i.t, i.hidden, i.ffn, i.heads, i.d);
    vec![
        (
            "rms_norm 512x576",
            ctx,
            Box::new(move || ctx.rms_norm(&i.x, &i.w, 1e-5, t, hidden).map(drop)),
        ),
        (
            "rope q 512x9x64",
            ctx,
            Box::new(move || {
                ctx.rope(
                    &mut i.q.clone(),
                    &i.positions,
                    heads,
                    d,
                    1e5,
                    RopeStyle::HalfSplit,
                )
            }),
        ),
        (
            "attention 512 @512, 9/3x64",
            ctx,
            Box::new(move || {
                ctx.attention_causal_gqa(&i.q, &i.kc, &i.vc, &i.shape)
                    .map(drop)
            }),
        ),
        (
            "attention 512 @3584, 9/3x64",
            ctx,
            Box::new(move || {
                ctx.attention_causal_gqa(&i.q, &i.kc_long, &i.vc_long, &i.long)
                    .map(drop)
            }),
        ),
        (
            "attention 512 @3584 f32",
            f32_ctx,
            Box::new(move || {
                f32_ctx
                    .attention_causal_gqa(&i.q, &i.kc_long, &i.vc_long, &i.long)
                    .map(drop)
            }),
        ),
        (
            "attention 2048 @6144, 9/3x64",
            ctx,
            Box::new(move || {
                ctx.attention_causal_gqa(&i.q_8k, &i.kc_8k, &i.vc_8k, &i.long_8k)
                    .map(drop)
            }),
        ),
        (
            "silu_mul 512x1536",
            ctx,
            Box::new(move || ctx.silu_mul(&i.gate, &i.gate).map(drop)),
        ),
        (
            "quantize_dynamic 512x1536",
            ctx,
            Box::new(move || ctx.quantize_dynamic(&i.gate).map(drop)),
        ),
        (
            "dequantize 512x1536",
            ctx,
            Box::new(move || {
                ctx.dequantize_i32_acc(&i.acc, t, ffn, 0.01, &i.scales)
                    .map(drop)
            }),
        ),
    ]
}

/// A named kernel call of the ops table and the context it runs on (whose timer it reads).
type Op<'a> = (
    &'static str,
    &'a GpuContext,
    Box<dyn Fn() -> hetsched_gpu::Result<()> + 'a>,
);

/// Prints (and writes to `json`) the best GPU time of five calls of each of `ops`; false
/// where one failed.
fn time_ops(ops: &[Op<'_>], json: &mut Option<std::fs::File>) -> bool {
    println!("{:<28} {:>12}", "kernel (SmolLM2 shapes)", "GPU us");
    let mut ok = true;
    for (name, ctx, op) in ops {
        let mut best = u64::MAX;
        for _ in 0..5 {
            if let Err(e) = op() {
                println!("{name:<28} error: {e}");
                ok = false;
                break;
            }
            best = best.min(ctx.last_gpu_time_ns().unwrap_or(u64::MAX));
        }
        println!("{name:<28} {:>12.1}", best as f64 / 1e3);
        if let Some(f) = json.as_mut() {
            let _ = writeln!(
                f,
                "{{\"op\":\"{name}\",\"gpu_us\":{:.2}}}",
                best as f64 / 1e3
            );
        }
    }
    ok
}
