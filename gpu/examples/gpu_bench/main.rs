//! GEMM throughput on the chosen Vulkan device, timed with GPU timestamps.
//!
//! ```sh
//! cargo run --release -p hetsched-gpu --example gpu_bench            # table
//! cargo run --release -p hetsched-gpu --example gpu_bench -- --json F # also JSON lines into F
//! cargo run --release -p hetsched-gpu --example gpu_bench -- --quick # small shapes (lavapipe)
//! cargo run --release -p hetsched-gpu --example gpu_bench -- --kernels f16-coopmat-khr,f32
//! ```
//!
//! For every kernel (f32 with auto / 128 / 64 tiles, f16, f16 on NV and KHR cooperative
//! matrices where offered, INT8; `--kernels` picks some by name, the KHR tile variants
//! included) and shape: upload random operands once, run once and spot-check 64 outputs
//! against f64 dot products on the CPU, keep the GPU busy for about 0.3 s so that its clocks
//! ramp up, then time three submissions of R back-to-back calls each (R chosen so one takes
//! about 0.1 s) and report the median `2·m·n·k·R / GPU time` (the best in JSON too). Peaks
//! are printed for the GPUs we know; elsewhere the percentage is left out. A second table
//! gives the GPU time of the other kernels at SmolLM2 shapes (one 512-token chunk).

use std::process::ExitCode;

use half::f16;
use std::io::Write;

use hetsched_gpu::{CoopKernel, DeviceInfo, Elem, GemmTile, GpuContext, GpuMatrix, GpuOptions};
use hetsched_kernels::seeded::SeededRng;

mod args;
mod ops;

use args::{json_arg, kernels_arg, shapes_arg};
use ops::ops_table;

#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    F32,
    F32Large,
    F32Small,
    F16,
    Coop(CoopKernel),
    I8,
}

