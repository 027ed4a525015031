//! Weight error of the W4A8 format (`hetsched_kernels::W4Rows`: 4-bit values, an integer
//! sub-scale per group of 32, a row scale) against llama.cpp's Q4_0 rule (per block of 32,
//! `d = m / -8` of the block's value of largest magnitude, `q = min(15, ⌊x/d + 8.5⌋)`, d
//! kept in f32 here) on the same f32 weights: the relative RMS error
//! `‖w − ŵ‖ / ‖w‖` of every linear tensor kind, summed over the layers.
//!
//! Usage: `cargo run --release --example w4_quant_error -- MODEL`

use std::process::ExitCode;

use hetsched::import::{GgufFile, GgufSource, LayerTensor, LlamaSource};
use hetsched_kernels::W4Rows;

/// llama.cpp's `quantize_row_q4_0_ref` followed by its dequantization.
fn q4_0_roundtrip(w: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for block in w.chunks(32) {
        let m = block
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = m / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for &v in block {
            let q = ((v * id + 8.5) as i8).min(15);
            out.push(f32::from(q - 8) * d);
        }
    }
    out
}

fn run(model: &str) -> Result<(), Box<dyn std::error::Error>> {
    let file = GgufFile::open(model)?;
    let source = GgufSource::new(&file)?;
    let layers = source.config().n_layers;
    let kinds = [
        LayerTensor::Q,
        LayerTensor::K,
        LayerTensor::V,
        LayerTensor::O,
        LayerTensor::Gate,
        LayerTensor::Up,
        LayerTensor::Down,
    ];
    println!("tensor  w4a8_rel_rms  q4_0_rel_rms");
    let mut total = [0f64; 3];
    for which in kinds {
        let mut sums = [0f64; 3];
        for l in 0..layers {
            let w = source.layer(l, which)?;
            let shape = which.shape(source.config());
            let w4 = W4Rows::quantize(&w, shape[0], shape[1]).dequantize();
            let q40 = q4_0_roundtrip(&w);
            for ((&x, &a), &b) in w.iter().zip(&w4).zip(&q40) {
                sums[0] += f64::from(x) * f64::from(x);
                sums[1] += f64::from(x - a).powi(2);
                sums[2] += f64::from(x - b).powi(2);
            }
        }
        let rel = |e: f64| (e / sums[0]).sqrt();
        println!("{which:?}  {:.5}  {:.5}", rel(sums[1]), rel(sums[2]));
        for (t, s) in total.iter_mut().zip(sums) {
            *t += s;
        }
    }
    let rel = |e: f64| (e / total[0]).sqrt();
    println!("all  {:.5}  {:.5}", rel(total[1]), rel(total[2]));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model] = args.as_slice() else {
        eprintln!("usage: w4_quant_error MODEL");
        return ExitCode::FAILURE;
    };
    match run(model) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
