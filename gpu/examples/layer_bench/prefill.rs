//! The prefill rows: a layer's fused GEMMs per chunk size, attention at every chunk
//! position, and the prefill times of three prompt lengths they add up to.

use hetsched_gpu::{Elem, GpuContext, GpuOptions};
use hetsched_kernels::seeded::SeededRng;

use super::{CHUNK, LAYERS, MAX_POS, Timing, acts, attention, gemms, shape, time_us, weights};

const ROWS_45: usize = 557 - CHUNK;

/// Per chunk size (512, then 45 rows): one layer's summed GEMM µs with f32 and f16
/// weights, and the f16 output projection's share of the latter.
pub(super) fn time_gemms(ctx: &GpuContext, rng: &mut SeededRng, t: Timing) -> Vec<(f64, f64, f64)> {
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
pub(super) struct AttentionTimes {
    chunks: Vec<f64>,
    t45: f64,
    fused: Option<(Vec<f64>, f64)>,
}

pub(super) fn time_attention(min_blocks: usize, rng: &mut SeededRng, t: Timing) -> AttentionTimes {
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
pub(super) fn print_prefill(layer_gemm: &[(f64, f64, f64)], attn: &AttentionTimes) {
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