/// The kernels measured without `--kernels`: every kernel but the KHR tile variants.
const DEFAULT_KERNELS: &[Kernel] = &[
    Kernel::F32,
    Kernel::F32Large,
    Kernel::F32Small,
    Kernel::F16,
    Kernel::Coop(CoopKernel::Nv),
    Kernel::Coop(CoopKernel::Khr),
    Kernel::I8,
];

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::F32 => "f32",
            Kernel::F32Large => "f32-128",
            Kernel::F32Small => "f32-64",
            Kernel::F16 => "f16",
            Kernel::Coop(k) => k.name(),
            Kernel::I8 => "i8",
        }
    }

    fn all() -> impl Iterator<Item = Kernel> {
        [Kernel::F32, Kernel::F32Large, Kernel::F32Small, Kernel::F16]
            .into_iter()
            .chain(CoopKernel::ALL.iter().map(|&k| Kernel::Coop(k)))
            .chain([Kernel::I8])
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
        Kernel::F32 | Kernel::F32Large | Kernel::F32Small => Operands {
            a: ctx.upload_f32(&a_host, m, k)?,
            w: ctx.upload_f32(&w_host, n, k)?,
            out: ctx.alloc_matrix(m, n, Elem::F32)?,
            a_host,
            w_host,
        },
        Kernel::F16 | Kernel::Coop(_) => {
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
        Kernel::F32Large => {
            ctx.matmul_f32_device_with((&o.a, &o.w, &o.out), GemmTile::Large, repeat)
        }
        Kernel::F32Small => {
            ctx.matmul_f32_device_with((&o.a, &o.w, &o.out), GemmTile::Small, repeat)
        }
        Kernel::F16 => ctx.matmul_f16_device_repeat(&o.a, &o.w, &o.out, repeat),
        Kernel::Coop(k) => ctx.matmul_f16_coop_device_with((&o.a, &o.w, &o.out), k, repeat),
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

/// Median and best GPU ns per call, the batch size, and the spot-check error.
struct Measured {
    repeat: usize,
    median_ns: f64,
    best_ns: f64,
    err: f64,
}

fn measure(
    ctx: &GpuContext,
    kernel: Kernel,
    shape: (usize, usize, usize),
) -> hetsched_gpu::Result<Measured> {
    let o = operands(ctx, kernel, shape)?;
    let first = run(ctx, kernel, &o, 1)?.unwrap_or(1).max(1);
    let err = spot_check(ctx, kernel, &o, shape)?;
    // Clocks ramp up under load: about 0.3 s of work before timing.
    let warm = (300_000_000 / first).clamp(1, 400) as usize;
    let one = run(ctx, kernel, &o, warm)?.unwrap_or(1).max(1) / warm as u64;
    let repeat = (100_000_000 / one.max(1)).clamp(1, 400) as usize;
    let mut per_call = Vec::new();
    for _ in 0..3 {
        per_call.push(run(ctx, kernel, &o, repeat)?.unwrap_or(1).max(1) as f64 / repeat as f64);
    }
    per_call.sort_by(f64::total_cmp);
    Ok(Measured {
        repeat,
        median_ns: per_call[1],
        best_ns: per_call[0],
        err,
    })
}

/// The GEMM table; returns false when a kernel failed or missed its tolerance.
fn gemm_table(
    ctx: &GpuContext,
    kernels: &[Kernel],
    shapes: &[(usize, usize, usize)],
    json: &mut Option<std::fs::File>,
) -> bool {
    let peaks = peaks(ctx.info());
    println!(
        "{:<24} {:>6} {:>6} {:>6} {:>7} {:>10} {:>9} {:>9} {:>8} {:>9}",
        "kernel", "m", "k", "n", "repeat", "ms/call", "T(FL)OPS", "best", "% peak", "max err"
    );
    let mut ok = true;
    for &kernel in kernels {
        if let Kernel::Coop(k) = kernel
            && let Err(why) = ctx.check_coop(k)
        {
            println!("{:<24} skipped: {why}", kernel.name());
            continue;
        }
        for &(m, k, n) in shapes {
            let r = match measure(ctx, kernel, (m, k, n)) {
                Ok(r) => r,
                Err(e) => {
                    ok = false;
                    println!("{:<24} {m:>6} {k:>6} {n:>6} error: {e}", kernel.name());
                    continue;
                }
            };
            let ops = 2.0 * (m * n * k) as f64;
            let (tflops, best) = (ops / r.median_ns / 1e3, ops / r.best_ns / 1e3);
            let peak = peaks.as_ref().map(|p| match kernel {
                Kernel::F32 | Kernel::F32Large | Kernel::F32Small => p.f32,
                Kernel::F16 | Kernel::Coop(_) => p.f16_tensor,
                Kernel::I8 => p.i8_tensor,
            });
            let pct = peak.map(|p| 100.0 * tflops / p);
            ok &= r.err <= if kernel == Kernel::I8 { 0.0 } else { 1e-3 };
            println!(
                "{:<24} {m:>6} {k:>6} {n:>6} {:>7} {:>10.4} {tflops:>9.2} {best:>9.2} {:>8} {:>9.1e}",
                kernel.name(),
                r.repeat,
                r.median_ns / 1e6,
                pct.map_or("-".into(), |p| format!("{p:.1}%")),
                r.err
            );
            if let Some(f) = json.as_mut() {
                let _ = writeln!(
                    f,
                    "{{\"kernel\":\"{}\",\"m\":{m},\"k\":{k},\"n\":{n},\"repeat\":{},\"gpu_ms\":{:.4},\"tflops\":{tflops:.3},\"best_tflops\":{best:.3},\"peak\":{},\"pct_of_peak\":{},\"max_rel_err\":{:.3e}}}",
                    kernel.name(),
                    r.repeat,
                    r.median_ns / 1e6,
                    peak.map_or("null".into(), |p| format!("{p}")),
                    pct.map_or("null".into(), |p| format!("{p:.1}")),
                    r.err
                );
            }
        }
    }
    ok
}

/// Prints the device and its features (and writes them to `json`).
fn print_device(info: &hetsched_gpu::DeviceInfo, json: &mut Option<std::fs::File>) {
    println!(
        "device {} ({:?}), {}, Vulkan {}",
        info.name, info.kind, info.driver, info.api_version
    );
    println!(
        "timestamps {}, coop matrix NV {} KHR {} (f16 shapes {:?}), int8 {}, f16 {}, f64 {}, \
         subgroup {:?}, shared memory {} B",
        info.has_timestamps(),
        info.coop_matrix_nv,
        info.coop_matrix_khr,
        info.coop_matrix_khr_f16_shapes,
        info.shader_int8,
        info.shader_f16,
        info.shader_f64,
        info.subgroup_size,
        info.max_shared_memory
    );
    if let Some(f) = json.as_mut() {
        let _ = writeln!(
            f,
            "{{\"device\":\"{}\",\"kind\":\"{:?}\",\"driver\":\"{}\",\"vulkan\":\"{}\",\"coop_matrix_nv\":{},\"coop_matrix_khr\":{},\"coop_matrix_khr_f16_shapes\":{:?},\"max_storage_buffer_range\":{}}}",
            info.name,
            info.kind,
            info.driver.replace('"', "'"),
            info.api_version,
            info.coop_matrix_nv,
            info.coop_matrix_khr,
            info.coop_matrix_khr_f16_shapes,
            info.max_storage_buffer_range
        );
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let parsed = json_arg(&args).and_then(|json| Ok((json, kernels_arg(&args)?)));
    let (mut json, (only, kernels)) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = match GpuContext::new(GpuOptions::default()) {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let info = ctx.info().clone();
    print_device(&info, &mut json);
    if !info.has_timestamps() {
        eprintln!("error: this device's compute queue has no timestamps; nothing to measure");
        return ExitCode::FAILURE;
    }
    let shapes = match shapes_arg(&args, quick) {
        Ok(shapes) => shapes,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gemm_ok = gemm_table(&ctx, &kernels, &shapes, &mut json);
    let ops_ok = only.is_some() || ops_table(&ctx, &mut json);
    if !(gemm_ok && ops_ok) {
        eprintln!("error: a kernel failed or its spot check exceeded the tolerance");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
