//! `hetsched serve`: an OpenAI-compatible local HTTP server over a generation [`Engine`].
//!
//! Endpoints: `POST /v1/chat/completions` and `POST /v1/completions` (one JSON object, or
//! server-sent events in OpenAI's chunk format ending with `data: [DONE]`),
//! `GET /v1/models`, `GET /health` (`loading` with 503 until the model is ready: the
//! listener is up first) and `GET /metrics` (Prometheus text, see [`metrics`]).
//! HTTP is tokio + hyper, routed by axum; nothing here parses HTTP by hand.
//!
//! Layers, each in one module: [`config`] (address, key, every limit), [`request`] (a
//! body checked and turned into an [`EngineRequest`]; [`chat`] renders `messages`),
//! [`engine`] (the seam: submit, events, cancel on drop, refusals), [`concurrent_engine`]
//! (the engine `hetsched serve` runs: exec's many-requests engine), [`session_engine`]
//! (an engine over a single-request session, one request at a time: for a GPU lane, which
//! the many-requests engine does not drive), `app` (the
//! routes), `state` (what every handler shares), `reply` (JSON or SSE answers), [`server`] (listener, limits on connections
//! and slow clients, background loading, graceful shutdown), [`load`] (the model and its
//! engine from a file), `thread_time` (CPU time of the engine's threads, for its busy
//! time in `/metrics`).
//!
//! **Architecture invariant:** the server knows the engine only through [`Engine`]; the
//! engine knows nothing of HTTP.

mod app;
pub mod chat;
pub mod concurrent_engine;
pub mod config;
pub mod engine;
mod error;
pub mod load;
pub mod metrics;
mod reply;
pub mod request;
pub mod server;
pub mod session_engine;
mod state;
mod thread_time;

use std::net::SocketAddr;
use std::sync::Arc;

use hetsched_exec::generate::ChatTemplate;
use hetsched_import::GgufTokenizer;
use thiserror::Error;

pub use app::PRIORITY_HEADER;
pub use config::{ConfigError, Limits, ServeConfig};
pub use engine::{Engine, EngineRequest, EngineSnapshot, Event, Priority, Refusal, Submitted};
pub use error::ApiError;
pub use server::Server;

/// A loaded model and the engine that runs it.
pub struct Served {
    /// The model's tokenizer (requests are tokenized and checked by the server).
    pub tokenizer: Arc<GgufTokenizer>,
    /// Its chat template, when it has one this server renders.
    pub chat: Option<ChatTemplate>,
    /// Its context length, tokens.
    pub context: usize,
    /// The engine.
    pub engine: Arc<dyn Engine>,
}

/// Where the server is with its model.
pub enum Phase {
    /// Loading: generation requests get 503, `/health` says `loading`.
    Loading,
    /// Serving.
    Ready(Arc<Served>),
    /// The model could not be loaded (the server then stops).
    Failed(String),
}

/// Loads the model on a blocking thread, after the listener is up.
pub type Loader = Box<dyn FnOnce() -> Result<Served, String> + Send>;

/// Why the server could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The lanes asked for cannot run here (checked before the model loads).
    #[error(transparent)]
    Backend(#[from] load::BackendError),
    /// The model failed to load.
    #[error("the model failed to load: {0}")]
    Load(String),
    /// The async runtime or the signal handlers could not start.
    #[error("cannot start the server's runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs the server until SIGTERM or SIGINT, then shuts down gracefully (see [`server`]);
/// `on_listening` is called with the bound address once the listener is up.
pub fn run_until_signal(
    config: ServeConfig,
    loader: Loader,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hetsched-serve-io")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?;
        on_listening(server.local_addr());
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(ServeError::Runtime)?;
        let signal = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        server.run(loader, signal).await
    })
}
