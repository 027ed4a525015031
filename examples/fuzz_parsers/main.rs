//! A seeded mutation fuzzer for the parsers of untrusted input: GGUF files, safetensors
//! headers, scene/device/model TOML, calibration JSON, run histories (read, checked and
//! fitted into a profile, as `profile --from-history` does) and measured device profiles. (cargo-fuzz needs a nightly
//! toolchain; this runs on stable.)
//!
//! ```text
//! cargo run --release --example fuzz_parsers -- [--iterations N] [--seed S] [--only NAME]
//!     [--slow-ms MS] [--replay FILE]
//! ```
//!
//! Each parser starts from valid inputs built here and mutates them with
//! [`SeededRng`]: bit flips, bytes overwritten with 0/0xFF/0x7F/0x80, u32/u64 fields
//! overwritten with boundary values, numbers in text replaced by extreme ones, truncation,
//! chunk duplication and deletion, and splices between inputs. Inputs a parser accepts
//! may join the pool mutated further. Every call runs under `catch_unwind`: a panic prints
//! the input, saves it under `target/fuzz-crashes/` and makes the exit status non-zero, as
//! does an input slower than `--slow-ms` (default 1000). Each parser's slowest input is
//! saved there too; `--replay FILE --only NAME` runs one saved input again, timed. See docs/robustness.md, "Fuzzing", for the measured runs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hetsched::exec::Calibration;
use hetsched::import::gguf::writer::{GgufWriter, TinyModel};
use hetsched::import::hf::safetensors_tensor_names;
use hetsched::import::{GgmlType, GgufFile, GgufSource, LlamaSource, MetadataValue as V};
use std::sync::Arc;

use hetsched::engine::simulate;
use hetsched::history::{
    HistoryScope, HistoryTally, check_records, parse_history, records_on, require_samples,
};
use hetsched::profiling::fit_profile_alone;
use hetsched::scene::Scene;
use hetsched::systems::testing::{bare_profile_origin, tiny_plan};
use hetsched::systems::{PolicyRegistry, PrefillPlan};
use hetsched_kernels::seeded::SeededRng;

#[path = "../../tests/common/calibration.rs"]
mod calibration_fixture;
mod mutate;

use calibration_fixture::tiny_calibration;
use mutate::{below, mutate};

const SCENE: &str = include_str!("../../scenes/smollm2-135m-desktop.toml");
const SCENES: [&str; 3] = [
    SCENE,
    include_str!("../../scenes/qwen1.5-1.8b-xiaomi14-gpu.toml"),
    include_str!("../../scenes/llama-2-7b-k60pro.toml"),
];
const DEVICE: &str = include_str!("../../scenes/devices/desktop.toml");
const DEVICES: [&str; 4] = [
    DEVICE,
    include_str!("../../scenes/devices/k60pro.toml"),
    include_str!("../../scenes/devices/xiaomi14.toml"),
    include_str!("../../scenes/devices/xiaomi14-gpu.toml"),
];
const MODEL: &str = include_str!("../../scenes/models/smollm2-135m.toml");
const MODELS: [&str; 4] = [
    MODEL,
    include_str!("../../scenes/models/gemma-2b.toml"),
    include_str!("../../scenes/models/llama-2-7b.toml"),
    include_str!("../../scenes/models/qwen1.5-1.8b.toml"),
];

/// The largest input a mutation may grow to.
const MAX_INPUT: usize = 1 << 20;
/// The most accepted inputs kept for further mutation.
const MAX_POOL: usize = 512;

/// What a parser made of one input.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Refused,
}

struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    run: fn(&[u8]) -> Outcome,
}

