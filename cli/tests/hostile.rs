//! Hostile input at the command line: an output path that names a device, a FIFO or a
//! socket is never replaced; text inputs are capped before they are read; what can be
//! refused without the weights is refused before they load (these tests give a model
//! path that does not exist: a refusal after loading would name the missing model
//! instead); Ctrl-C stops a prefill at a subgraph boundary with status 130.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn hetsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hostile")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `args`, which must fail with one `error:` line containing `expect`.
fn refused(args: &[&str], expect: &str) {
    let started = Instant::now();
    let out = hetsched(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{args:?}: refused in {:?}", started.elapsed());
    assert!(!out.status.success(), "{args:?} must fail");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(expect),
        "{args:?}: expected `{expect}` in {stderr}"
    );
}

#[test]
fn settings_and_texts_are_refused_before_the_model_loads() {
    let m = "no-such-model.gguf";
    refused(
        &["run", "--model", m, "--prompt", "Hi", "--threads", "0"],
        "0 compute threads",
    );
    refused(
        &["run", "--model", m, "--prompt", "Hi", "--chunk-len", "0"],
        "a chunk of 0 tokens",
    );
    refused(&["run", "--model", m, "--prompt", ""], "prompt is empty");
    refused(
        &["generate", "--model", m, "--prompt", ""],
        "prompt is empty",
    );
    refused(
        &["generate", "--model", m, "--prompt", "Hi", "--stop", ""],
        "--stop \"\"",
    );
    refused(
        &["generate", "--model", m, "--prompt", "Hi", "--threads", "0"],
        "0 compute threads",
    );
    refused(
        &["eval", "--model", m, "--text", "/dev/null"],
        "text file is empty",
    );
    let dir = scratch("history");
    let out = dir.join("device.toml");
    let out = out.to_str().unwrap();
    refused(
        &["profile", "--model", m, "--out", out, "--threads", "0"],
        "0 compute threads",
    );
    let device = dir.join("absurd-device.toml");
    let desktop = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenes/devices/desktop.toml");
    let desktop = std::fs::read_to_string(desktop).unwrap();
    std::fs::write(
        &device,
        desktop.replacen("launch_us = 5.0", "launch_us = 1e300", 1),
    )
    .unwrap();
    refused(
        &[
            "run",
            "--model",
            m,
            "--prompt",
            "Hi",
            "--profile",
            device.to_str().unwrap(),
        ],
        "launch_us",
    );
    let history = dir.join("history.jsonl");
    std::fs::write(&history, "{\"model\": \"m\"\n").unwrap();
    refused(
        &[
            "profile",
            "--model",
            m,
            "--out",
            out,
            "--from-history",
            history.to_str().unwrap(),
        ],
        "line 1",
    );
}

#[cfg(target_os = "linux")]
#[test]
fn endless_text_inputs_stop_at_their_cap() {
    let m = "no-such-model.gguf";
    let zero = "/dev/zero";
    refused(&["run", "--model", m, "--prompt-file", zero], "16 MiB");
    refused(&["generate", "--model", m, "--prompt-file", zero], "16 MiB");
    refused(&["eval", "--model", m, "--text", zero], "64 MiB");
    refused(&["calibrate", "--model", m, "--corpus", zero], "64 MiB");
    // A regular file over its cap is refused by its size, before it is read.
    let dir = scratch("cap");
    let big = dir.join("big.txt");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len((16 << 20) + 1).unwrap();
    refused(
        &["run", "--model", m, "--prompt-file", big.to_str().unwrap()],
        "16777217 bytes, above the limit of 16 MiB",
    );
}

/// Whether `program args` ran and succeeded (`mkfifo`, `mknod`).
#[cfg(unix)]
fn made(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// `simulate` of a small scene writing its trace to `trace`.
fn simulate_to(trace: &Path) -> Output {
    hetsched(&[
        "simulate",
        "gemma-2b-k60pro",
        "--prompt-len",
        "64",
        "--chunk-len",
        "64",
        "--trace",
        trace.to_str().unwrap(),
    ])
}

#[cfg(unix)]
#[test]
fn traces_go_into_devices_and_fifos_and_never_replace_them() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("outputs");
    // A private null device: creating one needs root.
    let null = dir.join("null");
    if made("mknod", &[null.to_str().unwrap(), "c", "1", "3"]) {
        let out = simulate_to(&null);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kind = std::fs::symlink_metadata(&null).unwrap().file_type();
        assert!(kind.is_char_device(), "the device node is still one");
    } else {
        println!("skipped the device node: mknod needs root");
    }
    let fifo = dir.join("fifo");
    if made("mkfifo", &[fifo.to_str().unwrap()]) {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        let out = simulate_to(&fifo);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let trace = reader.join().unwrap();
        assert!(
            trace.contains("traceEvents"),
            "the trace came through the FIFO"
        );
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo()
        );
    }
    let socket = dir.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let out = simulate_to(&socket);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("socket"),
        "{stderr}"
    );
    assert!(
        std::fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_socket()
    );
}

