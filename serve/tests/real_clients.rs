//! The server over the test model (SmolLM2-135M, W8A8) on the many-requests engine, with
//! real clients: `curl` and the `openai` Python package, streamed and not, chat and
//! completions, `n = 2`, a stream closed early; greedy text equals a generation session's
//! own for the same prompt. Then what only a many-requests engine does: two streams
//! progress together, an interactive request overtakes a background prefill, and KV
//! admission answers 503 (full now) or 400 (never fits) and frees a cancelled request's
//! memory (seen through `/metrics`).
//!
//! Without the `openai` package the Python half is reported and skipped, unless
//! `HETSCHED_REQUIRE_OPENAI=1` (CI installs the package and sets it).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use hetsched_exec::generate::requests::RequestEngine;
use hetsched_exec::generate::{ChatTemplate, DecodePath, GenerateOptions, Session};
use hetsched_exec::{ExecModel, LinearPrecision, PrefillOptions};
use hetsched_import::GgufTokenizer;
use hetsched_serve::concurrent_engine::{ConcurrentEngine, server_limits};
use hetsched_serve::{Limits, Served};

mod support;
use support::{ServerThread, curl, metric};

/// The test model, loaded once for every test of this file.
struct Model {
    tokenizer: Arc<GgufTokenizer>,
    model: Arc<ExecModel>,
    template: Option<ChatTemplate>,
}

fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let file = support::model_file();
        Model {
            tokenizer: Arc::new(GgufTokenizer::from_gguf(&file).unwrap()),
            model: Arc::new(ExecModel::load(&file, LinearPrecision::W8a8).unwrap()),
            template: support::chat_template(&file),
        }
    })
}

fn options() -> PrefillOptions {
    PrefillOptions {
        threads: 2,
        ..PrefillOptions::default()
    }
}

/// What a session of `model` generates greedily after `prompt`'s text.
fn greedy(
    model: &Arc<ExecModel>,
    tokenizer: &GgufTokenizer,
    prompt: &str,
    max_tokens: usize,
) -> String {
    let mut session = Session::new(model.clone(), options(), DecodePath::Direct).unwrap();
    let generate = GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    };
    let tokens = tokenizer.encode(prompt).unwrap();
    let never = AtomicBool::new(false);
    session
        .generate(&tokens, tokenizer, &generate, &never, |_| {})
        .unwrap()
        .text
}

/// A server over the test model on a [`ConcurrentEngine`], until dropped.
struct Running {
    server: ServerThread,
    addr: SocketAddr,
    /// Held until the server is gone (fields drop in order): one server at a time in
    /// this test process. The server's CPU-time metrics read the process's threads by
    /// name (`thread_time`), and every server's engine names its threads alike, so a
    /// second server starting beside this one would add its threads' time to this one's
    /// `engine-pool` (a utilization of 3.4 was read so).
    _alone: MutexGuard<'static, ()>,
}

/// Waits until no other test of this process serves.
fn alone() -> MutexGuard<'static, ()> {
    static SERVING: Mutex<()> = Mutex::new(());
    // A test that failed while serving leaves the lock poisoned; its server is gone.
    SERVING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Running {
    /// Serves the test model with prefills under `prefill` and `kv_budget_bytes` of KV.
    fn start(prefill: PrefillOptions, kv_budget_bytes: usize) -> Self {
        let alone = alone();
        let limits = Limits {
            shutdown_grace: Duration::from_secs(2),
            ..Limits::default()
        };
        let loader: hetsched_serve::Loader = Box::new(move || {
            let m = model();
            let limits = server_limits(kv_budget_bytes, 8);
            let engine =
                RequestEngine::start(m.model.clone(), m.tokenizer.clone(), prefill, limits)
                    .map_err(|e| e.to_string())?;
            Ok(Served {
                tokenizer: m.tokenizer.clone(),
                chat: m.template.clone(),
                context: m.model.config.context_length,
                engine: Arc::new(ConcurrentEngine::new(engine).map_err(|e| e.to_string())?),
            })
        });
        let server = ServerThread::start(support::config("smollm2", limits, None), loader);
        let running = Self {
            addr: server.addr,
            server,
            _alone: alone,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while curl(&[&running.url("/health")]).0 != 200 {
            assert!(Instant::now() < deadline, "the model never loaded");
            std::thread::sleep(Duration::from_millis(50));
        }
        running
    }

    fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    fn metrics(&self) -> String {
        curl(&[&self.url("/metrics")]).1
    }

    /// Waits up to 30 s until no request is in the engine and no KV memory is held.
    fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let metrics = self.metrics();
            if metrics.contains("hetsched_kv_cache_bytes 0")
                && metrics.contains("hetsched_requests_in_engine{state=\"running\"} 0")
                && metrics.contains("hetsched_requests_in_engine{state=\"queued\"} 0")
            {
                return;
            }
            assert!(Instant::now() < deadline, "KV memory still held: {metrics}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server and checks it exits cleanly.
    fn shut_down(mut self) {
        self.server.stop().unwrap();
    }
}

/// A streamed `/v1/completions` request on its own connection, its events timed as they
/// arrive.
struct Stream {
    reader: BufReader<TcpStream>,
}

impl Stream {
    fn open(addr: SocketAddr, body: &str) -> Self {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let request = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(request.as_bytes()).unwrap();
        Self {
            reader: BufReader::new(tcp),
        }
    }

    /// The next chunk with text, and when it came; `None` after `[DONE]`.
    fn next_text(&mut self) -> Option<(String, Instant)> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            let Some(data) = line.trim_end().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                return None;
            }
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                return Some((text.to_string(), Instant::now()));
            }
        }
    }

    /// Every remaining chunk's arrival.
    fn arrivals(mut self) -> Vec<Instant> {
        std::iter::from_fn(|| self.next_text())
            .map(|t| t.1)
            .collect()
    }
}

