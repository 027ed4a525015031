//! GEMM throughput on the chosen Vulkan device, timed with GPU timestamps.
//!
//! ```sh
//! cargo run --release -p hetsched-gpu --example gpu_bench            # table
//! cargo run --release -p hetsched-gpu --example gpu_bench -- --json  # one JSON object per line
//! cargo run --release -p hetsched-gpu --example gpu_bench -- --quick # small shapes (lavapipe)
//! ```
//!
//! For every kernel (f32, f16, f16 on cooperative matrices where offered, INT8) and shape:
//! upload random operands once, run once to warm up and spot-check 64 outputs against f64
//! dot products on the CPU, then run the kernel R times in one submission (R chosen so the
//! batch takes about 0.3 s) and report `2·m·n·k·R / GPU time`. Peaks are printed for the GPUs
//! we know; elsewhere the percentage is left out.

use std::process::ExitCode;

use half::f16;
use hetsched_gpu::{DeviceInfo, Elem, GpuContext, GpuMatrix, GpuOptions};
use hetsched_kernels::seeded::SeededRng;

#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    F32,
    F16,
    F16Coop,
    I8,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::F32 => "f32",
            Kernel::F16 => "f16",
            Kernel::F16Coop => "f16-coopmat",
            Kernel::I8 => "i8",
        }
    }
}

/// Dense peaks (TFLOPS or TOPS): FP32 on CUDA cores, FP16 and INT8 on tensor cores.
struct Peaks {
    f32: f64,
    f16_tensor: f64,
    i8_tensor: f64,
}

fn peaks(info: &DeviceInfo) -> Option<Peaks> {
    let name = info.name.to_lowercase();
    // NVIDIA's datasheet figures (dense, boost clock).
    if name.contains("h100") && name.contains("pcie") {
        Some(Peaks {
            f32: 51.2,
            f16_tensor: 756.0,
            i8_tensor: 1513.0,
        })
    } else if name.contains("h100") || name.contains("h200") {
        Some(Peaks {
            f32: 66.9,
            f16_tensor: 989.4,
            i8_tensor: 1978.9,
        })
    } else {
        None
    }
}

struct Operands {
    a: GpuMatrix,
    w: GpuMatrix,
    out: GpuMatrix,
    a_host: Vec<f32>,
    w_host: Vec<f32>,
}

fn operands(
    ctx: &GpuContext,
    kernel: Kernel,
    (m, k, n): (usize, usize, usize),
) -> hetsched_gpu::Result<Operands> {
    let mut rng = SeededRng::new((m * 31 + k * 17 + n) as u64);
    let (a_host, w_host) = (rng.f32s(m * k), rng.f32s(n * k));
    Ok(match kernel {
        Kernel::F32 => Operands {
            a: ctx.upload_f32(&a_host, m, k)?,
            w: ctx.upload_f32(&w_host, n, k)?,
            out: ctx.alloc_matrix(m, n, Elem::F32)?,
            a_host,
            w_host,
        },
        Kernel::F16 | Kernel::F16Coop => {
            let a16: Vec<f16> = a_host.iter().map(|&x| f16::from_f32(x)).collect();
            let w16: Vec<f16> = w_host.iter().map(|&x| f16::from_f32(x)).collect();
            Operands {
                a: ctx.upload_f16(&a16, m, k)?,
                w: ctx.upload_f16(&w16, n, k)?,
                out: ctx.alloc_matrix(m, n, Elem::F32)?,
                a_host: a16.iter().map(|h| h.to_f32()).collect(),
                w_host: w16.iter().map(|h| h.to_f32()).collect(),
            }
        }
        Kernel::I8 => {
            let a8: Vec<i8> = a_host.iter().map(|&x| (x * 127.0).round() as i8).collect();
            let w8: Vec<i8> = w_host.iter().map(|&x| (x * 127.0).round() as i8).collect();
            Operands {
                a: ctx.upload_i8(&a8, m, k)?,
                w: ctx.upload_i8(&w8, n, k)?,
                out: ctx.alloc_matrix(m, n, Elem::I32)?,
                a_host: a8.iter().map(|&x| f32::from(x)).collect(),
                w_host: w8.iter().map(|&x| f32::from(x)).collect(),
            }
        }
    })
}

fn run(
    ctx: &GpuContext,
    kernel: Kernel,
    o: &Operands,
    repeat: usize,
) -> hetsched_gpu::Result<Option<u64>> {
    match kernel {
        Kernel::F32 => ctx.matmul_f32_device_repeat(&o.a, &o.w, &o.out, repeat),
        Kernel::F16 => ctx.matmul_f16_device_repeat(&o.a, &o.w, &o.out, repeat),
        Kernel::F16Coop => ctx.matmul_f16_coop_device(&o.a, &o.w, &o.out, repeat),
        Kernel::I8 => ctx.gemm_i8_device_repeat(&o.a, &o.w, &o.out, repeat),
    }
}

