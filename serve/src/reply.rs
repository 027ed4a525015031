//! Answers to an accepted generation request: one JSON object, or server-sent events in
//! OpenAI's chunk format ending with `data: [DONE]`.
//!
//! Either way the request's [`Submitted`] handle lives exactly as long as the answer: a
//! client that disconnects (or stops reading past the write timeout) drops the answer,
//! which drops the handle, which cancels the request in the engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use hetsched_exec::generate::FinishReason;
use serde_json::{Value, json};

use crate::Served;
use crate::engine::{Event, Submitted};
use crate::error::ApiError;
use crate::request::{Endpoint, Prepared};
use crate::state::AppState;

/// OpenAI's finish reason for `reason` (`cancelled` is this server's own: the request was
/// cancelled at shutdown).
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// What one request's answer is about: ids, and the clock its metrics come from.
struct Tracker {
    state: Arc<AppState>,
    label: &'static str,
    endpoint: Endpoint,
    id: String,
    created: u64,
    arrived: Instant,
    /// Per sample: when its first token came.
    first: Vec<Option<Instant>>,
    any_first: bool,
    finished: usize,
    completion_tokens: usize,
    prompt_tokens: usize,
    /// The outcome once counted (a dropped answer counts as cancelled).
    counted: bool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Tracker {
    fn new(state: Arc<AppState>, label: &'static str, endpoint: Endpoint, p: &Prepared) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let serial = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Self {
            state,
            label,
            endpoint,
            id: format!("{prefix}-{created:x}{serial:06x}"),
            created,
            arrived: Instant::now(),
            first: vec![None; p.request.n],
            any_first: false,
            finished: 0,
            completion_tokens: 0,
            prompt_tokens: p.prompt_tokens,
            counted: false,
        }
    }

    /// Records `event`'s timing.
    fn observe(&mut self, event: &Event) {
        match event {
            Event::Text { sample, .. } => {
                if let Some(first @ None) = self.first.get_mut(*sample) {
                    *first = Some(Instant::now());
                    if !self.any_first {
                        self.any_first = true;
                        let ttft = self.arrived.elapsed().as_secs_f64();
                        self.state.metrics.first_token(ttft);
                    }
                }
            }
            Event::Finished { sample, tokens, .. } => {
                self.finished += 1;
                self.completion_tokens += tokens;
                let after_first = self
                    .first
                    .get(*sample)
                    .copied()
                    .flatten()
                    .map_or(0.0, |t| t.elapsed().as_secs_f64());
                self.state.metrics.sample_done(*tokens, after_first);
            }
            Event::Failed { .. } => {}
        }
    }

    fn count(&mut self, outcome: &'static str) {
        if !self.counted {
            self.counted = true;
            self.state.metrics.count(self.label, outcome);
        }
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>, model: &str) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": model,
            "choices": choices,
        })
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        // The answer was dropped before it ended: the client went away.
        self.count("cancelled");
    }
}

/// Answers an accepted request (streamed or not).
pub async fn respond(
    state: Arc<AppState>,
    served: Arc<Served>,
    label: &'static str,
    endpoint: Endpoint,
    prepared: Prepared,
    submitted: Submitted,
) -> Response {
    let model = state.config.model_id.clone();
    let tracker = Tracker::new(state, label, endpoint, &prepared);
    // The engine lives as long as the answer reads its events.
    let answer = Answer {
        tracker,
        submitted,
        model,
        _served: served,
    };
    match prepared.stream {
        true => answer.stream(prepared.include_usage),
        false => answer.whole().await,
    }
}

struct Answer {
    tracker: Tracker,
    submitted: Submitted,
    model: String,
    _served: Arc<Served>,
}

