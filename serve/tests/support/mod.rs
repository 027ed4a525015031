//! What the server's integration tests share: the test model's file and chat template,
//! the test model cut to its first blocks, `curl`, a server on a runtime of its own until
//! stopped, and values read from `/metrics`.

// Each test binary compiles this module and uses its own part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, mpsc};
use std::time::Duration;

use hetsched_exec::generate::ChatTemplate;
use hetsched_import::gguf::writer::GgufWriter;
use hetsched_import::{GgufFile, TEST_MODEL_PATH};
use hetsched_serve::{Limits, Loader, ServeConfig, ServeError, Server};
use tokio::sync::oneshot;

/// The test model (SmolLM2-135M-Instruct, Q4_1).
pub fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(TEST_MODEL_PATH)
}

/// The test model's file, opened.
pub fn model_file() -> GgufFile {
    GgufFile::open(model_path()).expect("the test model: run scripts/fetch-model.sh")
}

/// Blocks of the test model's 30 that the GPU tests serve: a first, a middle and a last
/// one, each running the same kernels at the same shapes (tests/gpu_common/mod.rs at the
/// workspace root says why that keeps their power).
pub const SHALLOW_LAYERS: usize = 3;

/// The test model cut to its first [`SHALLOW_LAYERS`] blocks (`GgufWriter::truncated`),
/// written once per test binary into cargo's scratch folder for integration tests (the
/// server loads a model from a path).
pub fn shallow_model_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let cut = GgufWriter::truncated(&model_file(), SHALLOW_LAYERS).unwrap();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("smollm2-{SHALLOW_LAYERS}-blocks.gguf"));
        // Written beside it and renamed: another test process never reads half a file.
        let partial = dir.join(format!("smollm2-blocks-{}.partial", std::process::id()));
        std::fs::write(&partial, cut.to_bytes()).unwrap();
        std::fs::rename(&partial, &path).unwrap();
        path
    })
}

/// `file`'s chat template, parsed (the test model has one).
pub fn chat_template(file: &GgufFile) -> Option<ChatTemplate> {
    file.metadata()
        .get_str("tokenizer.chat_template")
        .unwrap()
        .map(|t| ChatTemplate::parse(t).unwrap())
}

/// Runs curl with `args`: (HTTP status, body); 0 for a request that got no answer.
pub fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        // `-w` appends the status on a last line.
        .args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap_or(0), body.to_string())
}

/// Settings for a server on a free loopback port serving `model_id` within `limits`.
pub fn config(model_id: &str, limits: Limits, api_key: Option<&str>) -> ServeConfig {
    ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        allow_remote: false,
        api_key: api_key.map(str::to_owned),
        model_id: model_id.into(),
        limits,
    }
}

/// A server running on a thread and runtime of its own until [`ServerThread::stop`] (or
/// dropped).
pub struct ServerThread {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: mpsc::Receiver<Result<(), ServeError>>,
}

impl ServerThread {
    /// Binds `config` and serves what `loader` loads; returns once the listener is up.
    pub fn start(config: ServeConfig, loader: Loader) -> Self {
        let (addr_tx, addr_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let result = runtime.block_on(async move {
                let server = Server::bind(config).await?;
                addr_tx.send(server.local_addr()).unwrap();
                server
                    .run(loader, async move {
                        let _ = stop_rx.await;
                    })
                    .await
            });
            let _ = done_tx.send(result);
        });
        Self {
            addr: addr_rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            stop: Some(stop_tx),
            done: done_rx,
        }
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Shuts the server down as a signal would; its result, within 30 s.
    pub fn stop(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            stop.send(()).unwrap();
        }
        self.done
            .recv_timeout(Duration::from_secs(30))
            .expect("the server stops within 30 s")
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The value of the sample `name` (labels included) in a `/metrics` text.
pub fn metric(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
