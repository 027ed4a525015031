//! The command line: the default scene, JSON fields, timeline files, and bad input that
//! must end in one clear line and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hetsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// The repository root (this package lives in `cli/`).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ sits in the repository")
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli")
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a scene that reuses the shipped Xiaomi 14 profile and the given model file text.
fn scene_with_model(name: &str, model: &str, workload: &str) -> PathBuf {
    let dir = scratch(name);
    let shipped = root().join("scenes/devices/xiaomi14.toml");
    std::fs::copy(shipped, dir.join("device.toml")).unwrap();
    std::fs::write(dir.join("model.toml"), model).unwrap();
    let scene = format!(
        "name = \"{name}\"\ndevice = \"device.toml\"\nmodel = \"model.toml\"\n[workload]\n{workload}\n"
    );
    std::fs::write(dir.join("scene.toml"), scene).unwrap();
    dir.join("scene.toml")
}

const GOOD_MODEL: &str = "name = \"m\"\nlayers = 2\nhidden = 256\nheads = 4\nkv_heads = 2\nffn = 512\nvocab = 1000\ncontext = 4096\nweight_precision = \"int8\"\nactivation_precision = \"int8\"\n";
const GOOD_WORKLOAD: &str = "prompt_len = 512\nchunk_len = 128";

/// The JSON a successful run printed (fails the test, with its stderr, otherwise).
fn succeeded_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_clear_failure(out: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("error:"), "first line: {first}");
    assert!(
        first.contains(expected),
        "`{first}` should mention `{expected}`"
    );
}

#[test]
fn default_scene_json_has_every_field() {
    let out = hetsched(&["simulate", "--json"]);
    let report = succeeded_json(&out);
    for field in [
        "scene",
        "model",
        "prompt_len",
        "chunk_len",
        "policy",
        "makespan_ms",
        "prefill_tokens_per_s",
        "lower_bound_ms",
        "processors",
        "npu_bubble_rate",
        "subgraphs",
        "subgraphs_per_chunk",
        "shared_subgraphs_per_chunk",
    ] {
        assert!(report.get(field).is_some(), "missing {field}");
    }
    assert_eq!(report["model"], "Qwen1.5-1.8B");
    assert_eq!(report["prompt_len"], 1024);
    assert_eq!(report["chunk_len"], 256);
    assert_eq!(report["policy"], "balance");
    // 144 subgraphs per chunk (the paper's count) + 3 for each of the 14 kept shadow sites.
    assert_eq!(report["subgraphs_per_chunk"], 186);
    assert_eq!(report["shared_subgraphs_per_chunk"], 162);
    assert_eq!(report["subgraphs"], 745);
    for field in [
        "kept_sites",
        "busy_ms",
        "hidden_share",
        "resident_weight_bytes",
    ] {
        assert!(
            report["shadow"].get(field).is_some(),
            "shadow missing {field}"
        );
    }
    assert_eq!(report["shadow"]["kept_sites"], 14);
    for p in report["processors"].as_array().unwrap() {
        for field in ["name", "kind", "busy_ms", "utilization"] {
            assert!(p.get(field).is_some(), "processor missing {field}");
        }
    }
}

