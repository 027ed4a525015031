//! The server over HTTP with a scripted engine (no weights): endpoints, errors and their
//! statuses, limits, slow clients, refusal, cancellation on disconnect, shutdown. Clients
//! are `curl` and raw TCP sockets. The tokenizer is the test model's (SmolLM2-135M).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hetsched_exec::generate::FinishReason;
use hetsched_import::GgufTokenizer;
use hetsched_serve::engine::CancelOnDrop;
use hetsched_serve::{
    Engine, EngineRequest, EngineSnapshot, Event, Limits, Priority, Refusal, Served, Submitted,
};
use tokio::sync::mpsc;

mod support;
use support::{ServerThread, curl};

/// What the scripted engine saw.
#[derive(Default)]
struct Seen {
    submitted: AtomicUsize,
    cancelled: AtomicUsize,
    running: AtomicUsize,
    refuse: AtomicBool,
    last_priority: parking_lot::Mutex<Option<Priority>>,
    last_ignore_eos: AtomicBool,
    /// Bytes of filler after each token's word (a client that stops reading fills its
    /// socket's buffers sooner).
    padding: AtomicUsize,
}

/// Writes `tok0 tok1 ...` one word per token, `delay` apart, until `max_tokens` or a
/// cancel; each sample's words carry its index.
struct Scripted {
    seen: Arc<Seen>,
    delay: Duration,
}

impl Engine for Scripted {
    fn submit(&self, request: EngineRequest) -> Result<Submitted, Refusal> {
        if self.seen.refuse.load(Ordering::Relaxed) {
            return Err(Refusal::TooManyRequests { limit: 1 });
        }
        self.seen.submitted.fetch_add(1, Ordering::Relaxed);
        *self.seen.last_priority.lock() = Some(request.priority);
        let ignore_eos = request.options.ignore_eos;
        self.seen
            .last_ignore_eos
            .store(ignore_eos, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let (seen, flag, delay) = (self.seen.clone(), cancel.clone(), self.delay);
        seen.running.fetch_add(1, Ordering::Relaxed);
        std::thread::spawn(move || {
            'samples: for sample in 0..request.n {
                for i in 0..request.options.max_tokens {
                    if flag.load(Ordering::Relaxed) {
                        seen.cancelled.fetch_add(1, Ordering::Relaxed);
                        let _ = tx.send(Event::Finished {
                            sample,
                            reason: FinishReason::Cancelled,
                            tokens: i,
                        });
                        break 'samples;
                    }
                    let padding = "x".repeat(seen.padding.load(Ordering::Relaxed));
                    let text = format!("s{sample}t{i} {padding}");
                    let _ = tx.send(Event::Text { sample, text });
                    std::thread::sleep(delay);
                }
                let _ = tx.send(Event::Finished {
                    sample,
                    reason: FinishReason::Length,
                    tokens: request.options.max_tokens,
                });
            }
            seen.running.fetch_sub(1, Ordering::Relaxed);
        });
        Ok(Submitted {
            events: rx,
            cancel: CancelOnDrop::new(cancel),
        })
    }

    fn snapshot(&self) -> EngineSnapshot {
        EngineSnapshot {
            running: self.seen.running.load(Ordering::Relaxed),
            ..EngineSnapshot::default()
        }
    }

    fn cancel_all(&self) {}
}

fn tokenizer() -> Arc<GgufTokenizer> {
    static TOKENIZER: OnceLock<Arc<GgufTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(GgufTokenizer::from_gguf(&support::model_file()).unwrap()))
        .clone()
}

/// A running server and the handles a test needs.
struct Running {
    server: ServerThread,
    addr: SocketAddr,
    seen: Arc<Seen>,
    /// Lets the loader finish.
    load: Option<std::sync::mpsc::Sender<()>>,
}

impl Running {
    fn url(&self, path: &str) -> String {
        self.server.url(path)
    }

    fn ready(mut self) -> Self {
        self.load.take().unwrap().send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, body) = curl(&["-s", &self.url("/health")]);
            if status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server never became ready: {status} {body}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self
    }

    fn shut_down(mut self) -> Result<(), hetsched_serve::ServeError> {
        self.server.stop()
    }
}

fn start(limits: Limits, api_key: Option<&str>, delay: Duration) -> Running {
    let seen = Arc::new(Seen::default());
    let engine_seen = seen.clone();
    let (load_tx, load_rx) = std::sync::mpsc::channel::<()>();
    let loader: hetsched_serve::Loader = Box::new(move || {
        load_rx.recv().map_err(|e| e.to_string())?;
        Ok(Served {
            tokenizer: tokenizer(),
            chat: support::chat_template(&support::model_file()),
            context: 2048,
            engine: Arc::new(Scripted {
                seen: engine_seen,
                delay,
            }),
        })
    });
    let server = ServerThread::start(support::config("test-model", limits, api_key), loader);
    Running {
        addr: server.addr,
        server,
        seen,
        load: Some(load_tx),
    }
}

