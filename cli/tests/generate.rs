//! `hetsched generate`'s bad input: one `error:` line naming the problem and a non-zero
//! exit, before the model is loaded (these need no model: the path given does not exist).

use std::path::PathBuf;
use std::process::{Command, Output};

fn hetsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn refused(args: &[&str], expect: &str) {
    let mut all = vec![
        "generate",
        "--model",
        "no-such-model.gguf",
        "--prompt",
        "Hi",
    ];
    all.extend_from_slice(args);
    let out = hetsched(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} must fail");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(expect),
        "{args:?}: {stderr}"
    );
    assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
}

#[test]
fn bad_sampling_settings_are_refused_before_loading() {
    refused(&["--temperature", "-0.5"], "invalid temperature");
    refused(&["--top-k", "0"], "invalid top-k");
    refused(&["--top-p", "0"], "invalid top-p");
    refused(&["--top-p", "1.5"], "invalid top-p");
    refused(&["--max-tokens", "0"], "max tokens 0");
}

#[test]
fn a_prompt_file_that_is_not_utf8_is_refused() {
    let dir = std::env::temp_dir().join(format!("hetsched-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join("latin1.txt");
    std::fs::write(&file, b"caf\xe9 au lait").unwrap();
    let out = hetsched(&[
        "generate",
        "--model",
        "no-such-model.gguf",
        "--prompt-file",
        file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("not UTF-8") && stderr.contains("offset 3"),
        "{stderr}"
    );
}

#[test]
fn simulate_models_decode_after_the_prefill() {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = hetsched(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    let scene = "qwen1.5-1.8b-xiaomi14";
    let base = json(&["simulate", scene, "--prompt-len", "600", "--json"]);
    assert!(base.get("decode").is_none(), "no decode without the flag");
    let run = |n: &str| {
        json(&[
            "simulate",
            scene,
            "--prompt-len",
            "600",
            "--decode-tokens",
            n,
            "--json",
        ])
    };
    let (short, long) = (run("16"), run("64"));
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(f(&short, "prefill_ms"), f(&base, "makespan_ms"));
    let sum = f(&short, "prefill_ms") + f(&short, "decode_ms");
    assert!((f(&short, "end_to_end_ms") - sum).abs() < 1e-6);
    // Later steps read a longer KV cache: 64 steps cost more than 4x 16 steps.
    assert!(f(&long, "decode_ms") > 4.0 * f(&short, "decode_ms"));
    assert_eq!(short["decode"]["tokens"], 16);
    // Beyond the context: a typed error, not a plan.
    let out = hetsched(&[
        "simulate",
        scene,
        "--prompt-len",
        "600",
        "--decode-tokens",
        "4000000",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("exceed the context"),
        "{stderr}"
    );
}
