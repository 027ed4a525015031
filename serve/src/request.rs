//! The request bodies of `/v1/chat/completions` and `/v1/completions`, checked and turned
//! into an [`EngineRequest`]. Every check that needs no weights happens here, before the
//! engine sees the request; each failure is a 400 naming the field.
//!
//! Fields read (others are ignored, as OpenAI's own server ignores unknown ones, except
//! the few whose non-default value would change the answer and which are refused:
//! `logprobs`, `tools`, `echo`):
//! `model`, `messages` / `prompt`, `max_tokens` (or `max_completion_tokens`),
//! `temperature` in [0, 2], `top_p` in (0, 1], `top_k` >= 1, `seed`, `stop` (a string or
//! up to `max_stop` strings), `n`, `stream`, `stream_options.include_usage`, and the
//! extensions `priority` (`interactive`, the default, `background`, or a class 0..=255,
//! larger more urgent) and `ignore_eos` (go on past the end-of-sequence token, as
//! llama-server's field of that name: benchmarks that need each request's length fixed).

use hetsched_exec::generate::{ChatTemplate, GenerateOptions, Sampling};
use hetsched_import::GgufTokenizer;
use serde::Deserialize;
use serde_json::Value;

use crate::chat::{self, Role};
use crate::config::Limits;
use crate::engine::{EngineRequest, Priority};
use crate::error::ApiError;

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// The fields both endpoints share.
#[derive(Debug, Default, Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    seed: Option<i64>,
    stop: Option<Value>,
    n: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    priority: Option<String>,
    ignore_eos: Option<bool>,
    logprobs: Option<Value>,
    tools: Option<Value>,
    echo: Option<bool>,
    messages: Option<Value>,
    prompt: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// A request ready for the engine, and how to answer it.
#[derive(Debug)]
pub struct Prepared {
    /// What the engine runs.
    pub request: EngineRequest,
    /// Server-sent events rather than one JSON object.
    pub stream: bool,
    /// Streamed: a last chunk with `usage`.
    pub include_usage: bool,
    /// Prompt tokens (for `usage`).
    pub prompt_tokens: usize,
}

/// What the server knows of its model, for checking requests.
pub struct ModelInfo<'a> {
    /// The served model's id.
    pub id: &'a str,
    /// Its tokenizer.
    pub tokenizer: &'a GgufTokenizer,
    /// Its chat template (none: `/v1/chat/completions` is refused).
    pub chat: Option<&'a ChatTemplate>,
    /// Its context length.
    pub context: usize,
}

/// Parses and checks `body` for `endpoint`; `header_priority` is the
/// `X-Hetsched-Priority` header's value, if any (the body's field wins).
pub fn prepare(
    endpoint: Endpoint,
    body: &[u8],
    header_priority: Option<&str>,
    model: &ModelInfo<'_>,
    limits: &Limits,
) -> Result<Prepared, ApiError> {
    let common = parse_common(body, model)?;
    refuse_unsupported(&common)?;
    let (text, special) = match endpoint {
        Endpoint::Chat => (chat_prompt(&common, model)?, true),
        Endpoint::Completion => (completion_prompt(&common)?, false),
    };
    let prompt = match text {
        PromptText::Text(text) => {
            let encoded = match special {
                true => model.tokenizer.encode_special(&text),
                false => model.tokenizer.encode(&text),
            };
            encoded.map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}")))?
        }
        PromptText::Tokens(tokens) => tokens,
    };
    check_prompt(&prompt, model, limits)?;
    let mut stop = stop_strings(common.stop.as_ref(), limits)?;
    if endpoint == Endpoint::Chat
        && let Some(end) = model.chat.and_then(|t| t.end_of_turn())
    {
        stop.push(end.to_string());
    }
    let max_tokens = max_tokens(&common, prompt.len(), model.context, limits)?;
    let options = GenerateOptions {
        max_tokens,
        sampling: sampling(&common)?,
        stop,
        ignore_eos: common.ignore_eos.unwrap_or(false),
    };
    let n = sample_count(common.n, limits)?;
    let priority = match common.priority.as_deref().or(header_priority) {
        None => Priority::default(),
        Some(name) => name
            .parse::<Priority>()
            .map_err(|e| ApiError::invalid("priority", e.to_string()))?,
    };
    let prompt_tokens = prompt.len();
    Ok(Prepared {
        request: EngineRequest {
            prompt,
            options,
            n,
            priority,
        },
        stream: common.stream.unwrap_or(false),
        include_usage: common
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        prompt_tokens,
    })
}

/// The fields both endpoints share, from a body that must be a JSON object naming this
/// server's model, if any.
fn parse_common(body: &[u8], model: &ModelInfo<'_>) -> Result<Common, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid("body", format!("the body is not valid JSON: {e}")).param("body")
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    }
    let common: Common = serde_json::from_value(value)
        .map_err(|e| ApiError::invalid("body", format!("a field has the wrong type: {e}")))?;
    if let Some(name) = &common.model
        && name != model.id
    {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model {name:?} does not exist here: this server serves {:?}",
                model.id
            ),
        )
        .param("model")
        .code("model_not_found"));
    }
    Ok(common)
}

/// The samples asked for (`n`, 1 by default), within the server's limit.
fn sample_count(n: Option<u64>, limits: &Limits) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if n >= 1 && n <= limits.max_n as u64 => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            "n",
            format!("n = {n}: give 1 to {} samples", limits.max_n),
        )),
    }
}

/// A prompt as text, or as token ids (`/v1/completions` accepts both).
enum PromptText {
    Text(String),
    Tokens(Vec<u32>),
}

