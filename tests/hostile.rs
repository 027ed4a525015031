//! Hostile input: GGUF headers, `config.json`, scenes and calibration files built to
//! exhaust memory or time, or to slip past the readers, each refused with a typed error,
//! in well under a second and without a large allocation (measured here by a counting
//! allocator), never a panic, an abort or a hang. docs/robustness.md lists the limits.

// A counting global allocator needs `unsafe impl GlobalAlloc`; it only forwards to
// `System` and adds bookkeeping.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hetsched::exec::{Calibration, ExecError, ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::gguf::writer::{GgufWriter, TinyModel};
use hetsched::import::{GgmlType, GgufFile, GgufHeader, HfModel, ImportError, LlamaConfig};
use hetsched::scene::{Scene, SceneError};
use hetsched::systems::PlanError;
use proptest::prelude::*;

#[path = "common/calibration.rs"]
mod calibration_fixture;
use calibration_fixture::tiny_calibration;

/// `System`, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's layout and pointer; the
// counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measured refusal at a time, so that the peak is this test's.
static MEASURED: Mutex<()> = Mutex::new(());

/// Most a refusal may allocate beyond what was live when it began.
const ALLOCATION_BUDGET: usize = 64 << 20;

/// Runs `f`, asserting it took under a second and allocated under the budget.
fn refused_quickly<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let _one = MEASURED.lock().unwrap_or_else(|e| e.into_inner());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let started = Instant::now();
    let out = f();
    let took = started.elapsed();
    let grew = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    println!("{what}: refused in {took:?}, peak {grew} bytes allocated");
    assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    assert!(grew < ALLOCATION_BUDGET, "{what} allocated {grew} bytes");
    out
}

/// A fresh directory under the system's temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hetsched-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------
// GGUF

const H: usize = 8;
const FFN: usize = 16;
const VOCAB: usize = 10;

/// A 1-layer f32 llama with `context`; `poison` names a tensor given one NaN.
fn tiny_gguf(context: u64, poison: Option<&str>) -> Vec<u8> {
    let m = TinyModel {
        arch: "llama",
        layers: 1,
        hidden: H,
        heads: 2,
        kv_heads: 1,
        ffn: FFN,
        vocab: VOCAB,
        context,
        tied: true,
    };
    let mut seed = 0u32;
    let w = GgufWriter::tiny_model(&m, |name, n| {
        seed += 1;
        let mut values: Vec<f32> = (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 4000.0 - 0.12
            })
            .collect();
        if poison == Some(name) {
            values[n / 2] = f32::NAN;
        }
        values
    });
    w.to_bytes()
}

fn config_error(bytes: Vec<u8>) -> ImportError {
    let file = GgufFile::from_bytes(bytes).expect("the header itself is well formed");
    LlamaConfig::from_gguf(&file).expect_err("the config must be refused")
}

#[test]
fn a_gguf_context_of_2_pow_32_is_refused_before_the_rope_table() {
    for context in [u64::from(u32::MAX), 100_000_000] {
        let bytes = tiny_gguf(context, None);
        let err = refused_quickly("huge context_length", || config_error(bytes));
        assert!(
            matches!(&err, ImportError::Limit(l) if l.what == "llama.context_length"),
            "{err}"
        );
    }
}

#[test]
fn the_tiny_gguf_itself_loads_and_runs() {
    let file = GgufFile::from_bytes(tiny_gguf(64, None)).unwrap();
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let out = prefill(model, &[1, 2, 3], &PrefillOptions::default()).unwrap();
    assert!(out.logits.iter().all(|v| v.is_finite()));
}

#[test]
fn a_nan_weight_is_refused_at_load_naming_its_tensor() {
    let file = GgufFile::from_bytes(tiny_gguf(64, Some("blk.0.attn_q.weight"))).unwrap();
    for precision in [LinearPrecision::F32, LinearPrecision::W8a8] {
        let err = ExecModel::load(&file, precision).unwrap_err();
        assert!(
            matches!(&err, ImportError::NonFiniteWeight { tensor, .. } if tensor == "blk.0.attn_q.weight"),
            "{precision:?}: {err}"
        );
    }
}

/// The tiny model with finite weights whose activations overflow in layer 0's FFN.
fn overflowing_ffn_model() -> Arc<ExecModel> {
    overflowing_model(
        |name| name.ends_with("ffn_down.weight") || name.ends_with("ffn_up.weight"),
        1e30,
        LinearPrecision::F32,
    )
}

