//! What every handler shares: the settings, the model's phase, the metrics, the drain
//! flag. Its own module because both the routes (`app`) and the answers (`reply`) read
//! it, and neither owns the other.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::http::StatusCode;
use parking_lot::RwLock;

use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::{Phase, Served};

/// What every handler shares.
pub struct AppState {
    /// The settings.
    pub config: ServeConfig,
    /// Loading, ready or failed.
    pub phase: RwLock<Phase>,
    /// Counters and histograms.
    pub metrics: Metrics,
    /// Set at shutdown: new generation requests get 503.
    pub draining: AtomicBool,
}

impl AppState {
    /// A state in the loading phase.
    pub fn new(config: ServeConfig) -> Self {
        Self {
            config,
            phase: RwLock::new(Phase::Loading),
            metrics: Metrics::default(),
            draining: AtomicBool::new(false),
        }
    }

    /// The loaded model and its engine, or why there is none yet (503 while loading,
    /// 500 when loading failed).
    pub(crate) fn served(&self) -> Result<Arc<Served>, ApiError> {
        let retry = self.config.limits.retry_after_seconds;
        match &*self.phase.read() {
            Phase::Ready(served) => Ok(served.clone()),
            Phase::Loading => Err(ApiError::unavailable("the model is loading", retry.max(2))),
            Phase::Failed(why) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the model failed to load: {why}"),
            )),
        }
    }
}