fn outcome<T, E>(r: Result<T, E>) -> Outcome {
    if r.is_ok() {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

// ---------------------------------------------------------------------------
// Parsers

/// The header (which decides the outcome), then every tensor decoded, the llama config
/// and every tensor's shape, and the token embedding read.
fn run_gguf(bytes: &[u8]) -> Outcome {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return Outcome::Refused;
    };
    for t in file.tensors() {
        let _ = t.to_f32();
    }
    if let Ok(source) = GgufSource::new(&file) {
        let _ = source.token_embd();
    }
    Outcome::Accepted
}

const SAFETENSORS_DATA: usize = 64;

/// A header JSON (input starting with `{`, wrapped with its length and
/// `SAFETENSORS_DATA` bytes of data) or a whole file.
fn run_safetensors(bytes: &[u8]) -> Outcome {
    let wrapped;
    let file = if bytes.first() == Some(&b'{') {
        wrapped = [
            &(bytes.len() as u64).to_le_bytes()[..],
            bytes,
            &[0x3c; SAFETENSORS_DATA],
        ]
        .concat();
        &wrapped[..]
    } else {
        bytes
    };
    let Ok(names) = safetensors_tensor_names(file) else {
        return Outcome::Refused;
    };
    let Ok(st) = safetensors::SafeTensors::deserialize(file) else {
        return Outcome::Refused;
    };
    for name in names {
        if let Ok(view) = st.tensor(&name) {
            let _ = view.data().len() * view.shape().len();
        }
    }
    Outcome::Accepted
}

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

fn run_scene(bytes: &[u8]) -> Outcome {
    text(bytes).map_or(Outcome::Refused, |t| {
        outcome(Scene::from_texts(t, DEVICE, MODEL))
    })
}

fn run_device(bytes: &[u8]) -> Outcome {
    text(bytes).map_or(Outcome::Refused, |t| {
        outcome(Scene::from_texts(SCENE, t, MODEL))
    })
}

fn run_model(bytes: &[u8]) -> Outcome {
    text(bytes).map_or(Outcome::Refused, |t| {
        outcome(Scene::from_texts(SCENE, DEVICE, t))
    })
}

/// Parse and validate (which decide the outcome), then the derived statistics and a
/// prune.
fn run_calibration(bytes: &[u8]) -> Outcome {
    let Some(t) = text(bytes) else {
        return Outcome::Refused;
    };
    let Ok(mut c) = Calibration::parse(t, Path::new("<fuzz>/calibration.json")) else {
        return Outcome::Refused;
    };
    let _ = c.outlier_stats();
    for s in &c.sites {
        let _ = c.pruned_channels(s);
        let _ = c.importance_of(s);
    }
    let _ = c.prune(0.5);
    Outcome::Accepted
}

// ---------------------------------------------------------------------------
// Seeds

fn gguf_llama(with_tokens: bool) -> Vec<u8> {
    const VOCAB: usize = 10;
    let m = TinyModel {
        arch: "llama",
        layers: 1,
        hidden: 8,
        heads: 2,
        kv_heads: 1,
        ffn: 16,
        vocab: VOCAB,
        context: 64,
        tied: true,
    };
    let mut rng = SeededRng::new(7);
    let mut w = GgufWriter::tiny_model(&m, |_, n| rng.f32s(n));
    if with_tokens {
        use hetsched::import::gguf::metadata::{MetadataArray, ValueType};
        let tokens = (0..VOCAB).map(|i| V::String(format!("t{i}"))).collect();
        w.kv(
            "tokenizer.ggml.tokens",
            V::Array(MetadataArray {
                elem_type: ValueType::String,
                values: tokens,
            }),
        )
        .kv("tokenizer.ggml.model", V::String("gpt2".into()))
        .kv("tokenizer.ggml.bos_token_id", V::U32(1));
    }
    w.to_bytes()
}

/// Tensors of the quantized and half types.
fn gguf_quantized() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.version(2)
        .kv("general.alignment", V::U32(64))
        .kv("general.name", V::String("quantized".into()))
        .tensor("q8", &[2, 32], GgmlType::Q8_0, vec![0x11; 2 * 34])
        .tensor("q4", &[1, 64], GgmlType::Q4_0, vec![0x22; 2 * 18])
        .tensor("h", &[4], GgmlType::F16, vec![0x33; 8])
        .tensor("b", &[4], GgmlType::BF16, vec![0x3f; 8]);
    w.to_bytes()
}