/// The tiny model at `precision` with the tensors `scaled` names multiplied by `factor`.
fn overflowing_model(
    scaled: impl Fn(&str) -> bool,
    factor: f32,
    precision: LinearPrecision,
) -> Arc<ExecModel> {
    let mut w = GgufWriter::new();
    let base = GgufFile::from_bytes(tiny_gguf(64, None)).unwrap();
    for (key, value) in base.metadata().iter() {
        w.kv(key, value.clone());
    }
    for view in base.tensors() {
        let mut values = view.to_f32().unwrap();
        let name = view.name();
        if scaled(name) {
            values.iter_mut().for_each(|v| *v *= factor);
        }
        w.tensor_f32(name, &view.shape(), &values);
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Arc::new(ExecModel::load(&file, precision).unwrap())
}

/// Norm weights of 3e38 overflow the normalized rows to infinity before any linear: every
/// precision refuses, naming the layer, where an INT8 quantizer would otherwise saturate
/// the infinities into plausible integers. (The tiny model's widths are too narrow for
/// the grouped W4 precisions.)
#[test]
fn an_overflowing_norm_is_an_error_at_every_precision() {
    for precision in [
        LinearPrecision::F32,
        LinearPrecision::W8a8,
        LinearPrecision::W4a8,
    ] {
        let model = overflowing_model(|name| name.ends_with("attn_norm.weight"), 3e38, precision);
        match prefill(model, &[1, 2, 3], &PrefillOptions::default()) {
            Ok(result) => panic!(
                "{precision:?}: an overflowing norm gave an answer (first logits {:?})",
                &result.logits[..4]
            ),
            Err(err) => {
                let message = err.to_string();
                assert!(message.contains("layer 0"), "{precision:?}: {message}");
            }
        }
    }
}

#[test]
fn huge_weights_give_an_error_not_an_empty_answer() {
    let err = prefill(
        overflowing_ffn_model(),
        &[1, 2, 3],
        &PrefillOptions::default(),
    )
    .unwrap_err();
    // The stage that first overflows fails its job; its queue reports the typed error's
    // message, naming the layer and the block.
    let message = err.to_string();
    assert!(
        message.contains("layer 0's feed-forward block produced a non-finite value"),
        "{message}"
    );
}

/// With every stage resident on the GPU (`cargo test --features gpu --test hostile`, on
/// lavapipe in CI), the device flags the block instead of reading activations back.
#[cfg(feature = "gpu")]
#[test]
fn huge_weights_on_the_resident_gpu_path_name_the_block() {
    let options = PrefillOptions {
        gpu: hetsched::exec::GpuUse::Resident,
        chunk_len: 2,
        ..PrefillOptions::default()
    };
    match prefill(overflowing_ffn_model(), &[1, 2, 3], &options) {
        Err(ExecError::Gpu(reason))
            if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") =>
        {
            println!("skipped: no Vulkan device ({reason})");
        }
        Err(err) => assert!(
            matches!(
                err,
                ExecError::NonFiniteOnDevice {
                    layer: 0,
                    block: "feed-forward",
                    chunk: 0
                }
            ),
            "{err}"
        ),
        Ok(_) => panic!("an overflowing model gave logits on the GPU"),
    }
}

#[test]
fn zero_threads_and_zero_chunks_are_typed_errors() {
    let file = GgufFile::from_bytes(tiny_gguf(64, None)).unwrap();
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    for options in [
        PrefillOptions {
            threads: 0,
            ..PrefillOptions::default()
        },
        PrefillOptions {
            chunk_len: 0,
            ..PrefillOptions::default()
        },
    ] {
        let err = prefill(model.clone(), &[1, 2], &options).unwrap_err();
        assert!(matches!(err, ExecError::InvalidOption { .. }), "{err}");
    }
}

/// Two f32 tensors, the first declared as `dims`/`ty` but given 128 bytes of data.
fn two_tensors(dims: &[u64], ty: GgmlType) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.tensor_raw("first", dims, ty.id(), vec![0; 128]);
    w.tensor_f32("second", &[32], &[0.5; 32]);
    w.to_bytes()
}

#[test]
fn overlapping_tensors_are_refused() {
    // 64 f32 = 256 bytes declared, 128 given: the first runs into the second.
    let bytes = two_tensors(&[64], GgmlType::F32);
    let err = refused_quickly("overlap", || GgufHeader::parse(&bytes).unwrap_err());
    assert!(
        matches!(&err, ImportError::TensorsOverlap { first, second, .. } if first == "first" && second == "second"),
        "{err}"
    );
}

