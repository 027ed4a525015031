//! A scheduling-only embedder (scenes, plans, simulation, reports, host queues) builds no
//! model import: without the default feature `models` the library's dependency tree
//! holds neither the executor nor the tokenizer nor the weight readers. Read from
//! `cargo tree` (metadata only, nothing is built).

use std::process::Command;

fn normal_dependencies(features: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "hetsched-capi",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 tree")
}

/// The crate names of a `cargo tree --prefix none` listing.
fn crates(tree: &str) -> Vec<&str> {
    let mut names: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[test]
fn without_models_no_model_import_is_built() {
    let tree = normal_dependencies(&["--no-default-features"]);
    let names = crates(&tree);
    for heavy in [
        "hetsched-exec",
        "hetsched-import",
        "hetsched-kernels",
        "tokenizers",
        "safetensors",
        "memmap2",
    ] {
        assert!(
            !names.contains(&heavy),
            "{heavy} is in the scheduling-only build:\n{tree}"
        );
    }
    assert!(names.contains(&"hetsched-runtime"), "{tree}");
    let full = normal_dependencies(&[]);
    assert!(crates(&full).contains(&"tokenizers"), "{full}");
    assert!(crates(&full).len() > names.len());
}