/// The shared test model, if this checkout has it.
fn test_model() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    model.is_file().then_some(model)
}

/// Whether process `pid` runs a prefill: its compute pool's threads
/// (`hetsched-worker-N`, cut to 15 characters by the kernel) exist.
#[cfg(target_os = "linux")]
fn prefilling(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("comm"))
            .is_ok_and(|name| name.starts_with("hetsched-worke"))
    })
}

/// Starts `run` on a long prompt on one thread (tens of seconds of prefill), waits until
/// its prefill runs and `after` more, sends `signals` SIGINTs, and returns how long it
/// took to exit after the first, its status and its stderr.
#[cfg(target_os = "linux")]
fn interrupted_run(after: Duration, signals: usize) -> Option<(Duration, Output)> {
    let model = test_model()?;
    let dir = scratch(&format!("ctrl-c-{signals}"));
    let prompt = dir.join("prompt.txt");
    std::fs::write(
        &prompt,
        "The quick brown fox jumps over the lazy dog. ".repeat(700),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["run", "--model", model.to_str().unwrap(), "--prompt-file"])
        .arg(&prompt)
        .args(["--threads", "1", "--chunk-len", "32"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waiting = Instant::now();
    while !prefilling(child.id()) && waiting.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(after);
    let pid = child.id().to_string();
    let signalled = Instant::now();
    for _ in 0..signals {
        assert!(made("kill", &["-INT", &pid]));
    }
    let out = child.wait_with_output().unwrap();
    Some((signalled.elapsed(), out))
}

#[cfg(target_os = "linux")]
#[test]
fn ctrl_c_stops_a_prefill_within_a_second() {
    let Some((took, out)) = interrupted_run(Duration::from_millis(500), 1) else {
        println!("skipped: no test model in models/");
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("exited {took:?} after SIGINT: {:?}: {stderr}", out.status);
    // The engine stops at the next subgraph boundary and says how far it got.
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted (Ctrl-C)") && stderr.contains("subgraphs done"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_second_ctrl_c_exits_at_once() {
    use std::os::unix::process::ExitStatusExt;
    let Some((took, out)) = interrupted_run(Duration::from_millis(500), 2) else {
        println!("skipped: no test model in models/");
        return;
    };
    let code = out.status.code().or(out.status.signal().map(|s| 128 + s));
    assert_eq!(code, Some(130), "{:?}", out.status);
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// Runs `args` with stdout a pipe whose reader is gone (as `| head` leaves it once it has
/// read its fill), closed before the command starts so every write fails.
fn to_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs")
}

#[test]
fn a_closed_stdout_exits_quietly_with_status_141_after_the_files_are_written() {
    let dir = scratch("closed-stdout");
    let trace = dir.join("trace.json");
    let trace_arg = trace.to_str().unwrap();
    for args in [
        &["simulate", "--json", "--trace", trace_arg][..],
        &["simulate", "--trace", trace_arg],
        &["scenes", "--json"],
        &["scenes"],
    ] {
        let _ = std::fs::remove_file(&trace);
        let out = to_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.trim().is_empty(), "{args:?} says nothing: {stderr}");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {stderr}");
        if args.contains(&trace_arg) {
            let written = std::fs::read_to_string(&trace).expect("the trace is written");
            assert!(written.contains("traceEvents"), "{args:?}: a whole trace");
        }
    }
}

#[test]
#[cfg(target_os = "linux")]
fn a_stdout_that_cannot_be_written_is_an_error_not_a_panic() {
    // Writes to /dev/full fail with ENOSPC: a clear message and status 1.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["scenes", "--json"])
        .stdout(full)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.starts_with("error: cannot write to stdout:"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}