fn refuse_unsupported(common: &Common) -> Result<(), ApiError> {
    let logprobs = match &common.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(_) => true,
    };
    if logprobs {
        return Err(ApiError::invalid("logprobs", "logprobs are not supported"));
    }
    if matches!(&common.tools, Some(Value::Array(tools)) if !tools.is_empty()) {
        return Err(ApiError::invalid("tools", "tools are not supported"));
    }
    if common.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    Ok(())
}

fn chat_prompt(common: &Common, model: &ModelInfo<'_>) -> Result<PromptText, ApiError> {
    let Some(template) = model.chat else {
        return Err(ApiError::invalid(
            "messages",
            "the model has no chat template this server can render: use /v1/completions",
        ));
    };
    let Some(Value::Array(messages)) = &common.messages else {
        return Err(ApiError::invalid(
            "messages",
            "messages is required: an array of {\"role\", \"content\"} objects",
        ));
    };
    let mut parsed = Vec::with_capacity(messages.len());
    for message in messages {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let role = Role::parse(role).ok_or_else(|| {
            ApiError::invalid(
                "messages",
                format!("role {role:?}: give system, developer, user or assistant"),
            )
        })?;
        parsed.push((role, content_text(message.get("content"))?));
    }
    Ok(PromptText::Text(chat::render(template, &parsed)?))
}

/// A message's content: a string, or an array of `{"type": "text", "text": ...}` parts.
fn content_text(content: Option<&Value>) -> Result<String, ApiError> {
    let wrong = || {
        ApiError::invalid(
            "messages",
            "a message's content must be a string or an array of text parts",
        )
    };
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match (part.get("type"), part.get("text")) {
                (Some(Value::String(kind)), Some(Value::String(text))) if kind == "text" => {
                    Ok(text.as_str())
                }
                _ => Err(wrong()),
            })
            .collect(),
        _ => Err(wrong()),
    }
}

fn completion_prompt(common: &Common) -> Result<PromptText, ApiError> {
    let wrong = |why: &str| ApiError::invalid("prompt", why.to_string());
    match &common.prompt {
        Some(Value::String(text)) => Ok(PromptText::Text(text.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(text)] => Ok(PromptText::Text(text.clone())),
            [] => Err(wrong("prompt is an empty array")),
            _ if items.iter().all(Value::is_u64) => items
                .iter()
                .map(|id| {
                    id.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| wrong("a token id beyond u32"))
                })
                .collect::<Result<_, _>>()
                .map(PromptText::Tokens),
            _ => Err(wrong(
                "prompt must be a string, an array of one string, or an array of token ids \
                 (several prompts in one request are not supported: send one request each)",
            )),
        },
        None => Err(wrong("prompt is required")),
        Some(_) => Err(wrong("prompt must be a string or an array")),
    }
}

fn check_prompt(prompt: &[u32], model: &ModelInfo<'_>, limits: &Limits) -> Result<(), ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt is empty: give some text",
        ));
    }
    let vocab = model.tokenizer.vocab_size();
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {bad} is beyond the vocabulary of {vocab}"),
        ));
    }
    let limit = limits
        .max_prompt_tokens
        .min(model.context.saturating_sub(1));
    if prompt.len() > limit {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the prompt has {} tokens; this server takes at most {limit} (context {})",
                prompt.len(),
                model.context
            ),
        )
        .code("context_length_exceeded"));
    }
    Ok(())
}

fn max_tokens(
    common: &Common,
    prompt: usize,
    context: usize,
    limits: &Limits,
) -> Result<usize, ApiError> {
    let room = context.saturating_sub(prompt);
    let asked = common.max_completion_tokens.or(common.max_tokens);
    match asked {
        None => Ok(limits.default_max_tokens.min(room)),
        Some(0) => Err(ApiError::invalid(
            "max_tokens",
            "max_tokens 0: give at least 1",
        )),
        Some(asked) if asked > limits.max_tokens as u64 => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens {asked}: this server generates at most {}",
                limits.max_tokens
            ),
        )),
        Some(asked) if asked as usize > room => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "{prompt} prompt tokens plus max_tokens {asked} exceed the context of \
                 {context}: ask for at most {room}"
            ),
        )
        .code("context_length_exceeded")),
        Some(asked) => Ok(asked as usize),
    }
}

fn sampling(common: &Common) -> Result<Sampling, ApiError> {
    let temperature = common.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature {temperature}: give a value in [0, 2] (0 is greedy)"),
        ));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p {top_p}: give a value in (0, 1]"),
        ));
    }
    let top_k = match common.top_k {
        None => None,
        Some(0) => return Err(ApiError::invalid("top_k", "top_k 0 keeps no token")),
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let sampling = Sampling {
        temperature: temperature as f32,
        top_k,
        top_p: top_p as f32,
        // A negative seed is as good a seed as any: its bits are used.
        seed: common.seed.unwrap_or(0) as u64,
    };
    sampling
        .validate()
        .map_err(|e| ApiError::invalid("temperature", e.to_string()))?;
    Ok(sampling)
}

fn stop_strings(stop: Option<&Value>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid("stop", "stop must hold strings only"))?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or an array of strings",
            ));
        }
    };
    if strings.len() > limits.max_stop {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "{} stop strings: give at most {}",
                strings.len(),
                limits.max_stop
            ),
        ));
    }
    if let Some(bad) = strings
        .iter()
        .find(|s| s.is_empty() || s.len() > limits.max_stop_bytes)
    {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop string of {} bytes: give 1 to {} bytes",
                bad.len(),
                limits.max_stop_bytes
            ),
        ));
    }
    Ok(strings)
}
