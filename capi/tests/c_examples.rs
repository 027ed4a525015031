//! The C and C++ examples, compiled with gcc/g++ under AddressSanitizer (leak checks on)
//! against the shared library cargo built for these tests, and run: no failure, no
//! leak, no invalid access. The C host's schedule on the default scene, with its
//! pthread queues reporting virtual times, equals the simulation's report (the JSON
//! `hetsched simulate --json` prints), wall-clock fields aside.
//!
//! Skipped, with a note, where no C compiler is installed; CI installs gcc.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use hetsched_runtime::engine;
use hetsched_runtime::report::RunReport;
use hetsched_runtime::scene::Scene;

mod common;
use common::test_model;

/// The folder holding libhetsched_capi.so, built for these tests: cargo builds only the
/// rlib for an integration test, so the shared library is built here, once, by the same
/// cargo and profile. The whole workspace with every feature is named so that every
/// dependency keeps the features the README's `cargo test --workspace --all-features`
/// unified: under that command every unit is already built and only the link step is new
/// (with `-p hetsched-capi` alone, or without the features, the crates above the kernels
/// would be compiled again).
fn library_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>")
                .to_path_buf();
            let profile = match dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "test",
                Some(other) => other,
                None => "test",
            }
            .to_string();
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "--profile", &profile])
                .args(["--workspace", "--all-features", "--lib", "--tests"])
                .status()
                .expect("run cargo");
            assert!(status.success(), "cargo could not build the shared library");
            assert!(
                dir.join("libhetsched_capi.so").is_file(),
                "no libhetsched_capi.so in {}",
                dir.display()
            );
            dir
        })
        .clone()
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles `source` with `compiler` under AddressSanitizer; `None` without a compiler.
fn build(compiler: &str, standard: &str, source: &str, out: &Path) -> Option<PathBuf> {
    if !have(compiler) {
        eprintln!("skipped: no {compiler}");
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let exe = out.join(Path::new(source).file_stem().expect("file name"));
    let status = Command::new(compiler)
        .arg(standard)
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .args(["-fsanitize=address", "-fno-omit-frame-pointer"])
        .arg(root.join("..").join(source))
        .arg(format!("-I{}", root.join("include").display()))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lhetsched_capi", "-pthread", "-lm"])
        .status()
        .expect("run the compiler");
    assert!(status.success(), "{compiler} failed on {source}");
    Some(exe)
}

fn run(exe: &Path, args: &[&str]) -> String {
    let output = Command::new(exe)
        .args(args)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:abort_on_error=1:halt_on_error=1",
        )
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{}",
        exe.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hetsched-capi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The report without the fields that measure the scheduler's own wall time.
fn without_wall_fields(json: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(json).expect("report JSON");
    let fields = value.as_object_mut().expect("report object");
    fields.remove("scheduler_us_per_tick");
    fields.remove("scheduler_overhead_ratio");
    value
}

#[test]
fn c_host_queues_equal_the_simulation_under_asan() {
    let dir = scratch("host");
    let Some(exe) = build("gcc", "-std=c11", "examples/c/host_queues.c", &dir) else {
        return;
    };
    let json = dir.join("hosted.json");
    let svg = dir.join("hosted.svg");
    run(
        &exe,
        &[
            "--json-out",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    run(&exe, &["--step"]);

    let scene = Scene::default_scene();
    let plan = Arc::new(scene.plan().unwrap());
    let simulated = engine::simulate(plan, scene.new_policy().unwrap()).unwrap();
    let expected = serde_json::to_string_pretty(&RunReport::new(&scene.name, &simulated)).unwrap();
    let hosted = std::fs::read_to_string(&json).expect("the example wrote its report");
    assert_eq!(without_wall_fields(&hosted), without_wall_fields(&expected));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_host_thread_cancels_the_c_hosts_run_under_asan() {
    let dir = scratch("cancel");
    let Some(exe) = build("gcc", "-std=c11", "examples/c/host_queues.c", &dir) else {
        return;
    };
    for args in [
        &["--cancel-after", "10"][..],
        &["--step", "--cancel-after", "10"],
        &["--wall", "--cancel-after", "5"],
    ] {
        let out = run(&exe, args);
        assert!(
            out.contains("cancelled after") && out.contains("cancelled with"),
            "{out}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn c_host_profiles_its_device_and_predicts_held_out_workloads_under_asan() {
    let dir = scratch("profile");
    if let Some(exe) = build("gcc", "-std=c11", "examples/c/profile_device.c", &dir) {
        let out = run(&exe, &[dir.to_str().unwrap()]);
        assert!(
            out.contains("every held-out workload predicted within 5%"),
            "{out}"
        );
        // The carried files load on their own, with the measured costs.
        let scene = Scene::load(&dir.join("scene.toml")).expect("the written scene loads");
        let measured = scene.device.measured.expect("a measured device profile");
        assert_eq!(measured.model, scene.model.name);
        assert!(
            scene
                .device
                .processors
                .iter()
                .all(|p| !p.cost.stages.is_empty())
        );
        // w8a8-shadow's pair never runs alone, even under inorder: fitted from its
        // overlapped jobs rather than left to the modeled cost.
        let fitted = |processor: &str, stage: &str| {
            scene
                .device
                .processors
                .iter()
                .any(|p| p.name == processor && p.cost.stages.iter().any(|c| c.stage == stage))
        };
        assert!(fitted("cpu", "down_shadow") && fitted("hexagon", "down_proj"));
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn every_function_survives_bad_input_under_asan() {
    let dir = scratch("abuse");
    if let Some(exe) = build("gcc", "-std=c11", "examples/c/abuse.c", &dir) {
        let out = run(&exe, &[]);
        assert!(out.contains("abuse: 0 failed expectations"), "{out}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn c_requests_stream_and_cancel_under_asan() {
    let Some(model) = test_model() else {
        return;
    };
    let dir = scratch("requests");
    if let Some(exe) = build("gcc", "-std=c11", "examples/c/requests.c", &dir) {
        let out = run(&exe, &[model.to_str().unwrap()]);
        assert!(
            out.contains("requests: 3 requests ended as expected"),
            "{out}"
        );
        // The interactive request's greedy answer.
        assert!(out.contains("Paris"), "{out}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn cpp_wrapper_runs_under_asan() {
    let dir = scratch("cpp");
    if let Some(exe) = build("g++", "-std=c++17", "examples/c/simulate.cpp", &dir) {
        let out = run(&exe, &[dir.to_str().unwrap()]);
        assert!(out.contains("equal to the simulation"), "{out}");
        assert!(dir.join("run.trace.json").is_file() && dir.join("run.svg").is_file());
        assert!(
            out.contains("loaded `the C++ host's queue (measured)`"),
            "{out}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn cpp_requests_wrapper_streams_cancels_and_throws_under_asan() {
    let Some(model) = test_model() else {
        return;
    };
    let dir = scratch("cpp-requests");
    if let Some(exe) = build("g++", "-std=c++17", "examples/c/requests.cpp", &dir) {
        let out = run(&exe, &[model.to_str().unwrap()]);
        assert!(
            out.contains("requests_cpp: every expectation held"),
            "{out}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// Runs a script of `examples/python/` (the ctypes binding beside it) on the shared
/// library with `args`; its stdout, or `None` without python3.
fn run_python(script: &str, args: &[&str]) -> Option<String> {
    if !have("python3") {
        eprintln!("skipped: no python3");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/python")
        .join(script);
    let lib = library_dir().join("libhetsched_capi.so");
    let output = Command::new("python3")
        .arg(&script)
        .arg(lib)
        .args(args)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(stdout)
}

#[test]
fn python_ctypes_script_simulates() {
    if let Some(out) = run_python("simulate.py", &[]) {
        assert!(out.contains("makespan"), "{out}");
    }
}

#[test]
fn python_ctypes_requests_stream_cancel_and_raise() {
    let Some(model) = test_model() else {
        return;
    };
    if let Some(out) = run_python("stream_requests.py", &[model.to_str().unwrap()]) {
        assert!(
            out.contains("stream_requests: every expectation held"),
            "{out}"
        );
        assert!(out.contains("Paris"), "{out}");
    }
}