fn post(running: &Running, path: &str, body: &str, extra: &[&str]) -> (u16, serde_json::Value) {
    let url = running.url(path);
    let mut args = vec!["-H", "Content-Type: application/json", "-d", body, &url];
    args.extend_from_slice(extra);
    let (status, text) = curl(&args);
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}

/// Sends `raw` on a fresh connection and reads until the server closes it or `wait`.
fn raw(addr: SocketAddr, raw: &[u8], wait: Duration) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    stream.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends a `/v1/completions` request with `body` on a fresh connection, left open.
fn send_completion(addr: SocketAddr, body: &str) -> TcpStream {
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// Waits up to 5 s for `done`; fails naming `what` otherwise.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fast() -> Limits {
    Limits {
        header_timeout: Duration::from_millis(500),
        body_timeout: Duration::from_millis(500),
        shutdown_grace: Duration::from_secs(2),
        ..Limits::default()
    }
}

#[test]
fn health_says_loading_until_the_model_is_ready_and_generation_waits() {
    let running = start(fast(), None, Duration::ZERO);
    let (status, body) = curl(&["-s", &running.url("/health")]);
    assert_eq!((status, body.as_str()), (503, r#"{"status":"loading"}"#));
    let (status, body) = post(&running, "/v1/completions", r#"{"prompt":"Hi"}"#, &[]);
    assert_eq!(status, 503, "{body}");
    let running = running.ready();
    assert_eq!(curl(&["-s", &running.url("/health")]).0, 200);
    running.shut_down().unwrap();
}

#[test]
fn completions_and_chat_answer_in_openais_format_with_usage_and_n() {
    let running = start(fast(), None, Duration::ZERO).ready();
    let (status, v) = post(
        &running,
        "/v1/completions",
        r#"{"model":"test-model","prompt":"The capital of France is","max_tokens":3,"n":2}"#,
        &[],
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "s0t0 s0t1 s0t2 ", "{v}");
    assert_eq!(v["choices"][1]["text"], "s1t0 s1t1 s1t2 ");
    assert_eq!(v["choices"][1]["finish_reason"], "length");
    let prompt_tokens = tokenizer()
        .encode("The capital of France is")
        .unwrap()
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["total_tokens"], prompt_tokens + 6);

    let (status, v) = post(
        &running,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"priority":"background"}"#,
        &[],
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "s0t0 s0t1 ", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(
        *running.seen.last_priority.lock(),
        Some(Priority::BACKGROUND)
    );
    assert!(!running.seen.last_ignore_eos.load(Ordering::Relaxed));
    let (_, v) = post(
        &running,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":1,"ignore_eos":true}"#,
        &["-H", "X-Hetsched-Priority: background"],
    );
    assert_eq!(v["choices"][0]["text"], "s0t0 ");
    assert_eq!(
        *running.seen.last_priority.lock(),
        Some(Priority::BACKGROUND)
    );
    assert!(running.seen.last_ignore_eos.load(Ordering::Relaxed));

    let (status, models) = curl(&["-s", &running.url("/v1/models")]);
    assert_eq!(status, 200);
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "test-model");
    running.shut_down().unwrap();
}

#[test]
fn a_stream_is_openai_chunks_then_done() {
    let running = start(fast(), None, Duration::ZERO).ready();
    let (status, text) = curl(&[
        "-N",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}"#,
        &running.url("/v1/chat/completions"),
    ]);
    assert_eq!(status, 200, "{text}");
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<serde_json::Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "s0t0 s0t1 ");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    running.shut_down().unwrap();
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    let limits = Limits {
        max_body_bytes: 2000,
        max_prompt_tokens: 100,
        ..fast()
    };
    let running = start(limits, None, Duration::ZERO).ready();
    let cases: &[(&str, &str, u16, &str)] = &[
        ("/v1/completions", "{not json", 400, "body"),
        ("/v1/completions", "[1,2]", 400, "body"),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":"ten"}"#,
            400,
            "body",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","temperature":3}"#,
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","top_p":0}"#,
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","top_k":0}"#,
            400,
            "top_k",
        ),
        ("/v1/completions", r#"{"prompt":"x","n":9}"#, 400, "n"),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":0}"#,
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","max_tokens":100000}"#,
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","stop":["a","b","c","d","e"]}"#,
            400,
            "stop",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","priority":"urgent"}"#,
            400,
            "priority",
        ),
        ("/v1/completions", r#"{"prompt":[99999999]}"#, 400, "prompt"),
        ("/v1/completions", r#"{"prompt":""}"#, 400, "prompt"),
        ("/v1/completions", r#"{"max_tokens":1}"#, 400, "prompt"),
        (
            "/v1/completions",
            r#"{"prompt":"x","logprobs":true}"#,
            400,
            "logprobs",
        ),
        (
            "/v1/completions",
            r#"{"model":"gpt-4","prompt":"x"}"#,
            404,
            "model",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[]}"#,
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"robot","content":"x"}]}"#,
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":5}]}"#,
            400,
            "messages",
        ),
    ];
    for (path, body, status, param) in cases {
        let (got, v) = post(&running, path, body, &[]);
        assert_eq!(got, *status, "{body}: {v}");
        assert_eq!(v["error"]["param"], *param, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 5, "{v}");
    }
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(3000));
    let (status, v) = post(&running, "/v1/completions", &big, &[]);
    assert_eq!(status, 413, "{v}");
    let long_prompt = format!(r#"{{"prompt":"{}","max_tokens":4}}"#, "word ".repeat(390));
    let (status, v) = post(&running, "/v1/completions", &long_prompt, &[]);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(curl(&["-s", &running.url("/v2/nothing")]).0, 404);
    assert_eq!(curl(&["-s", &running.url("/v1/completions")]).0, 405);
    // None of them reached the engine.
    assert_eq!(running.seen.submitted.load(Ordering::Relaxed), 0);
    let metrics = curl(&["-s", &running.url("/metrics")]).1;
    assert!(
        metrics.contains(r#"hetsched_requests_total{endpoint="completions",outcome="invalid"} "#),
        "{metrics}"
    );
    running.shut_down().unwrap();
}

#[test]
fn a_refusing_engine_gives_503_with_retry_after() {
    let running = start(fast(), None, Duration::ZERO).ready();
    running.seen.refuse.store(true, Ordering::Relaxed);
    let (status, headers) = curl(&[
        "-s",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"prompt":"x"}"#,
        &running.url("/v1/completions"),
    ]);
    assert_eq!(status, 503, "{headers}");
    assert!(
        headers.to_ascii_lowercase().contains("retry-after: 1"),
        "{headers}"
    );
    running.shut_down().unwrap();
}