impl Answer {
    /// Collects every sample, then answers one object. (An `async fn`, so the answer,
    /// its cancel guard included, lives as long as the future: an `async` block would
    /// capture only the fields it names and drop the guard at once.)
    async fn whole(mut self) -> Response {
        let n = self.tracker.first.len();
        let mut texts = vec![String::new(); n];
        let mut reasons = vec!["cancelled"; n];
        while self.tracker.finished < n {
            let Some(event) = self.submitted.events.recv().await else {
                break;
            };
            self.tracker.observe(&event);
            match event {
                Event::Text { sample, text } => texts[sample] += &text,
                Event::Finished { sample, reason, .. } => reasons[sample] = finish_reason(reason),
                Event::Failed { message } => {
                    self.tracker.count("failed");
                    return ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("generation failed: {message}"),
                    )
                    .into_response();
                }
            }
        }
        let outcome = match self.tracker.finished == n && !reasons.contains(&"cancelled") {
            true => "completed",
            false => "cancelled",
        };
        self.tracker.count(outcome);
        let choices = texts
            .into_iter()
            .zip(reasons)
            .enumerate()
            .map(|(index, (text, reason))| match self.tracker.endpoint {
                Endpoint::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reason,
                }),
                Endpoint::Completion => json!({
                    "index": index,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": reason,
                }),
            })
            .collect();
        let mut body = self.tracker.envelope(false, choices, &self.model);
        body["usage"] = self.tracker.usage();
        axum::Json(body).into_response()
    }

    /// Streams chunks as events come.
    fn stream(self, include_usage: bool) -> Response {
        let state = StreamState {
            answer: self,
            include_usage,
            pending: std::collections::VecDeque::new(),
            done: false,
        };
        let events = stream::unfold(state, |mut state| async move {
            let event = state.next().await?;
            Some((Ok::<_, std::convert::Infallible>(event), state))
        });
        Sse::new(events).into_response()
    }
}

struct StreamState {
    answer: Answer,
    include_usage: bool,
    /// Chunks ready to send.
    pending: std::collections::VecDeque<SseEvent>,
    done: bool,
}

impl StreamState {
    /// The next server-sent event, or `None` after `[DONE]`.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let n = self.answer.tracker.first.len();
            let event = match self.answer.tracker.finished < n {
                true => self.answer.submitted.events.recv().await,
                false => None,
            };
            match event {
                Some(event) => self.push_event(event),
                None => self.finish(),
            }
        }
    }

    fn chunk(&self, value: Value) -> SseEvent {
        SseEvent::default().data(value.to_string())
    }

    fn choice(&self, sample: usize, text: Option<&str>, reason: Option<&str>) -> Value {
        let tracker = &self.answer.tracker;
        let choice = match tracker.endpoint {
            Endpoint::Chat => {
                let delta = match (text, tracker.first[sample].is_some()) {
                    (Some(text), _) => json!({"content": text}),
                    (None, _) => json!({}),
                };
                json!({"index": sample, "delta": delta, "finish_reason": reason})
            }
            Endpoint::Completion => json!({
                "index": sample,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": reason,
            }),
        };
        tracker.envelope(true, vec![choice], &self.answer.model)
    }

    fn push_event(&mut self, event: Event) {
        let first_of_sample = match &event {
            Event::Text { sample, .. } => self
                .answer
                .tracker
                .first
                .get(*sample)
                .is_some_and(Option::is_none),
            _ => false,
        };
        self.answer.tracker.observe(&event);
        match event {
            Event::Text { sample, text } => {
                if first_of_sample && self.answer.tracker.endpoint == Endpoint::Chat {
                    // OpenAI's first chunk of a choice names the role.
                    let tracker = &self.answer.tracker;
                    let choice = json!({
                        "index": sample,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": null,
                    });
                    let value = tracker.envelope(true, vec![choice], &self.answer.model);
                    self.pending.push_back(self.chunk(value));
                }
                if !text.is_empty() {
                    let value = self.choice(sample, Some(&text), None);
                    self.pending.push_back(self.chunk(value));
                }
            }
            Event::Finished { sample, reason, .. } => {
                let value = self.choice(sample, None, Some(finish_reason(reason)));
                self.pending.push_back(self.chunk(value));
                if reason == FinishReason::Cancelled {
                    self.answer.tracker.count("cancelled");
                }
            }
            Event::Failed { message } => {
                self.answer.tracker.count("failed");
                let error = ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    format!("generation failed: {message}"),
                );
                self.pending.push_back(self.chunk(error.body()));
                self.finish();
            }
        }
    }

    /// The usage chunk when asked for, then `[DONE]`.
    fn finish(&mut self) {
        self.done = true;
        let n = self.answer.tracker.first.len();
        let outcome = match self.answer.tracker.finished == n {
            true => "completed",
            false => "cancelled",
        };
        self.answer.tracker.count(outcome);
        if self.include_usage {
            let tracker = &self.answer.tracker;
            let mut value = tracker.envelope(true, Vec::new(), &self.answer.model);
            value["usage"] = tracker.usage();
            self.pending.push_back(self.chunk(value));
        }
        self.pending.push_back(SseEvent::default().data("[DONE]"));
    }
}
