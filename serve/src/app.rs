//! The routes: what each endpoint answers, from the shared [`AppState`] (`state.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use serde_json::json;

use crate::engine::Refusal;
use crate::error::ApiError;
use crate::reply;
use crate::request::{self, Endpoint, ModelInfo};
use crate::state::AppState;
use crate::{Phase, Served};

/// The router: `/health` open to all, everything else behind the API key when one is set.
pub fn router(state: Arc<AppState>) -> Router {
    let guarded = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/health", get(health))
        .merge(guarded)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/models, /health, \
         /metrics",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this endpoint does not take that method",
    )
}

/// Checks the bearer token when the server has an API key.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|given| same_secret(given.as_bytes(), key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key: send Authorization: Bearer <key>",
            )
            .code("invalid_api_key")
            .into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference (the time does not tell how much
/// of a guess was right).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match &*state.phase.read() {
        Phase::Ready(_) => (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response(),
        Phase::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "loading"})),
        )
            .into_response(),
        Phase::Failed(why) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"status": "error", "message": why})),
        )
            .into_response(),
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "hetsched",
        }],
    }))
    .into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = state.served().ok().map(|s| s.engine.snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(snapshot.as_ref()),
    )
        .into_response()
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(state, Endpoint::Chat, headers, body).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(state, Endpoint::Completion, headers, body).await
}

/// The header naming a request's priority (`interactive` or `background`); the body's
/// `priority` field wins over it.
pub const PRIORITY_HEADER: &str = "x-hetsched-priority";

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let label = match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "completions",
    };
    match accept(&state, endpoint, &headers, body).await {
        Ok((served, prepared, submitted)) => {
            reply::respond(state, served, label, endpoint, prepared, submitted).await
        }
        Err(error) => {
            let outcome = match error.status {
                StatusCode::SERVICE_UNAVAILABLE => "refused",
                s if s.is_client_error() => "invalid",
                _ => "failed",
            };
            state.metrics.count(label, outcome);
            error.into_response()
        }
    }
}

/// Reads and checks a generation request and hands it to the engine.
async fn accept(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Arc<Served>, request::Prepared, crate::engine::Submitted), ApiError> {
    let limits = &state.config.limits;
    let retry = limits.retry_after_seconds;
    if state.draining.load(Ordering::Relaxed) {
        return Err(ApiError::unavailable("the server is shutting down", retry));
    }
    let served = state.served()?;
    let bytes = read_body(body, headers, state).await?;
    let priority = headers
        .get(PRIORITY_HEADER)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let info = ModelInfo {
        id: &state.config.model_id,
        tokenizer: &served.tokenizer,
        chat: served.chat.as_ref(),
        context: served.context,
    };
    let prepared = request::prepare(endpoint, &bytes, priority, &info, limits)?;
    let submitted =
        served
            .engine
            .submit(prepared.request.clone())
            .map_err(|refusal| match refusal {
                Refusal::Invalid { message } => {
                    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
                }
                refusal => ApiError::unavailable(refusal.to_string(), retry),
            })?;
    Ok((served, prepared, submitted))
}

/// The body, within the size and time limits: 413 beyond the size, 408 beyond the time.
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    state: &AppState,
) -> Result<axum::body::Bytes, ApiError> {
    let limits = &state.config.limits;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the body is larger than this server's {} bytes",
                limits.max_body_bytes
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limits.max_body_bytes as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, limits.max_body_bytes);
    match tokio::time::timeout(limits.body_timeout, limited.collect()).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the body did not arrive within {} s",
                limits.body_timeout.as_secs_f64()
            ),
        )),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(error)) => Err(ApiError::invalid(
            "body",
            format!("the body could not be read: {error}"),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_by_every_byte() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(!same_secret(b"", b"a"));
    }
}