#[test]
fn the_api_key_guards_everything_but_health() {
    let running = start(fast(), Some("sesame"), Duration::ZERO).ready();
    let (status, v) = post(&running, "/v1/completions", r#"{"prompt":"x"}"#, &[]);
    assert_eq!(status, 401);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let wrong = post(
        &running,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":1}"#,
        &["-H", "Authorization: Bearer sesamE"],
    );
    assert_eq!(wrong.0, 401);
    let right = post(
        &running,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":1}"#,
        &["-H", "Authorization: Bearer sesame"],
    );
    assert_eq!(right.0, 200, "{}", right.1);
    assert_eq!(curl(&["-s", &running.url("/metrics")]).0, 401);
    assert_eq!(curl(&["-s", &running.url("/health")]).0, 200);
    running.shut_down().unwrap();
}

#[test]
fn closing_a_stream_cancels_its_request() {
    let running = start(fast(), None, Duration::from_millis(20)).ready();
    let body = r#"{"prompt":"x","max_tokens":1000,"stream":true}"#;
    let mut stream = send_completion(running.addr, body);
    let mut first = [0u8; 256];
    let read = stream.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..read]).contains("200 OK"));
    drop(stream);
    let seen = running.seen.clone();
    wait_for("the cancel", || seen.cancelled.load(Ordering::Relaxed) > 0);
    wait_for("the engine idle", || {
        seen.running.load(Ordering::Relaxed) == 0
    });
    let metrics = curl(&["-s", &running.url("/metrics")]).1;
    assert!(metrics.contains(r#"outcome="cancelled"} 1"#), "{metrics}");
    running.shut_down().unwrap();
}

#[test]
fn a_client_gone_before_a_whole_answer_cancels_its_request() {
    let running = start(fast(), None, Duration::from_millis(20)).ready();
    let body = r#"{"prompt":"x","max_tokens":1000}"#;
    let stream = send_completion(running.addr, body);
    let seen = running.seen.clone();
    wait_for("the request reaching the engine", || {
        seen.submitted.load(Ordering::Relaxed) > 0
    });
    drop(stream);
    wait_for("the cancel", || seen.cancelled.load(Ordering::Relaxed) > 0);
    running.shut_down().unwrap();
}

#[test]
fn slow_clients_time_out() {
    let running = start(fast(), None, Duration::ZERO).ready();
    // Headers that never end: the connection closes after the header timeout.
    let started = Instant::now();
    let answer = raw(
        running.addr,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
        Duration::from_secs(5),
    );
    assert!(started.elapsed() < Duration::from_secs(4), "{answer}");
    // A body that never comes: 408.
    let answer = raw(
        running.addr,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
        Duration::from_secs(5),
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Headers beyond the limit: refused.
    let huge = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40_000)
    );
    let answer = raw(running.addr, huge.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    running.shut_down().unwrap();
}

#[test]
fn shutdown_lets_a_stream_in_flight_finish() {
    let running = start(fast(), None, Duration::from_millis(20)).ready();
    let url = running.url("/v1/completions");
    let client = std::thread::spawn(move || {
        curl(&[
            "-N",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"prompt":"x","max_tokens":20,"stream":true}"#,
            &url,
        ])
    });
    let seen = running.seen.clone();
    wait_for("the request reaching the engine", || {
        seen.submitted.load(Ordering::Relaxed) > 0
    });
    let addr = running.addr;
    running.shut_down().unwrap();
    let (status, text) = client.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains("s0t19") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    assert!(TcpStream::connect(addr).is_err(), "the listener is closed");
}