#[test]
fn a_tensor_retyped_to_a_smaller_type_is_refused() {
    // 32 elements were f32 (128 bytes); as f16 they need 64 and leave 64 unowned.
    let bytes = two_tensors(&[32], GgmlType::F16);
    let err = refused_quickly("retyped", || GgufHeader::parse(&bytes).unwrap_err());
    assert!(
        matches!(&err, ImportError::TensorSizeMismatch { name, size: 64, space: 128, .. } if name == "first"),
        "{err}"
    );
    // The honest layout parses.
    GgufHeader::parse(&two_tensors(&[32], GgmlType::F32)).unwrap();
}

#[test]
fn a_metadata_array_of_many_small_elements_is_refused_before_reserving() {
    // 2^25 one-byte elements are really in the file (32 MiB), so the count passes the
    // bytes-left check; held as values they would take over 1 GiB.
    let len: u64 = 1 << 25;
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes()); // tensors
    bytes.extend(1u64.to_le_bytes()); // key/value pairs
    let key = b"big";
    bytes.extend((key.len() as u64).to_le_bytes());
    bytes.extend(key);
    bytes.extend(9u32.to_le_bytes()); // array
    bytes.extend(0u32.to_le_bytes()); // of u8
    bytes.extend(len.to_le_bytes());
    bytes.resize(bytes.len() + len as usize, 7);
    let err = refused_quickly("2^25-element array", || {
        GgufHeader::parse(&bytes).unwrap_err()
    });
    assert!(
        matches!(&err, ImportError::Limit(l) if l.what == "array length"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any header field overwritten with any value: an error or a file, never a panic
    /// or a huge allocation.
    #[test]
    fn mutated_gguf_headers_never_panic(at in 0usize..400, value in any::<u64>(), width in 1usize..=8) {
        let mut bytes = tiny_gguf(64, None);
        let at = at.min(bytes.len() - width);
        bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            let _ = LlamaConfig::from_gguf(&file);
        }
    }
}

// ---------------------------------------------------------------------------
// Hugging Face config.json

fn hf_config(layers: &str, context: &str) -> String {
    format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": {layers},
            "rms_norm_eps": 1e-5, "max_position_embeddings": {context}, "vocab_size": 100}}"#
    )
}