#[test]
fn curl_and_the_openai_package_get_the_models_text() {
    let running = Running::start(options(), 1 << 30);
    let url = |path: &str| running.url(path);
    let base = running.url("");
    let Model {
        model, tokenizer, ..
    } = model();

    let prompt = "The capital of France is";
    let (status, body) = curl(&[
        "-H",
        "Content-Type: application/json",
        "-d",
        &format!(r#"{{"prompt":"{prompt}","max_tokens":8,"temperature":0}}"#),
        &url("/v1/completions"),
    ]);
    assert_eq!(status, 200, "{body}");
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    let served = value["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(served, greedy(model, tokenizer, prompt, 8));

    let (status, stream) = curl(&[
        "-N",
        "-H",
        "Content-Type: application/json",
        "-d",
        &format!(r#"{{"prompt":"{prompt}","max_tokens":8,"temperature":0,"stream":true}}"#),
        &url("/v1/completions"),
    ]);
    assert_eq!(status, 200);
    let streamed: String = stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(streamed, served);
    assert!(stream.trim_end().ends_with("data: [DONE]"));

    openai_package(&base);

    // Every request is over: no KV memory held.
    running.wait_idle();
    running.shut_down();
}

fn openai_package(base: &str) {
    let has_package = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_package {
        assert!(
            std::env::var("HETSCHED_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "HETSCHED_REQUIRE_OPENAI=1 and the openai package is missing (pip install openai)"
        );
        eprintln!("the openai Python package is not installed: its client checks skipped");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = Command::new("python3")
        .arg(script)
        .args([base, "smollm2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!got["chat"].as_str().unwrap().is_empty(), "{got}");
    assert_eq!(got["chat"], got["chat_stream"], "{got}");
    assert_eq!(got["completion"], got["completion_stream"], "{got}");
    assert_eq!(got["n"].as_array().unwrap().len(), 2, "{got}");
    assert_eq!(got["closed_after_chunks"], 2, "{got}");
    assert_eq!(got["unknown_model"], 404, "{got}");
}

/// A streamed greedy completion of `prompt`, `max_tokens` at most, at `priority`.
fn streamed(prompt: &str, max_tokens: usize, priority: &str) -> String {
    serde_json::json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "priority": priority,
    })
    .to_string()
}

#[test]
fn two_streams_progress_together() {
    let running = Running::start(options(), 1 << 30);
    let body = streamed("1, 2, 3, 4, 5, 6, 7, 8,", 24, "interactive");
    let (a, b) = (
        Stream::open(running.addr, &body),
        Stream::open(running.addr, &body),
    );
    let a = std::thread::spawn(move || a.arrivals());
    let b = b.arrivals();
    let a = a.join().unwrap();
    assert!(
        a.len() >= 8 && b.len() >= 8,
        "{} and {} chunks",
        a.len(),
        b.len()
    );
    // Interleaved: each stream's first token came before the other's last (one request
    // after the other would give one stream every token before the other's first).
    assert!(a[0] < *b.last().unwrap() && b[0] < *a.last().unwrap());
    let a_during_b = a
        .iter()
        .filter(|&&t| t > b[0] && t < *b.last().unwrap())
        .count();
    assert!(
        a_during_b >= 4,
        "only {a_during_b} of a's tokens came while b ran"
    );
    running.wait_idle();
    running.shut_down();
}

#[test]
fn an_interactive_request_overtakes_a_background_prefill() {
    // Small prefill chunks make the background prompt's prefill many preemption points.
    let prefill = PrefillOptions {
        chunk_len: 16,
        ..options()
    };
    let running = Running::start(prefill, 1 << 30);
    let document = "The scheduler places each subgraph on the processor that suits it. ".repeat(40);
    let mut background = Stream::open(running.addr, &streamed(&document, 4, "background"));
    // The background request is in the engine (prefilling) before the interactive one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !running
        .metrics()
        .contains("hetsched_requests_in_engine{state=\"running\"} 1")
    {
        assert!(
            Instant::now() < deadline,
            "the background request never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Instant::now();
    let mut interactive = Stream::open(
        running.addr,
        &streamed("The capital of France is", 4, "interactive"),
    );
    let (_, interactive_first) = interactive.next_text().expect("an interactive token");
    let (_, background_first) = background.next_text().expect("a background token");
    assert!(
        background_first > sent,
        "the background prefill ended before the interactive request was sent: lengthen it"
    );
    assert!(
        interactive_first < background_first,
        "the interactive request's first token came {:?} after the background one's",
        interactive_first - background_first
    );
    drop((background.arrivals(), interactive.arrivals()));
    running.wait_idle();
    running.shut_down();
}

#[test]
fn kv_admission_refuses_then_frees_a_cancelled_requests_memory() {
    let m = model();
    let config = &m.model.config;
    let per_position = m.model.layers.len() * config.kv_dim() * 2 * 4;
    // Room for one request of about 150 positions, not two.
    let running = Running::start(options(), 200 * per_position);
    let body = streamed("Once upon a time", 150, "interactive");
    let mut holder = Stream::open(running.addr, &body);
    holder.next_text().expect("a first token");
    // Held: the prompt's positions and the 149 the sample may feed after it.
    let prompt = m.tokenizer.encode("Once upon a time").unwrap().len();
    let metrics = running.metrics();
    assert_eq!(
        metric(&metrics, "hetsched_kv_cache_bytes"),
        ((prompt + 149) * per_position) as f64,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "hetsched_kv_cache_budget_bytes"),
        (200 * per_position) as f64
    );
    // The engine's kernel threads ran the prefill: busy time counted, within capacity.
    let pool = r#"{processor="engine-pool",kind="cpu"}"#;
    let busy = metric(
        &metrics,
        &format!("hetsched_processor_busy_seconds_total{pool}"),
    );
    let utilization = metric(&metrics, &format!("hetsched_processor_utilization{pool}"));
    assert!(busy > 0.0, "{metrics}");
    // Thread CPU time comes in scheduler ticks and is read a moment apart from the
    // uptime, so a share of a second or two of uptime may pass 1 by a little.
    assert!(utilization > 0.0 && utilization <= 1.25, "{metrics}");
    // And per lane, as the engine counts it: the INT8 stages on the emulated NPU, the
    // float stages and the decode steps on the CPU lane.
    for lane in [
        r#"{processor="npu-emu",kind="npu"}"#,
        r#"{processor="cpu",kind="cpu"}"#,
    ] {
        let busy = format!("hetsched_processor_busy_seconds_total{lane}");
        assert!(metric(&metrics, &busy) > 0.0, "{metrics}");
        let utilization = metric(&metrics, &format!("hetsched_processor_utilization{lane}"));
        assert!(utilization <= 1.25, "{metrics}");
    }
    // Full now: 503 with Retry-After.
    let url = running.url("/v1/completions");
    let (status, answer) = curl(&[
        "-i",
        "-H",
        "Content-Type: application/json",
        "-d",
        &body,
        &url,
    ]);
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    // Never fits: 400.
    let never = streamed("Once upon a time", 1000, "interactive");
    let (status, answer) = curl(&["-H", "Content-Type: application/json", "-d", &never, &url]);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("whole budget"), "{answer}");
    // The client leaves: its request is cancelled and its memory freed.
    drop(holder);
    running.wait_idle();
    let metrics = running.metrics();
    assert!(metrics.contains(r#"outcome="cancelled"} 1"#), "{metrics}");
    let small = r#"{"prompt":"Once upon a time","max_tokens":4}"#;
    let (status, answer) = curl(&["-H", "Content-Type: application/json", "-d", small, &url]);
    assert_eq!(status, 200, "{answer}");
    running.shut_down();
}