#[test]
fn overrides_and_timeline_files() {
    let dir = scratch("timeline");
    let (trace, svg) = (dir.join("t.json"), dir.join("t.svg"));
    let out = hetsched(&[
        "simulate",
        "gemma-2b-k60pro",
        "--prompt-len",
        "300",
        "--chunk-len",
        "64",
        "--policy",
        "inorder",
        "--trace",
        trace.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains("300 tokens in 5 chunks of 64, policy inorder"),
        "{summary}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().len() > 5 * 108);
    assert!(std::fs::read_to_string(svg).unwrap().starts_with("<svg"));
}

#[test]
fn a_request_trace_reports_each_request_and_refuses_bad_input() {
    let dir = scratch("requests");
    let trace = dir.join("mix.json");
    let out = hetsched(&[
        "simulate",
        "--requests",
        "agent-burst",
        "--request-policy",
        "fcfs",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let report = succeeded_json(&out);
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    let interactive = &requests[1];
    assert_eq!(interactive["priority"], "interactive");
    // fcfs: the interactive request waits for the whole background prefill.
    let ttft = interactive["ttft_ms"].as_f64().unwrap();
    assert!(ttft > requests[0]["ttft_ms"].as_f64().unwrap() - 100.0);
    assert_eq!(interactive["slo_met"], false);
    assert_eq!(report["classes"][0]["priority"], "interactive");
    // Decode is simulated: 31 steps after the first token, and fcfs serves the
    // background request to its last token first.
    let (e2e, tpot) = (
        interactive["e2e_ms"].as_f64().unwrap(),
        interactive["tpot_ms"].as_f64().unwrap(),
    );
    assert!(
        (ttft + 31.0 * tpot - e2e).abs() < 0.1,
        "{ttft} {tpot} {e2e}"
    );
    assert!(ttft > requests[0]["e2e_ms"].as_f64().unwrap() - 100.0);
    assert!(interactive["alone_e2e_ms"].as_f64().unwrap() < e2e);
    assert!(report["all"]["ttft_ms"]["p95"].as_f64().is_some());
    assert!(report["processors"][0]["utilization"].as_f64().unwrap() > 0.0);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    let tracks: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(tracks.contains(&"request 1 (interactive)"), "{tracks:?}");

    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[request]]\narrival_ms = 0\nprompt_tokens = 8\nmax_tokens = 1\npriority = \"urgent\"\n",
    )
    .unwrap();
    let out = hetsched(&["simulate", "--requests", bad.to_str().unwrap()]);
    assert_clear_failure(&out, "priority `urgent` does not exist");
    let out = hetsched(&[
        "simulate",
        "--requests",
        "agent-burst",
        "--request-policy",
        "x",
    ]);
    assert_clear_failure(&out, "unknown request policy `x`");
    let out = hetsched(&["simulate", "--requests", "no-such-trace"]);
    assert_clear_failure(&out, "nor a shipped trace");
    let out = hetsched(&[
        "simulate",
        "--requests",
        "agent-burst",
        "--kv-budget",
        "1MiB",
    ]);
    assert_clear_failure(
        &out,
        "give a budget of at least the largest request's caches",
    );
    let out = hetsched(&["simulate", "--requests", "agent-burst", "--kv-budget", "0"]);
    assert_clear_failure(&out, "give a budget above 0");
    for bad in ["0", "nan", "1e9"] {
        let out = hetsched(&[
            "simulate",
            "--requests",
            "agent-burst",
            "--attention-part-ms",
            bad,
        ]);
        assert_clear_failure(&out, "give a part length in milliseconds");
    }
    let out = hetsched(&[
        "simulate",
        "--requests",
        "agent-burst",
        "--ride",
        "sometimes",
    ]);
    assert_clear_failure(&out, "invalid value 'sometimes' for '--ride <WHEN>'");
}

#[test]
fn attention_cut_by_heads_is_an_option_of_a_request_trace() {
    let dir = scratch("requests-cut");
    let trace = dir.join("cut.toml");
    std::fs::write(
        &trace,
        "[[request]]\narrival_ms = 0\nprompt_tokens = 1024\nmax_tokens = 1\npriority = \"background\"\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["simulate", "--requests", trace.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        succeeded_json(&hetsched(&args))["requests"][0]["ttft_ms"]
            .as_f64()
            .unwrap()
    };
    let whole = run(&[]);
    let cut = run(&["--attention-part-ms", "2"]);
    // The same work in more jobs, each paying its launch and operator overhead.
    assert!(cut > whole, "cut {cut} ms, whole {whole} ms");
}

#[test]
fn a_request_trace_runs_on_the_real_model_beside_each_request_alone() {
    let dir = scratch("real-requests");
    let trace = dir.join("small.toml");
    std::fs::write(
        &trace,
        "[[request]]\narrival_ms = 0\nprompt_tokens = 48\nmax_tokens = 4\npriority = \"background\"\n\n\
         [[request]]\narrival_ms = 2\nprompt_tokens = 8\nmax_tokens = 3\npriority = \"interactive\"\nttft_ms = 60000\n",
    )
    .unwrap();
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (trace, model) = (trace.to_str().unwrap(), model.to_str().unwrap());
    let out = hetsched(&[
        "run",
        "--requests",
        trace,
        "--model",
        model,
        "--threads",
        "2",
        "--chunk-len",
        "16",
        "--arrival-scale",
        "1",
        "--json",
    ]);
    let report = succeeded_json(&out);
    assert_eq!(report["request_policy"], "slack");
    assert_eq!(report["arrival_scale"], 1.0);
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    for (r, tokens) in requests.iter().zip([4.0, 3.0]) {
        let figure = |key: &str| r[key].as_f64().unwrap();
        // Measured, alone and together: each request's last token after its first.
        assert!(figure("ttft_ms") > 0.0 && figure("e2e_ms") >= figure("ttft_ms"));
        assert!(figure("alone_ttft_ms") > 0.0 && figure("alone_e2e_ms") >= figure("alone_ttft_ms"));
        assert!(figure("tpot_ms") >= 0.0);
        assert_eq!(figure("max_tokens"), tokens);
    }
    assert_eq!(requests[1]["slo_met"], true);
    assert!(report["all"]["ttft_ms"]["p99"].as_f64().is_some());
    // What needs no weights is refused before they load.
    let nowhere = "/no/such/model.gguf";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--requests", trace, "--model", nowhere];
        args.extend_from_slice(extra);
        hetsched(&args)
    };
    assert_clear_failure(
        &run(&["--request-policy", "x"]),
        "unknown request policy `x`",
    );
    assert_clear_failure(&run(&["--arrival-scale", "0"]), "arrival scale 0");
    let out = hetsched(&["run", "--requests", "no-such-trace", "--model", nowhere]);
    assert_clear_failure(&out, "nor a shipped trace");
}

#[test]
fn generate_reports_the_steps_and_the_time_between_them() {
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = hetsched(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--temperature",
        "0.8",
        "--seed",
        "3",
        "--threads",
        "2",
        "--json",
    ]);
    let report = succeeded_json(&out);
    let figure = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {report}"))
    };
    assert_eq!(figure("generated_tokens"), 6.0);
    assert!(figure("decode_tokens_per_s") > 0.0);
    let overhead = figure("decode_overhead_median");
    assert!((0.0..=1.0).contains(&overhead), "{overhead}");
    // Five steps after the first token: four gaps between them, each a draw and its text.
    assert!(figure("between_steps_us_median") >= 0.0);
}