fn safetensors_seeds() -> Vec<Vec<u8>> {
    let header = r#"{"__metadata__":{"format":"pt"},"model.norm.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]},"model.embed_tokens.weight":{"dtype":"BF16","shape":[4,2],"data_offsets":[32,48]},"x":{"dtype":"F16","shape":[8],"data_offsets":[48,64]}}"#;
    let file = [
        &(header.len() as u64).to_le_bytes()[..],
        header.as_bytes(),
        &[0x3c; SAFETENSORS_DATA],
    ]
    .concat();
    let small = r#"{"a":{"dtype":"I8","shape":[],"data_offsets":[0,1]},"b":{"dtype":"U64","shape":[1,0,3],"data_offsets":[1,1]},"c":{"dtype":"U8","shape":[63],"data_offsets":[1,64]}}"#;
    vec![header.as_bytes().to_vec(), file, small.as_bytes().to_vec()]
}

/// A valid calibration's JSON, half its sites kept.
fn calibration_seed() -> Vec<u8> {
    let calibration = tiny_calibration(Some(0.25), |layer| layer == 0);
    serde_json::to_vec_pretty(&calibration).expect("a calibration serializes")
}

fn texts(all: &[&str]) -> Vec<Vec<u8>> {
    all.iter().map(|t| t.as_bytes().to_vec()).collect()
}

fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "gguf",
            seeds: vec![gguf_llama(false), gguf_llama(true), gguf_quantized()],
            run: run_gguf,
        },
        Target {
            name: "safetensors",
            seeds: safetensors_seeds(),
            run: run_safetensors,
        },
        Target {
            name: "scene",
            seeds: texts(&SCENES),
            run: run_scene,
        },
        Target {
            name: "device",
            seeds: texts(&DEVICES),
            run: run_device,
        },
        Target {
            name: "model",
            seeds: texts(&MODELS),
            run: run_model,
        },
        Target {
            name: "calibration",
            seeds: vec![calibration_seed()],
            run: run_calibration,
        },
        Target {
            name: "history",
            seeds: vec![history_seed(8, 2), history_seed(10, 2)],
            run: run_history,
        },
        Target {
            name: "profile",
            seeds: vec![profile_seed()],
            run: run_profile,
        },
    ]
}

/// The model and device the history seeds were recorded on, and their scope.
fn history_setting() -> &'static (PrefillPlan, HistoryScope) {
    static SETTING: std::sync::OnceLock<(PrefillPlan, HistoryScope)> = std::sync::OnceLock::new();
    SETTING.get_or_init(|| {
        let plan = tiny_plan(2, 256, 64);
        let scope = HistoryScope::of(&plan.model, &plan.device).expect("the tiny plan's scope");
        (plan, scope)
    })
}

/// JSON Lines of `reps` simulated runs of the tiny plan on `threads` threads.
fn history_seed(reps: usize, threads: usize) -> Vec<u8> {
    let (plan, _) = history_setting();
    let mut text = String::new();
    for rep in 0..reps {
        let policy = PolicyRegistry::builtin()
            .create("inorder")
            .expect("built in");
        let run = simulate(Arc::new(plan.clone()), policy).expect("the tiny plan runs");
        for mut r in records_on(&run, threads, None) {
            // Spread the durations, as a real machine's noise does.
            r.ns += r.ns * rep as u64 / 50;
            text += &serde_json::to_string(&r).expect("records serialise");
            text.push('\n');
        }
    }
    text.into_bytes()
}

