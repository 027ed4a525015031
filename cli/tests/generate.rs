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