/// The probe reports each thread count asked for, over the buffer asked for, and
/// refuses what it cannot measure with an error, not a panic.
#[test]
fn bench_memory_reports_each_thread_count_and_refuses_zero() {
    let rows = succeeded_json(&hetsched(&[
        "bench-memory",
        "--threads",
        "1,2",
        "--mib",
        "4",
        "--passes",
        "2",
        "--json",
    ]));
    let rows = rows.as_array().expect("a JSON array");
    assert_eq!(rows.len(), 2);
    for (row, threads) in rows.iter().zip([1, 2]) {
        assert_eq!(row["threads"], threads);
        assert_eq!(row["bytes"], 4 << 20);
        assert_eq!(row["passes"], 2);
        let (median, best) = (row["median_gb_s"].as_f64(), row["best_gb_s"].as_f64());
        assert!(median > Some(0.0) && best >= median, "{row}");
    }
    for threads in ["0", "5000"] {
        assert_clear_failure(
            &hetsched(&["bench-memory", "--threads", threads, "--mib", "4"]),
            "bandwidth probe",
        );
    }
    assert_clear_failure(
        &hetsched(&["bench-memory", "--passes", "1000000", "--mib", "4"]),
        "at most 1024 threads and 1000 passes",
    );
}

#[test]
fn missing_scene_file() {
    assert_clear_failure(&hetsched(&["simulate", "no/such/scene.toml"]), "not found");
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let scene = scene_with_model(
        "unknown-key",
        &format!("{GOOD_MODEL}hiden = 3\n"),
        GOOD_WORKLOAD,
    );
    assert_clear_failure(
        &hetsched(&["simulate", scene.to_str().unwrap()]),
        "unknown field `hiden`",
    );
    assert_clear_failure(
        &hetsched(&["simulate", scene.to_str().unwrap()]),
        "model.toml:11",
    );
}

#[test]
fn zero_chunk_and_prompt_lengths() {
    let scene = scene_with_model("zero", GOOD_MODEL, GOOD_WORKLOAD);
    let path = scene.to_str().unwrap();
    assert_clear_failure(
        &hetsched(&["simulate", path, "--chunk-len", "0"]),
        "chunk length is 0",
    );
    assert_clear_failure(
        &hetsched(&["simulate", path, "--prompt-len", "0"]),
        "prompt length is 0",
    );
    assert_clear_failure(
        &hetsched(&["simulate", path, "--prompt-len", "5000"]),
        "longer than",
    );
}

#[test]
fn heads_not_dividing_hidden() {
    let model = GOOD_MODEL.replace("heads = 4\nkv_heads = 2", "heads = 6\nkv_heads = 2");
    let scene = scene_with_model("heads", &model, GOOD_WORKLOAD);
    assert_clear_failure(
        &hetsched(&["simulate", scene.to_str().unwrap()]),
        "do not divide hidden",
    );
}