/// Opens a connection that sends `head`, then `trickle` one byte every 100 ms until the
/// server answers or closes (at most 8 s); returns what it answered and when.
fn trickle(addr: SocketAddr, head: &[u8], trickle: &[u8]) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(head).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut out = Vec::new();
    for byte in trickle.iter().cycle() {
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
        // A write after the server closed fails: the answer (if any) is read below.
        if stream.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        let mut buffer = [0u8; 4096];
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buffer[..n]),
            Err(_) => continue,
        }
    }
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = stream.read_to_end(&mut out);
    (
        String::from_utf8_lossy(&out).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn bodies_and_headers_trickled_byte_by_byte_time_out_without_holding_the_server() {
    let running = start(fast(), None, Duration::ZERO).ready();
    let addr = running.addr;
    // More trickling clients than the server's runtime has worker threads.
    let bodies: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\
                             Content-Type: application/json\r\nContent-Length: 400\r\n\r\n";
                trickle(addr, head, b"{\"prompt\": \"x\"         ")
            })
        })
        .collect();
    let headers = std::thread::spawn(move || {
        trickle(addr, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"abc")
    });
    // Meanwhile the server answers everyone else at once.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(curl(&["-s", &running.url("/health")]).0, 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    // The body's 400 bytes would take 40 s at this pace: 408 after the 0.5 s timeout.
    for body in bodies {
        let (answer, took) = body.join().unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    // Headers that never end: the connection closes after the header timeout.
    let (answer, took) = headers.join().unwrap();
    assert!(!answer.contains("200 OK"), "{answer}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    running.shut_down().unwrap();
}

#[test]
fn headers_up_to_the_limit_are_read_and_beyond_it_refused() {
    let limits = Limits {
        max_header_bytes: 8192,
        ..fast()
    };
    let running = start(limits, None, Duration::ZERO).ready();
    let head = |filler: usize| {
        let request = format!(
            "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(filler)
        );
        raw(running.addr, request.as_bytes(), Duration::from_secs(5))
    };
    let within = head(6000);
    assert!(within.starts_with("HTTP/1.1 200"), "{within}");
    let beyond = head(9000);
    assert!(beyond.starts_with("HTTP/1.1 431"), "{beyond}");
    running.shut_down().unwrap();
}

#[test]
fn connections_beyond_the_limit_wait_until_one_closes() {
    let limits = Limits {
        max_connections: 2,
        header_timeout: Duration::from_secs(10),
        ..fast()
    };
    let running = start(limits, None, Duration::ZERO).ready();
    // Two connections that send nothing hold both places.
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(running.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(running.addr).unwrap();
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut answer = Vec::new();
    let waited = third.read_to_end(&mut answer);
    assert!(
        waited.is_err() && answer.is_empty(),
        "answered beyond the limit"
    );
    // One place frees: the third is served.
    drop(idle);
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    third.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    running.shut_down().unwrap();
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_its_request_cancelled() {
    let limits = Limits {
        write_timeout: Duration::from_millis(500),
        ..fast()
    };
    let running = start(limits, None, Duration::from_millis(2)).ready();
    // 2000 tokens of 64 KiB each: far beyond what the sockets' buffers hold.
    running.seen.padding.store(64 << 10, Ordering::Relaxed);
    let body = r#"{"prompt":"x","max_tokens":2000,"stream":true}"#;
    let stream = send_completion(running.addr, body);
    let seen = running.seen.clone();
    wait_for("the request reaching the engine", || {
        seen.submitted.load(Ordering::Relaxed) > 0
    });
    // The client reads nothing: once a write has waited the write timeout, the server
    // drops the connection and the engine sees the cancel, well before the 4 s the
    // 2000 tokens would take.
    let started = Instant::now();
    wait_for("the cancel", || seen.cancelled.load(Ordering::Relaxed) > 0);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(curl(&["-s", &running.url("/health")]).0, 200);
    drop(stream);
    running.shut_down().unwrap();
}