/// Largest error of 64 sampled outputs, relative to Σ|a·w| of each.
fn spot_check(
    ctx: &GpuContext,
    kernel: Kernel,
    o: &Operands,
    (m, k, n): (usize, usize, usize),
) -> hetsched_gpu::Result<f64> {
    let got: Vec<f64> = if kernel == Kernel::I8 {
        ctx.download_i32(&o.out)?
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        ctx.download_f32(&o.out)?
            .into_iter()
            .map(f64::from)
            .collect()
    };
    let mut rng = SeededRng::new(99);
    let mut worst = 0f64;
    for _ in 0..64 {
        let i = (rng.next_u64() % m as u64) as usize;
        let j = (rng.next_u64() % n as u64) as usize;
        let (mut dot, mut abs) = (0f64, 0f64);
        for t in 0..k {
            let p = f64::from(o.a_host[i * k + t]) * f64::from(o.w_host[j * k + t]);
            dot += p;
            abs += p.abs();
        }
        worst = worst.max((got[i * n + j] - dot).abs() / abs.max(1e-30));
    }
    Ok(worst)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let quick = args.iter().any(|a| a == "--quick");
    let ctx = match GpuContext::new(GpuOptions::default()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let info = ctx.info().clone();
    let peaks = peaks(&info);
    if json {
        println!(
            "{{\"device\":\"{}\",\"kind\":\"{:?}\",\"driver\":\"{}\",\"timestamps\":{},\"coop_matrix_nv\":{},\"coop_matrix_khr\":{},\"shader_int8\":{},\"shader_f16\":{},\"max_storage_buffer_range\":{}}}",
            info.name,
            info.kind,
            info.driver.replace('"', "'"),
            info.has_timestamps(),
            info.coop_matrix_nv,
            info.coop_matrix_khr,
            info.shader_int8,
            info.shader_f16,
            info.max_storage_buffer_range
        );
    } else {
        println!("device {} ({:?}), {}", info.name, info.kind, info.driver);
        println!(
            "timestamps {}, coop matrix NV {} KHR {}, int8 {}, f16 {}, subgroup {:?}",
            info.has_timestamps(),
            info.coop_matrix_nv,
            info.coop_matrix_khr,
            info.shader_int8,
            info.shader_f16,
            info.subgroup_size
        );
        println!(
            "{:<12} {:>6} {:>6} {:>6} {:>7} {:>10} {:>9} {:>8} {:>9}",
            "kernel", "m", "k", "n", "repeat", "ms/call", "T(FL)OPS", "% peak", "max err"
        );
    }
    if !info.has_timestamps() {
        eprintln!("error: this device's compute queue has no timestamps; nothing to measure");
        return ExitCode::FAILURE;
    }
    let shapes: Vec<(usize, usize, usize)> = if quick {
        vec![(256, 256, 256), (512, 576, 1536)]
    } else {
        vec![
            (4096, 4096, 4096),
            (8192, 8192, 8192),
            (512, 576, 1536), // SmolLM2 gate / up, one 512-token chunk
            (512, 1536, 576), // SmolLM2 down
            (512, 576, 576),  // SmolLM2 q / o
            (2048, 2048, 8192),
        ]
    };
    let mut failed = false;
    for kernel in [Kernel::F32, Kernel::F16, Kernel::F16Coop, Kernel::I8] {
        if kernel == Kernel::F16Coop && !ctx.has_coop_matrix_f16() {
            if !json {
                println!(
                    "{:<12} skipped: no VK_NV_cooperative_matrix here",
                    kernel.name()
                );
            }
            continue;
        }
        for &(m, k, n) in &shapes {
            let result = (|| -> hetsched_gpu::Result<(usize, f64, f64)> {
                let o = operands(&ctx, kernel, (m, k, n))?;
                let warm = run(&ctx, kernel, &o, 1)?.unwrap_or(1).max(1);
                let err = spot_check(&ctx, kernel, &o, (m, k, n))?;
                let repeat = (300_000_000 / warm).clamp(1, 200) as usize;
                let ns = run(&ctx, kernel, &o, repeat)?.unwrap_or(1).max(1) as f64;
                Ok((repeat, ns / repeat as f64, err))
            })();
            match result {
                Ok((repeat, ns, err)) => {
                    let tflops = 2.0 * (m * n * k) as f64 / ns / 1e3;
                    let peak = peaks.as_ref().map(|p| match kernel {
                        Kernel::F32 => p.f32,
                        Kernel::F16 | Kernel::F16Coop => p.f16_tensor,
                        Kernel::I8 => p.i8_tensor,
                    });
                    let pct = peak.map(|p| 100.0 * tflops / p);
                    let tol = if kernel == Kernel::I8 { 0.0 } else { 1e-3 };
                    failed |= err > tol;
                    if json {
                        println!(
                            "{{\"kernel\":\"{}\",\"m\":{m},\"k\":{k},\"n\":{n},\"repeat\":{repeat},\"gpu_ms\":{:.4},\"tflops\":{:.3},\"peak\":{},\"pct_of_peak\":{},\"max_rel_err\":{:.3e}}}",
                            kernel.name(),
                            ns / 1e6,
                            tflops,
                            peak.map_or("null".into(), |p| format!("{p}")),
                            pct.map_or("null".into(), |p| format!("{p:.1}")),
                            err
                        );
                    } else {
                        println!(
                            "{:<12} {m:>6} {k:>6} {n:>6} {repeat:>7} {:>10.4} {tflops:>9.2} {:>8} {err:>9.1e}",
                            kernel.name(),
                            ns / 1e6,
                            pct.map_or("-".into(), |p| format!("{p:.1}%"))
                        );
                    }
                }
                Err(e) => {
                    failed = true;
                    eprintln!("error: {} {m}x{k}x{n}: {e}", kernel.name());
                }
            }
        }
    }
    if failed {
        eprintln!("error: a kernel failed or its spot check exceeded the tolerance");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