/// What `profile --from-history` does with a history file: read, check against the
/// model and device, require samples, fit, and validate the fitted device.
fn run_history(bytes: &[u8]) -> Outcome {
    let path = Path::new("<fuzz>/history.jsonl");
    let (plan, scope) = history_setting();
    let Ok(records) = parse_history(path, bytes) else {
        return Outcome::Refused;
    };
    if check_records(path, &records, scope).is_err() {
        return Outcome::Refused;
    }
    let fit: Vec<_> = records
        .into_iter()
        .filter(|r| r.model == scope.model && r.alone != Some(false) && r.threads == Some(2))
        .collect();
    let tally = HistoryTally {
        used: fit.len(),
        ..HistoryTally::default()
    };
    if require_samples(path, &fit, &tally).is_err() {
        return Outcome::Refused;
    }
    let mut device = plan.device.clone();
    fit_profile_alone(&mut device, &fit, &[], 2);
    outcome(device.validate())
}

/// A measured device profile, as `hetsched profile` writes one: the desktop device with
/// costs fitted from a history and a `[measured]` origin.
fn profile_seed() -> Vec<u8> {
    let (plan, _) = history_setting();
    let records = parse_history(Path::new("seed"), &history_seed(8, 2)).expect("valid seed");
    let mut device = plan.device.clone();
    fit_profile_alone(&mut device, &records, &[], 2);
    device.measured = Some(bare_profile_origin("tiny", 2));
    toml::to_string(&device)
        .expect("a device serialises")
        .into_bytes()
}

/// A measured device profile loaded as a scene's device (which validates every cost).
fn run_profile(bytes: &[u8]) -> Outcome {
    text(bytes).map_or(Outcome::Refused, |t| {
        outcome(Scene::from_texts(SCENE, t, MODEL))
    })
}

// ---------------------------------------------------------------------------
// Mutations

struct Stats {
    execs: u64,
    accepted: u64,
    refused: u64,
    panics: u64,
    slow: u64,
    slowest: Duration,
    slowest_at: u64,
    slowest_input: Vec<u8>,
    elapsed: Duration,
}

fn hex(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(256)];
    let mut s: String = shown.iter().map(|b| format!("{b:02x}")).collect();
    if bytes.len() > shown.len() {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

fn crash_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes")
}

fn save(kind: &str, target: &str, seed: u64, iteration: u64, input: &[u8]) -> PathBuf {
    let dir = crash_dir();
    let path = dir.join(format!("{kind}-{target}-seed{seed}-iter{iteration}.bin"));
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input)) {
        eprintln!("could not save {}: {e}", path.display());
    }
    path
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".into())
}