#[test]
fn a_config_json_with_absurd_sizes_is_refused_before_allocating() {
    for (name, layers, context, field) in [
        ("layers", "1000000000000", "2048", "llama.block_count"),
        (
            "context",
            "2",
            "9223372036854775808",
            "llama.context_length",
        ),
    ] {
        let dir = scratch(&format!("hf-{name}"));
        std::fs::write(dir.join("config.json"), hf_config(layers, context)).unwrap();
        let err = refused_quickly(name, || HfModel::open(&dir).unwrap_err());
        assert!(
            matches!(&err, ImportError::Limit(l) if l.what == field),
            "{name}: {err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn an_endless_config_json_is_refused() {
    if !Path::new("/dev/zero").exists() {
        return;
    }
    let dir = scratch("hf-zero");
    std::os::unix::fs::symlink("/dev/zero", dir.join("config.json")).unwrap();
    let err = refused_quickly("/dev/zero config", || HfModel::open(&dir).unwrap_err());
    assert!(err.to_string().contains("above the limit"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Scenes

const DESKTOP: &str = include_str!("../scenes/devices/desktop.toml");
const SMOLLM: &str = include_str!("../scenes/models/smollm2-135m.toml");
const LLAMA_7B: &str = include_str!("../scenes/models/llama-2-7b.toml");

/// Writes a scene over `device` and `model` texts and loads it.
fn scene(name: &str, device: &str, model: &str, workload: &str) -> Result<Scene, SceneError> {
    let dir = scratch(name);
    std::fs::write(dir.join("device.toml"), device).unwrap();
    std::fs::write(dir.join("model.toml"), model).unwrap();
    let text = format!(
        "name = \"{name}\"\ndevice = \"device.toml\"\nmodel = \"model.toml\"\n[workload]\n{workload}\n"
    );
    std::fs::write(dir.join("scene.toml"), text).unwrap();
    let out = Scene::load(&dir.join("scene.toml"));
    let _ = std::fs::remove_dir_all(&dir);
    out
}

const WORKLOAD: &str = "prompt_len = 256\nchunk_len = 64";

fn plan_error(name: &str, device: &str, model: &str, workload: &str) -> SceneError {
    refused_quickly(name, || {
        scene(name, device, model, workload)
            .and_then(|s| s.plan().map(|_| ()))
            .expect_err("the scene must be refused")
    })
}

#[test]
fn the_base_scene_is_fine() {
    scene("base", DESKTOP, SMOLLM, WORKLOAD)
        .unwrap()
        .plan()
        .unwrap();
}

#[test]
fn absurd_cost_fields_are_refused_naming_the_field() {
    for (field, from, to) in [
        ("launch_us", "launch_us = 5.0", "launch_us = 1e300"),
        (
            "bandwidth_gbps",
            "bandwidth_gbps = 20.0",
            "bandwidth_gbps = 1e-300",
        ),
        ("launch_us", "launch_us = 5.0", "launch_us = -1.0"),
        ("peak_gops.int8", "int8 = 200.0", "int8 = inf"),
        (
            "op_overhead_us",
            "op_overhead_us = 2.0",
            "op_overhead_us = nan",
        ),
    ] {
        let device = DESKTOP.replacen(from, to, 1);
        let err = plan_error(field, &device, SMOLLM, WORKLOAD);
        assert!(
            matches!(&err, SceneError::Plan(PlanError::InvalidDevice(m)) if m.contains(field)),
            "{to}: {err}"
        );
    }
}

#[test]
fn a_linear_with_a_zero_dimension_is_refused_not_priced_at_zero() {
    for field in ["in_features", "out_features"] {
        let model = format!(
            "{SMOLLM}\n[[layer_ops]]\nname = \"norm\"\nkind = \"rms_norm\"\n\n[[layer_ops]]\nname = \"proj\"\nkind = \"linear\"\ninputs = [\"norm\"]\n{field} = 0\n"
        );
        let err = plan_error(field, DESKTOP, &model, WORKLOAD);
        assert!(
            err.to_string().contains("zero dimension") && err.to_string().contains("`proj`"),
            "{field}: {err}"
        );
    }
}

#[test]
fn modeled_times_past_u64_nanoseconds_are_refused() {
    // Every field in range, but a 7B model at a millionth of a GOPS takes ~10^19 ns.
    let device = DESKTOP
        .replace(
            "{ int8 = 200.0, fp16 = 50.0, fp32 = 50.0 }",
            "{ int8 = 1e-6, fp16 = 1e-6, fp32 = 1e-6 }",
        )
        .replace("bandwidth_gbps = 20.0", "bandwidth_gbps = 1e-6");
    let err = plan_error(
        "overflow",
        &device,
        LLAMA_7B,
        "prompt_len = 1024\nchunk_len = 128",
    );
    assert!(matches!(err, SceneError::CostOverflow { .. }), "{err}");
}

#[test]
fn a_model_of_a_billion_layers_is_refused_not_built() {
    let model = SMOLLM.replacen("layers = 30", "layers = 1000000000", 1);
    assert_ne!(model, SMOLLM, "the shipped model file changed");
    let err = refused_quickly("1e9 layers", || {
        scene("layers", DESKTOP, &model, WORKLOAD).unwrap_err()
    });
    assert!(
        matches!(&err, SceneError::Limit(l) if l.what.contains("layers")),
        "{err}"
    );
}

#[test]
fn a_plan_of_millions_of_instances_is_refused_before_it_is_built() {
    // 8192 one-token chunks of a 30-layer model: over a million subgraph instances.
    let err = plan_error(
        "instances",
        DESKTOP,
        SMOLLM,
        "prompt_len = 8192\nchunk_len = 1",
    );
    assert!(
        matches!(&err, SceneError::Limit(l) if l.what.contains("instances")),
        "{err}"
    );
}

#[test]
fn a_device_file_that_never_ends_is_refused() {
    if !Path::new("/dev/zero").exists() {
        return;
    }
    let dir = scratch("zero-device");
    std::os::unix::fs::symlink("/dev/zero", dir.join("device.toml")).unwrap();
    std::fs::write(dir.join("model.toml"), SMOLLM).unwrap();
    std::fs::write(
        dir.join("scene.toml"),
        format!("name = \"z\"\ndevice = \"device.toml\"\nmodel = \"model.toml\"\n[workload]\n{WORKLOAD}\n"),
    )
    .unwrap();
    let err = refused_quickly("/dev/zero device", || {
        Scene::load(&dir.join("scene.toml")).unwrap_err()
    });
    assert!(
        matches!(&err, SceneError::Io { message, .. } if message.contains("above the limit")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any number in any field of the device file: a scene, or an error; never a panic
    /// (debug builds check every u64 sum the plan makes).
    #[test]
    fn any_number_in_a_device_file_never_panics(field in 0usize..8, value in prop_oneof![
        any::<f64>(), Just(1e300), Just(1e-300), Just(0.0), Just(-1.0), Just(f64::MAX)
    ]) {
        let fields = ["int8 = 200.0", "fp16 = 50.0", "fp32 = 50.0", "bandwidth_gbps = 20.0",
            "launch_us = 5.0", "op_overhead_us = 2.0", "memory_gib = 24.0", "launch_us = 5.0"];
        let key = fields[field].split(" = ").next().unwrap();
        let number = if value.is_nan() { "nan".to_string() } else if value.is_infinite() {
            if value > 0.0 { "inf".into() } else { "-inf".into() }
        } else { format!("{value:e}") };
        let device = DESKTOP.replacen(fields[field], &format!("{key} = {number}"), 1);
        if let Ok(s) = scene(&format!("device-prop-{field}"), &device, LLAMA_7B, "prompt_len = 512\nchunk_len = 128") {
            let _ = s.plan();
        }
    }
}

// ---------------------------------------------------------------------------
// Calibration files

/// The tiny calibration every site of whose keeps its shadow.
fn calibration() -> Calibration {
    tiny_calibration(None, |_| true)
}

/// Saves `edit`ed JSON of a valid calibration and loads it back.
fn load_edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<Calibration, String> {
    let mut value = serde_json::to_value(calibration()).unwrap();
    edit(&mut value);
    let dir = scratch(name);
    let path = dir.join("calibration.json");
    std::fs::write(&path, value.to_string()).unwrap();
    let out = refused_quickly(name, || Calibration::load(&path)).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn a_valid_calibration_round_trips() {
    let loaded = load_edited("valid", |_| {}).unwrap();
    assert_eq!(loaded, calibration());
}

/// A change to a calibration's JSON.
type Edit = fn(&mut serde_json::Value);

#[test]
fn hostile_calibrations_are_refused_before_use() {
    let cases: [(&str, &str, Edit); 8] = [
        ("channels", "channels", |v| {
            v["sites"][0]["channels"] = 4_294_967_295u64.into()
        }),
        ("hot channel", "names channel", |v| {
            v["sites"][0]["hot_channels"][0]["channel"] = 4_000_000u64.into()
        }),
        ("top channel", "names channel", |v| {
            v["sites"][1]["top_channels"][0] = 9u64.into()
        }),
        ("layer", "layers", |v| v["sites"][0]["layer"] = 7u64.into()),
        ("duplicate", "twice", |v| {
            let first = v["sites"][0].clone();
            v["sites"][1] = first;
        }),
        ("negative scale", "scale", |v| {
            v["sites"][2]["scale_max"] = (-0.5).into()
        }),
        ("zero scale", "scale", |v| {
            v["sites"][2]["scale_max"] = 0.0.into()
        }),
        ("hidden", "limit", |v| {
            v["model"]["hidden"] = 4_294_967_295u64.into()
        }),
    ];
    for (name, says, edit) in cases {
        let err = load_edited(name, edit).expect_err(name);
        assert!(
            err.contains("corrupt") && err.contains(says),
            "{name}: {err}"
        );
    }
}

#[test]
fn non_finite_calibration_statistics_are_refused() {
    // JSON has no NaN: `calibrate` wrote them as null, which must not load as 0.
    let err = load_edited("null", |v| v["sites"][0]["rms"] = serde_json::Value::Null)
        .expect_err("null rms");
    assert!(err.contains("corrupt"), "{err}");
    let err = load_edited("huge", |v| v["sites"][0]["max"] = 1e300.into()).expect_err("1e300");
    assert!(err.contains("corrupt"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any number in any numeric field of a site: a calibration or an error, never a
    /// panic.
    #[test]
    fn any_number_in_a_calibration_never_panics(field in 0usize..9, value in prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::from(u64::MAX)),
    ]) {
        let fields = ["layer", "channels", "min", "max", "rms", "scale_max", "scale_percentile",
            "elements", "row_bytes"];
        let _ = load_edited(&format!("calibration-prop-{field}"), |v| v["sites"][3][fields[field]] = value);
    }
}
