//! The listener: connections accepted up to the limit, each served by hyper's HTTP/1
//! connection with the head-size and head-time limits and a write timeout; the model
//! loaded in the background after the listener is up; graceful shutdown.
//!
//! Shutdown (the `shutdown` future resolves: SIGTERM or SIGINT in `hetsched serve`):
//! the listener closes; new requests on open connections get 503; in-flight answers
//! have [`crate::Limits::shutdown_grace`] to finish; then the engine cancels what is
//! left (streams end with `finish_reason: "cancelled"` and `[DONE]`) and connections get
//! one more second before they are dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio_io_timeout::TimeoutStream;

use crate::app::router;
use crate::config::ServeConfig;
use crate::state::AppState;
use crate::{Loader, Phase, ServeError};

/// A bound listener, not yet serving.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    /// Checks `config` and binds its address (port 0: any free port).
    pub async fn bind(config: ServeConfig) -> Result<Self, ServeError> {
        config.validate()?;
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|error| ServeError::Bind {
                addr: config.addr,
                error,
            })?;
        Ok(Self {
            listener,
            state: Arc::new(AppState::new(config)),
        })
    }

    /// The address bound.
    pub fn local_addr(&self) -> SocketAddr {
        // A bound TCP listener has an address.
        self.listener
            .local_addr()
            .expect("a bound listener's address")
    }

    /// Serves until `shutdown` resolves (then drains, see the module doc), loading the
    /// model with `loader` on a blocking thread meanwhile. A model that fails to load
    /// ends the server with [`ServeError::Load`].
    pub async fn run(
        self,
        loader: Loader,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let Server { listener, state } = self;
        let (failed_tx, failed_rx) = oneshot::channel::<String>();
        // Resolves with the reason if the model fails to load; never if it loads.
        let mut load_failed = pin!(async move {
            match failed_rx.await {
                Ok(why) => why,
                Err(_) => std::future::pending().await,
            }
        });
        let loading = state.clone();
        tokio::task::spawn_blocking(move || {
            let phase = match loader() {
                Ok(served) => Phase::Ready(Arc::new(served)),
                Err(why) => {
                    let _ = failed_tx.send(why.clone());
                    Phase::Failed(why)
                }
            };
            *loading.phase.write() = phase;
        });
        let limits = state.config.limits.clone();
        let app = router(state.clone());
        let graceful = GracefulShutdown::new();
        let connections = Arc::new(Semaphore::new(limits.max_connections));
        let mut shutdown = pin!(shutdown);
        let mut load_error = None;
        loop {
            let permit = tokio::select! {
                permit = connections.clone().acquire_owned() => permit,
                () = &mut shutdown => break,
                why = &mut load_failed => { load_error = Some(why); break }
            };
            let Ok(permit) = permit else { break };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => break,
                why = &mut load_failed => { load_error = Some(why); break }
            };
            let Ok((tcp, _peer)) = accepted else {
                // A failed accept (the peer reset, descriptors exhausted) ends nothing
                // but that connection; a short pause keeps a persistent failure from
                // spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let mut io = TimeoutStream::new(tcp);
            io.set_write_timeout(Some(limits.write_timeout));
            let io = TokioIo::new(Box::pin(io));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(limits.max_header_bytes)
                .serve_connection(io, TowerToHyperService::new(app.clone()));
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                // A connection's error (a client gone, a timeout) concerns only it.
                let _ = connection.await;
                drop(permit);
            });
        }
        drop(listener);
        state.draining.store(true, Ordering::Relaxed);
        drain(&state, graceful, limits.shutdown_grace).await;
        match load_error {
            Some(why) => Err(ServeError::Load(why)),
            None => Ok(()),
        }
    }
}

/// Lets in-flight answers finish within `grace`, then cancels the engine's requests and
/// gives the connections one more second.
async fn drain(state: &AppState, graceful: GracefulShutdown, grace: Duration) {
    let mut closed = pin!(graceful.shutdown());
    if tokio::time::timeout(grace, &mut closed).await.is_ok() {
        return;
    }
    if let Phase::Ready(served) = &*state.phase.read() {
        served.engine.cancel_all();
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), closed).await;
}
