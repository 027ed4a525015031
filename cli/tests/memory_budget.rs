//! `--memory-budget` on the command line: a budget that can never fit is one clear error
//! line; the JSON report and the Chrome trace carry the per-region memory (docs/memory.md).
//! Moved here from the library's tests/memory_dispatch.rs with the binary.

#[test]
fn cli_refuses_a_budget_that_can_never_fit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["simulate", "--memory-budget", "hexagon=1MiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: memory budget of region `hexagon` is 1048576 bytes"));
    assert!(err.contains("needs at least"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["simulate", "--memory-budget", "lots"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn json_report_and_trace_carry_memory() {
    let dir = std::env::temp_dir().join(format!("hetsched-memtrace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.json");
    let report = simulate_json(&["--memory-budget", "2x", "--trace", trace.to_str().unwrap()]);
    let memory = report["memory"].as_array().unwrap();
    assert_eq!(memory.len(), 2);
    for m in memory {
        for field in [
            "region",
            "peak_bytes",
            "lower_bound_bytes",
            "capacity_bytes",
            "budget_bytes",
        ] {
            assert!(m.get(field).is_some(), "memory entry missing {field}");
        }
        assert!(m["peak_bytes"].as_u64() >= m["lower_bound_bytes"].as_u64());
        assert!(m["lower_bound_bytes"].as_u64() <= m["budget_bytes"].as_u64());
    }
    assert_eq!(memory[0]["kv_cache_bytes"], 402653184);
    assert!(report["chunk_sharing"]["saving"].as_f64().unwrap() > 0.6);
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let counters: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .filter_map(|e| e["name"].as_str())
        .collect();
    for name in ["live bytes cpu", "live bytes hexagon", "live bytes device"] {
        assert!(counters.contains(&name), "no counter track `{name}`");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--memory-plan`: under the limit every strategy runs either way, `scaled` keeping
/// another strategy's plan only where it beats the sweeps' by half a percent of the
/// bound, so its peaks are at least `exhaustive`'s and at most that much above; a name
/// that is not an effort is refused.
#[test]
fn memory_plan_effort_is_chosen_on_the_command_line() {
    let memory = |effort: &str| {
        simulate_json(&["--prompt-len", "512", "--memory-plan", effort])["memory"].clone()
    };
    let (scaled, exhaustive) = (memory("scaled"), memory("exhaustive"));
    let regions = exhaustive.as_array().unwrap();
    assert_eq!(scaled.as_array().unwrap().len(), regions.len());
    for (s, e) in scaled.as_array().unwrap().iter().zip(regions) {
        let field = |r: &serde_json::Value, key: &str| r[key].as_u64().unwrap() as f64;
        let (peak, best) = (field(s, "peak_bytes"), field(e, "peak_bytes"));
        // (The margin is of the aligned bound, a little above the reported one.)
        let margin = field(e, "lower_bound_bytes") / 200.0 * 1.01;
        assert!(best <= peak && peak <= best + margin, "{s} against {e}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["simulate", "--memory-plan", "thorough"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exhaustive"));
}

/// `hetsched simulate --json ARGS`'s report (the run must succeed).
fn simulate_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hetsched"))
        .args(["simulate", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