#[test]
fn bad_shadow_tables_are_refused_naming_the_field() {
    for (name, table, expected) in [
        ("shadow-keep", "[shadow]\nkeep = 1.5\n", "keep = 1.5"),
        (
            "shadow-density",
            "[shadow]\noutlier_channels = 0\n",
            "outlier_channels",
        ),
        (
            "shadow-site",
            "[shadow]\nsites = [{ layer = 99, site = \"down\" }]\n",
            "layer 99",
        ),
        (
            "shadow-kind",
            "[shadow]\npriority = [\"up\"]\n",
            "unknown variant `up`",
        ),
    ] {
        let scene = scene_with_model(name, &format!("{GOOD_MODEL}\n{table}"), GOOD_WORKLOAD);
        assert_clear_failure(&hetsched(&["simulate", scene.to_str().unwrap()]), expected);
    }
    // A valid table gives the run a shadow section; --no-shadow drops it.
    let scene = scene_with_model(
        "shadow-ok",
        &format!("{GOOD_MODEL}\n[shadow]\nkeep = 0.5\n"),
        GOOD_WORKLOAD,
    );
    let json = |extra: &[&str]| {
        let mut args = vec!["simulate", scene.to_str().unwrap(), "--json"];
        args.extend_from_slice(extra);
        let out = hetsched(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert!(json(&[])["shadow"]["subgraphs"].as_u64().unwrap() > 0);
    assert!(json(&["--no-shadow"])["shadow"].is_null());
}

#[test]
fn cyclic_layer_graph() {
    let model = format!(
        "{GOOD_MODEL}layer_ops = [\n  {{ name = \"a\", kind = \"rms_norm\", inputs = [\"c\"] }},\n  {{ name = \"b\", kind = \"linear\", inputs = [\"a\"], out_features = 256 }},\n  {{ name = \"c\", kind = \"quantize\", inputs = [\"b\"] }},\n]\n"
    );
    let scene = scene_with_model("cycle", &model, GOOD_WORKLOAD);
    assert_clear_failure(
        &hetsched(&["simulate", scene.to_str().unwrap()]),
        "dependency cycle",
    );
}

#[test]
fn placement_rules_name_known_processors_and_kinds() {
    let cases = [
        ("attention = [\"tpu\"]", "`tpu` is neither a processor"),
        ("attention = [\"gpu\"]", "has no gpu processor"),
        ("attention = []", "attention is empty"),
        (
            "attention = [\"cpu\", \"hexagon\"]",
            "drop it from the [placement] rule",
        ),
        ("int8 = [\"cpu\"]", "unknown field `int8`"),
    ];
    for (i, (rule, expected)) in cases.into_iter().enumerate() {
        let workload = format!("{GOOD_WORKLOAD}\n[placement]\n{rule}");
        let scene = scene_with_model(&format!("placement{i}"), GOOD_MODEL, &workload);
        let out = hetsched(&["simulate", scene.to_str().unwrap()]);
        assert_clear_failure(&out, expected);
    }
    // A valid rule: INT8 linears on the NPU or the CPU.
    let workload = format!("{GOOD_WORKLOAD}\n[placement]\nint8_linear = [\"hexagon\", \"cpu\"]");
    let scene = scene_with_model("placement-ok", GOOD_MODEL, &workload);
    let out = hetsched(&[
        "simulate",
        scene.to_str().unwrap(),
        "--policy",
        "heft",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unknown_policy() {
    let out = hetsched(&["simulate", "--policy", "fastest"]);
    assert_clear_failure(&out, "unknown policy `fastest`");
    let scene = scene_with_model(
        "bad-policy",
        GOOD_MODEL,
        "prompt_len = 64\nchunk_len = 32\npolicy = \"fastest\"",
    );
    assert_clear_failure(
        &hetsched(&["simulate", scene.to_str().unwrap()]),
        "scene.toml: unknown policy `fastest`; choose one of: stall,",
    );
}

#[test]
fn same_input_gives_byte_identical_output() {
    let dir = scratch("determinism");
    let run = |tag: &str| {
        let (trace, svg) = (
            dir.join(format!("{tag}.json")),
            dir.join(format!("{tag}.svg")),
        );
        let out = hetsched(&[
            "simulate",
            "llama-2-7b-xiaomi14",
            "--json",
            "--trace",
            trace.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ]);
        assert!(out.status.success());
        // The scheduler's own wall-clock timings are measurements; everything else must
        // be byte-identical.
        let mut report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for timing in ["scheduler_us_per_tick", "scheduler_overhead_ratio"] {
            assert!(
                report.as_object_mut().unwrap().remove(timing).is_some(),
                "{timing}"
            );
        }
        (
            report.to_string(),
            std::fs::read(trace).unwrap(),
            std::fs::read(svg).unwrap(),
        )
    };
    assert_eq!(run("first"), run("second"));
}

fn test_model() -> String {
    let path = root().join(hetsched::import::TEST_MODEL_PATH);
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    path.display().to_string()
}

/// `hetsched run` of `model` on a short prompt in chunks of 2 tokens, then `args`.
fn run_short_prompt(model: &str, args: &[&str]) -> Output {
    let mut all = vec![
        "run",
        "--model",
        model,
        "--prompt",
        "The capital of France is",
        "--chunk-len",
        "2",
    ];
    all.extend_from_slice(args);
    hetsched(&all)
}

/// The history at `path` written out as many times over as a fit needs records of every
/// stage kind (a prefill runs the head once): these tests are about how a history is
/// split and read, and one short run per thread count keeps them fast; the fit's own
/// statistics are tested in the library.
fn repeat_history(path: &Path) {
    let once = std::fs::read_to_string(path).unwrap();
    std::fs::write(path, once.repeat(hetsched::history::MIN_SAMPLES_PER_KIND)).unwrap();
}

/// `hetsched profile --from-history` of `model` on 2 threads, written to `out`.
fn refit_from_history(model: &str, history: &Path, out: &Path) -> Output {
    hetsched(&[
        "profile",
        "--model",
        model,
        "--threads",
        "2",
        "--from-history",
        history.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
}

#[test]
fn run_prefills_the_test_model_and_reports_json() {
    let model = test_model();
    let dir = scratch("run-json");
    let trace = dir.join("run.json");
    let out = run_short_prompt(
        &model,
        &[
            "--threads",
            "2",
            "--json",
            "--trace",
            trace.to_str().unwrap(),
        ],
    );
    let report = succeeded_json(&out);
    for field in [
        "prompt_tokens",
        "prefill_ms",
        "prefill_tokens_per_s",
        "precision",
        "top_tokens",
    ] {
        assert!(report.get(field).is_some(), "missing {field}: {report}");
    }
    assert_eq!(report["precision"], "w8a8");
    assert_eq!(report["prompt_tokens"], 5);
    assert_eq!(report["top_tokens"].as_array().unwrap().len(), 5);
    assert_eq!(report["top_tokens"][0]["text"], " Paris");
    assert!(report["prefill_ms"].as_f64().unwrap() > 0.0);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    assert!(
        trace.to_string().contains("L0.embed"),
        "the trace names the subgraphs"
    );
}

#[test]
fn run_refuses_bad_models_and_prompts() {
    let model = test_model();
    let dir = scratch("run-bad");
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let corrupt = corrupt.to_str().unwrap();
    let missing = dir.join("missing.gguf");
    let missing = missing.to_str().unwrap();
    let empty_file = dir.join("empty.txt");
    std::fs::write(&empty_file, "").unwrap();
    let empty_file = empty_file.to_str().unwrap();
    for (args, expected) in [
        (
            vec!["run", "--model", missing, "--prompt", "hi"],
            "missing.gguf",
        ),
        (
            vec!["run", "--model", corrupt, "--prompt", "hi"],
            "corrupt.gguf",
        ),
        (vec!["run", "--model", &model, "--prompt", ""], "empty"),
        (
            vec!["run", "--model", &model, "--prompt-file", empty_file],
            "empty",
        ),
        (
            vec!["run", "--model", &model, "--prompt-file", missing],
            "cannot read prompt file",
        ),
        (
            vec![
                "run",
                "--model",
                &model,
                "--prompt",
                "hi",
                "--chunk-len",
                "0",
            ],
            "chunk length",
        ),
        // Refused before the prompt is repeated to that length.
        (
            vec![
                "run",
                "--model",
                &model,
                "--prompt",
                "hi",
                "--prompt-len",
                "1000000000000",
            ],
            "longer than the model's context",
        ),
        // f16 resident weights need the resident GPU path, whatever the build.
        (
            vec![
                "run",
                "--model",
                &model,
                "--prompt",
                "hi",
                "--gpu-weights",
                "f16",
            ],
            "--gpu-weights f16 applies to --backends gpu",
        ),
    ] {
        let out = hetsched(&args);
        assert_clear_failure(&out, expected);
    }
}

#[test]
fn sweep_writes_csv_rows_and_a_plot() {
    let dir = scratch("sweep");
    let (csv, svg) = (dir.join("sweep.csv"), dir.join("sweep.svg"));
    let out = hetsched(&[
        "sweep",
        "--chunk-lens",
        "64,256",
        "--prompt-lens",
        "512,1024",
        "--policies",
        "stall,inorder",
        "--csv",
        csv.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("scene,prompt_len,chunk_len,policy,makespan_ms"));
    // 2 chunk lengths x 2 prompt lengths x 2 policies.
    assert_eq!(lines.len(), 1 + 8, "{text}");
    assert!(
        lines.iter().any(|l| l.contains(",1024,256,stall,")),
        "{text}"
    );
    let plot = std::fs::read_to_string(svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.matches("<polyline").count() == 4);
    assert_clear_failure(&hetsched(&["sweep", "--chunk-lens", "0"]), "chunk length");
}

#[test]
fn eval_reports_perplexity_and_agreement_as_json() {
    let model = test_model();
    let out = hetsched(&[
        "eval",
        "--model",
        &model,
        "--text",
        "/usr/share/common-licenses/Apache-2.0",
        "--ctx",
        "32",
        "--max-windows",
        "2",
        "--threads",
        "2",
        "--json",
    ]);
    let report = succeeded_json(&out);
    for field in ["perplexity", "tokens", "kl_divergence", "top1_agreement"] {
        assert!(report.get(field).is_some(), "missing {field}: {report}");
    }
    assert_eq!(report["tokens"], 62);
    assert!(report["perplexity"].as_f64().unwrap() > 1.0);
    let missing = scratch("eval-bad").join("missing.txt");
    let out = hetsched(&[
        "eval",
        "--model",
        &model,
        "--text",
        missing.to_str().unwrap(),
    ]);
    assert_clear_failure(&out, "cannot read text file");
    let out = hetsched(&[
        "eval",
        "--model",
        &model,
        "--text",
        "/usr/share/common-licenses/Apache-2.0",
        "--ctx",
        "1",
    ]);
    assert_clear_failure(&out, "--ctx 1");
}

#[test]
fn calibrate_writes_a_file_that_run_follows_and_outliers_reads() {
    let model = test_model();
    let dir = scratch("calibrate");
    let (cal, svg) = (dir.join("cal.json"), dir.join("outliers.svg"));
    let (cal, svg) = (cal.to_str().unwrap(), svg.to_str().unwrap());
    let out = hetsched(&[
        "calibrate",
        "--model",
        &model,
        "--corpus",
        "/usr/share/common-licenses/Apache-2.0",
        "--ctx",
        "64",
        "--max-windows",
        "2",
        "--threads",
        "2",
        "--out",
        cal,
        "--svg",
        svg,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["sites"], 120);
    assert_eq!(stats["kept_sites"], 18);
    assert_eq!(stats["stats"].as_array().unwrap().len(), 120);
    let plot = std::fs::read_to_string(svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.matches("<polyline").count() == 8);

    let out = hetsched(&["outliers", cal, "--json"]);
    assert!(out.status.success());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        stats
    );

    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            &model,
            "--prompt",
            "The capital of France is",
            "--precision",
            "w8a8-shadow",
            "--threads",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        hetsched(&args)
    };
    let out = run(&["--calibration", cal, "--prune", "0.5"]);
    let report = succeeded_json(&out);
    let shadow = &report["shadow"];
    assert_eq!(shadow["kept_sites"], 60, "{shadow}");
    assert_eq!(shadow["calibration"], cal);
    assert!(shadow["resident_bytes"].as_u64() < shadow["full_copy_bytes"].as_u64());
    assert!(
        shadow["cold_kept_bytes"].as_u64() <= Some(32 << 20),
        "{shadow}"
    );
    // No cold-row budget: nothing kept.
    let out = run(&["--calibration", cal, "--cold-cache-mib", "0"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["shadow"]["cold_kept_bytes"], 0, "{report}");

    let missing = dir.join("missing.json");
    assert_clear_failure(
        &run(&["--calibration", missing.to_str().unwrap()]),
        "hetsched calibrate",
    );
    let corrupt = dir.join("corrupt.json");
    std::fs::write(&corrupt, "{\"version\": 1").unwrap();
    assert_clear_failure(
        &run(&["--calibration", corrupt.to_str().unwrap()]),
        "corrupt",
    );
    assert_clear_failure(
        &run(&["--calibration", cal, "--prune", "2"]),
        "outside 0..=1",
    );
    // A file of the first format (no top channels) is refused, not half-read.
    let old = dir.join("version-1.json");
    std::fs::write(&old, "{\"version\": 1}").unwrap();
    assert_clear_failure(
        &run(&["--calibration", old.to_str().unwrap()]),
        "hetsched calibrate",
    );
    assert_clear_failure(
        &hetsched(&[
            "run",
            "--model",
            &model,
            "--prompt",
            "hi",
            "--calibration",
            cal,
        ]),
        "w8a8-shadow",
    );
    assert_clear_failure(
        &hetsched(&["outliers", corrupt.to_str().unwrap()]),
        "corrupt",
    );
    // A ceiling that is no clip is refused before any prefill.
    assert_clear_failure(
        &hetsched(&[
            "calibrate",
            "--model",
            &model,
            "--corpus",
            "/usr/share/common-licenses/Apache-2.0",
            "--pruned-clip-rms",
            "0.5",
            "--out",
            dir.join("never.json").to_str().unwrap(),
        ]),
        "--pruned-clip-rms 0.5",
    );
}

/// An output path that cannot be written is an error before any work, and
/// nothing is left behind.
#[test]
fn missing_output_directory_fails_before_any_work() {
    let dir = scratch("missing-output-dir");
    let missing = dir.join("no-such-dir");
    for (command, flag) in [
        ("simulate", "--trace"),
        ("simulate", "--svg"),
        ("sweep", "--csv"),
        ("sweep", "--svg"),
    ] {
        let target = missing.join("out");
        let started = std::time::Instant::now();
        let out = hetsched(&[command, flag, target.to_str().unwrap()]);
        assert_clear_failure(&out, "does not exist");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("nothing was done"),
            "{command} {flag}"
        );
        assert!(out.stdout.is_empty(), "{command} {flag} printed results");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{command} {flag} worked before failing"
        );
    }
    let out = hetsched(&[
        "calibrate",
        "--model",
        "no-such-model.gguf",
        "--corpus",
        "no-such-text",
        "--out",
        missing.join("c.json").to_str().unwrap(),
    ]);
    assert_clear_failure(&out, "no-such-dir");
    assert!(!missing.exists());
}

#[test]
fn every_listing_command_has_json() {
    let out = hetsched(&["scenes", "--json"]);
    assert!(out.status.success());
    let names: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(names.iter().any(|n| n == "qwen1.5-1.8b-xiaomi14"));
    let out = hetsched(&[
        "sweep",
        "--chunk-lens",
        "64,128",
        "--policies",
        "balance,inorder",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert!(
        rows.iter()
            .all(|r| r["makespan_ms"].as_f64().unwrap() > 0.0)
    );
}

/// Help is plain text (no rustdoc links, no `usize::MAX` shown as a default,
/// no flag that does not exist).
#[test]
fn help_text_is_plain() {
    let commands = [
        "simulate",
        "run",
        "eval",
        "calibrate",
        "outliers",
        "compare",
        "sweep",
        "scenes",
    ];
    for command in commands {
        let out = hetsched(&[command, "--help"]);
        assert!(out.status.success(), "{command} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            !help.contains("]("),
            "{command} --help has a rustdoc link:\n{help}"
        );
        assert!(!help.contains("18446744073709551615"), "{command}: {help}");
        // The flags it defines: the first `--name` of each option line.
        let defined: Vec<&str> = help
            .lines()
            .filter_map(|line| {
                let line = line.trim_start();
                line.starts_with('-').then(|| {
                    line.split([' ', ',', '='])
                        .find(|w| w.starts_with("--"))
                        .unwrap_or_default()
                })
            })
            .collect();
        for word in help.split_whitespace().filter(|w| w.starts_with("--")) {
            let flag = word.trim_end_matches(|c: char| !c.is_alphanumeric());
            // Cargo's flag, in the note on building with the GPU.
            if flag == "--features" {
                continue;
            }
            assert!(
                defined.contains(&flag),
                "{command} --help names {flag}, which it does not take"
            );
        }
    }
}

/// `simulate` of a scene with a measured profile predicts as `run --predict` does (queues
/// sharing one worker pool, the profile's hand-off gap), not as separate processors.
#[test]
fn simulate_of_a_measured_profile_uses_the_shared_pool_model() {
    let dir = scratch("measured-simulate");
    let profile = root().join("runtime/testdata/zen5-smollm2-profile.toml");
    std::fs::copy(profile, dir.join("device.toml")).unwrap();
    std::fs::copy(
        root().join("scenes/models/smollm2-135m.toml"),
        dir.join("model.toml"),
    )
    .unwrap();
    let scene = "name = \"measured\"\ndevice = \"device.toml\"\nmodel = \"model.toml\"\n\
                 [workload]\nprompt_len = 512\nchunk_len = 128\npolicy = \"balance\"\n";
    std::fs::write(dir.join("scene.toml"), scene).unwrap();
    let path = dir.join("scene.toml");
    let out = hetsched(&["simulate", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let simulated = json["makespan_ms"].as_f64().unwrap();

    let loaded = hetsched::scene::Scene::load(&path).unwrap();
    let plan = std::sync::Arc::new(loaded.plan().unwrap());
    let pooled = hetsched::profiling::predict(plan.clone(), "balance").unwrap();
    let apart = hetsched::engine::simulate(
        plan,
        hetsched::systems::PolicyRegistry::builtin()
            .create("balance")
            .unwrap(),
    )
    .unwrap();
    assert!((simulated - pooled.makespan_ns as f64 / 1e6).abs() < 1e-3);
    assert_ne!(pooled.makespan_ns, apart.makespan_ns);
}

/// `run --history` records each run's thread count; `profile --from-history --threads 2`
/// fits its costs from the two-thread runs and its one-thread table (how jobs share the
/// pool) from the one-thread runs.
#[test]
fn a_history_of_one_and_two_thread_runs_refits_a_profile_with_its_one_thread_table() {
    let model = test_model();
    let dir = scratch("history-threads");
    let history = dir.join("history.jsonl");
    let _ = std::fs::remove_file(&history);
    for threads in ["1", "2"] {
        let out = run_short_prompt(
            &model,
            &[
                "--threads",
                threads,
                "--history",
                history.to_str().unwrap(),
                "--json",
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    repeat_history(&history);
    let lines = std::fs::read_to_string(&history).unwrap();
    let threads: Vec<u64> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["threads"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(threads.contains(&1) && threads.contains(&2), "{threads:?}");
    let out_file = dir.join("refit.toml");
    let out = refit_from_history(&model, &history, &out_file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = std::fs::read_to_string(&out_file).unwrap();
    assert!(profile.contains("[[measured.one_thread]]"), "{profile}");
}

/// `profile --prompt-file` measures on the file's text; a missing file is a clear error
/// before the model loads, and nothing is written.
#[test]
fn profile_measures_on_the_prompt_file() {
    let model = test_model();
    let dir = scratch("profile-prompt-file");
    let (text, out_file) = (dir.join("text.txt"), dir.join("prof.toml"));
    std::fs::write(&text, "Paris is the capital of France. ").unwrap();
    let _ = std::fs::remove_file(&out_file);
    let profile = |prompt_file: &std::path::Path| {
        hetsched(&[
            "profile",
            "--model",
            &model,
            "--threads",
            "2",
            "--chunk-lens",
            "2",
            "--prompt-lens",
            "4",
            "--reps",
            "1",
            "--prompt-file",
            prompt_file.to_str().unwrap(),
            "--out",
            out_file.to_str().unwrap(),
        ])
    };
    let out = profile(&dir.join("missing.txt"));
    assert_clear_failure(&out, "missing.txt");
    assert!(!out_file.exists());
    let out = profile(&text);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples = std::fs::read_to_string(dir.join("prof.samples.csv")).unwrap();
    // Every prefill is 4 tokens in chunks of 2: every sample holds 2 tokens.
    assert!(samples.lines().count() > 1, "{samples}");
    assert!(
        samples
            .lines()
            .skip(1)
            .all(|l| l.split(',').nth(4) == Some("2")),
        "{samples}"
    );
}

/// `run --adapt` scales a measured profile's costs to the history's recent records and
/// lists the factors in the report; it needs a profile and a history.
#[test]
fn a_run_adapts_a_profile_to_its_history() {
    let model = test_model();
    let dir = scratch("history-adapt");
    let (history, profile) = (dir.join("history.jsonl"), dir.join("refit.toml"));
    let _ = std::fs::remove_file(&history);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--threads",
            "2",
            "--policy",
            "inorder",
            "--history",
            history.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        run_short_prompt(&model, &args)
    };
    let ok = |out: std::process::Output| {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        out
    };
    ok(run(&[]));
    repeat_history(&history);
    ok(refit_from_history(&model, &history, &profile));
    let out = ok(run(&["--profile", profile.to_str().unwrap(), "--adapt"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let adapted = json["cost_model"]["adapted"].as_array().unwrap();
    assert!(!adapted.is_empty(), "{json}");
    for a in adapted {
        let factor = a["factor"].as_f64().unwrap();
        assert!((0.25..=4.0).contains(&factor), "{a}");
        assert!(a["records"].as_u64().unwrap() >= 16, "{a}");
    }
    let out = hetsched(&[
        "run",
        "--model",
        &model,
        "--prompt",
        "x",
        "--profile",
        profile.to_str().unwrap(),
        "--adapt",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--history"));
}

/// A GPU lane this build or these settings cannot run is refused before the model loads
/// (the model named here does not exist: its error would come later).
#[test]
fn serve_refuses_a_gpu_lane_it_cannot_run_before_the_model_loads() {
    let out = hetsched(&[
        "serve",
        "--model",
        "no-such-model.gguf",
        "--port",
        "0",
        "--backends",
        "gpu",
        "--precision",
        "w8a8",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let missing = match cfg!(feature = "gpu") {
        true => "--precision f32",
        false => "no GPU support",
    };
    assert!(stderr.contains(missing), "{stderr}");
    assert!(!stderr.contains("no-such-model"), "{stderr}");
}

/// The listener is up before the model loads: `/health` answers (503 "loading", or 200)
/// within 2 s of the launch.
#[test]
fn serve_answers_health_within_two_seconds_of_its_launch() {
    use std::io::{BufRead, BufReader, Read, Write};
    let launched = std::time::Instant::now();
    let mut server = Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args([
            "serve",
            "--model",
            &test_model(),
            "--port",
            "0",
            "--threads",
            "1",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // "hetsched serve: listening on http://127.0.0.1:PORT (loading the model)"
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let mut health = std::net::TcpStream::connect(addr).unwrap();
    health
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    health.read_to_string(&mut answer).unwrap();
    let took = launched.elapsed();
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.contains("\"status\""), "{answer}");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}