fn fuzz(target: &Target, iterations: u64, seed: u64, slow: Duration) -> Stats {
    let mut rng = SeededRng::new(seed ^ target.name.bytes().fold(0u64, |h, b| h * 31 + b as u64));
    let mut pool = target.seeds.clone();
    let mut stats = Stats {
        execs: 0,
        accepted: 0,
        refused: 0,
        panics: 0,
        slow: 0,
        slowest: Duration::ZERO,
        slowest_at: 0,
        slowest_input: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let start = Instant::now();
    for iteration in 0..iterations {
        let mut input = pool[below(&mut rng, pool.len())].clone();
        for _ in 0..1 + below(&mut rng, 4) {
            mutate(&mut rng, &mut input, &pool);
        }
        let t0 = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        let took = t0.elapsed();
        stats.execs += 1;
        if took > stats.slowest {
            stats.slowest = took;
            stats.slowest_at = iteration;
            stats.slowest_input = input.clone();
        }
        if took > slow {
            stats.slow += 1;
            let path = save("slow", target.name, seed, iteration, &input);
            eprintln!(
                "SLOW {} iteration {iteration} (--seed {seed}): {took:?}, saved {}\n  input: {}",
                target.name,
                path.display(),
                hex(&input)
            );
        }
        match result {
            Ok(Outcome::Accepted) => {
                stats.accepted += 1;
                if pool.len() < MAX_POOL && below(&mut rng, 16) == 0 {
                    pool.push(input);
                }
            }
            Ok(Outcome::Refused) => stats.refused += 1,
            Err(payload) => {
                stats.panics += 1;
                let path = save("panic", target.name, seed, iteration, &input);
                eprintln!(
                    "PANIC {} iteration {iteration} (--seed {seed} --only {}): {}\n  saved {}\n  input: {}",
                    target.name,
                    target.name,
                    panic_message(&*payload),
                    path.display(),
                    hex(&input)
                );
            }
        }
    }
    stats.elapsed = start.elapsed();
    save(
        "slowest",
        target.name,
        seed,
        stats.slowest_at,
        &stats.slowest_input,
    );
    stats
}

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The command line: `[--iterations N] [--seed S] [--only NAME] [--slow-ms MS] [--replay FILE]`.
struct Args {
    iterations: u64,
    seed: u64,
    only: Option<String>,
    slow_ms: u64,
    replay: Option<PathBuf>,
}

impl Args {
    fn parse() -> Args {
        let mut a = Args {
            iterations: 100_000,
            seed: 1,
            only: None,
            slow_ms: 1000,
            replay: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
            match arg.as_str() {
                "--iterations" => a.iterations = value().parse().expect("--iterations N"),
                "--seed" => a.seed = value().parse().expect("--seed S"),
                "--only" => a.only = Some(value()),
                "--slow-ms" => a.slow_ms = value().parse().expect("--slow-ms MS"),
                "--replay" => a.replay = Some(value().into()),
                other => panic!(
                    "unknown argument {other}; usage: fuzz_parsers [--iterations N] [--seed S] [--only NAME] [--slow-ms MS] [--replay FILE]"
                ),
            }
        }
        a
    }
}

fn main() {
    let Args {
        iterations,
        seed,
        only,
        slow_ms,
        replay,
    } = Args::parse();
    let targets: Vec<Target> = targets()
        .into_iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == t.name))
        .collect();
    assert!(
        !targets.is_empty(),
        "--only takes one of gguf, safetensors, scene, device, model, calibration"
    );
    for t in &targets {
        for s in &t.seeds {
            assert!(
                (t.run)(s) == Outcome::Accepted,
                "a {} seed is refused",
                t.name
            );
        }
    }
    if let Some(file) = replay {
        let input = std::fs::read(&file).expect("read the replayed input");
        for t in &targets {
            let t0 = Instant::now();
            let accepted = (t.run)(&input) == Outcome::Accepted;
            println!("{}: accepted {accepted} in {:?}", t.name, t0.elapsed());
        }
        return;
    }
    // Panics are reported by the driver, with their input.
    std::panic::set_hook(Box::new(|_| {}));
    println!("seed {seed}, {iterations} iterations per parser");
    println!(
        "{:<12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "parser", "execs", "panics", "refused", "accepted", "execs/s", "slowest", "its bytes"
    );
    let mut failed = false;
    for t in &targets {
        let s = fuzz(t, iterations, seed, Duration::from_millis(slow_ms));
        failed |= s.panics > 0 || s.slow > 0;
        println!(
            "{:<12} {:>10} {:>7} {:>10} {:>10} {:>10.0} {:>12} {:>10}   (slowest: iteration {}{})",
            t.name,
            s.execs,
            s.panics,
            s.refused,
            s.accepted,
            s.execs as f64 / s.elapsed.as_secs_f64(),
            format!("{:.2?}", s.slowest),
            s.slowest_input.len(),
            s.slowest_at,
            if s.slow > 0 {
                format!(", {} over {slow_ms} ms", s.slow)
            } else {
                String::new()
            },
        );
    }
    println!("peak RSS (VmHWM): {}", peak_rss());
    if failed {
        eprintln!("failures saved under {}", crash_dir().display());
        std::process::exit(1);
    }
}
