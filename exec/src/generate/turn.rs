//! One turn of generation: prefill the prompt through the scheduler, then sample, stream
//! and feed tokens until a stop condition.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use hetsched_import::GgufTokenizer;
use hetsched_runtime::engine::RunOutcome;
use serde::Serialize;

use super::error::GenerateError;
use super::sampling::{Sampler, Sampling};
use super::session::Session;
use super::text::TextStream;

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// New tokens at most.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Generation stops before the first of these strings (it is not part of the text).
    pub stop: Vec<String>,
    /// Go on past the model's end-of-sequence token (benchmarks: always `max_tokens`).
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: Sampling::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced its end-of-sequence token.
    Eos,
    /// A stop string was reached.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The caller cancelled (Ctrl-C); what was generated is kept.
    Cancelled,
}

/// What a turn's decode loop does not change: its inputs and its clock.
struct TurnInputs<'a> {
    tokenizer: &'a GgufTokenizer,
    eos: u32,
    options: &'a GenerateOptions,
    cancel: &'a AtomicBool,
    /// When the turn's prefill started.
    started: Instant,
}

/// What a turn's decode loop produces, token by token.
#[derive(Default)]
struct TurnTokens {
    ttft_ns: u64,
    decode_spans_ns: Vec<(u64, u64)>,
    decode_step_times: Vec<super::DecodeTime>,
}

/// What ends a sequence besides a cancel: the model's EOS (unless ignored), stop strings
/// and `max_tokens`.
pub(super) struct Limits<'a> {
    pub(super) tokenizer: &'a GgufTokenizer,
    pub(super) eos: u32,
    pub(super) options: &'a GenerateOptions,
}

/// What a sequence does after a sampled token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Feed the token: generation goes on.
    Feed(u32),
    /// The sequence ended.
    Done(FinishReason),
}

/// One generated sequence's progress: its sampler, its text stream and what it produced.
/// The stop conditions of a turn, a parallel sample and an engine request are this one
/// type's.
#[derive(Debug)]
pub(super) struct Continuation {
    sampler: Sampler,
    stream: TextStream,
    /// Tokens sampled (an end-of-sequence token included).
    pub(super) tokens: Vec<u32>,
    /// Their final text.
    pub(super) text: String,
}

impl Continuation {
    pub(super) fn new(sampler: Sampler, stops: &[String]) -> Self {
        Self {
            sampler,
            stream: TextStream::new(stops),
            tokens: Vec::new(),
            text: String::new(),
        }
    }

    /// Samples the next token from `logits`, streams its text through `on_text` and
    /// says whether to feed it or why the sequence ended.
    pub(super) fn take(
        &mut self,
        logits: &[f32],
        limits: &Limits<'_>,
        cancel: &AtomicBool,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Next, GenerateError> {
        let token = self.sample(logits);
        self.accept(token, limits, cancel, on_text)
    }

    /// The next token from `logits` under this sequence's own sampler, not yet taken
    /// (the samples of a batched step draw side by side, then are taken in order).
    pub(super) fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sampler.sample(logits)
    }

    /// Takes `token`, chosen elsewhere (greedy sampling on the GPU lane), as
    /// [`Self::take`] takes a sampled one.
    pub(super) fn accept(
        &mut self,
        token: u32,
        limits: &Limits<'_>,
        cancel: &AtomicBool,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Next, GenerateError> {
        self.tokens.push(token);
        let options = limits.options;
        if token == limits.eos && !options.ignore_eos {
            return Ok(Next::Done(FinishReason::Eos));
        }
        let pushed = self.stream.push(&limits.tokenizer.token_bytes(token)?);
        on_text(&pushed.text);
        self.text += &pushed.text;
        if pushed.stopped {
            return Ok(Next::Done(FinishReason::Stop));
        }
        if self.tokens.len() >= options.max_tokens {
            return Ok(Next::Done(FinishReason::Length));
        }
        if cancel.load(Ordering::Relaxed) {
            return Ok(Next::Done(FinishReason::Cancelled));
        }
        Ok(Next::Feed(token))
    }

    /// Hands out the text held back at the end (an unfinished stop-string prefix).
    pub(super) fn finish(&mut self, on_text: &mut impl FnMut(&str)) {
        let rest = self.stream.finish();
        on_text(&rest);
        self.text += &rest;
    }
}

/// A finished turn.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Tokens of the prompt (this turn's).
    pub prompt_tokens: usize,
    /// Tokens generated (an end-of-sequence token included).
    pub tokens: Vec<u32>,
    /// Their text (up to a stop string; without the end-of-sequence token).
    pub text: String,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// From the start of the prefill to the first token sampled, ns.
    pub ttft_ns: u64,
    /// The scheduled prefill's wall time, ns.
    pub prefill_ns: u64,
    /// Of which building and compiling its plan, ns.
    pub prefill_plan_ns: u64,
    /// Wall time of the decode steps (every generated token after the first), ns.
    pub decode_ns: u64,
    /// Decode steps run.
    pub decode_steps: u64,
    /// The scheduled prefill that ran (its schedule and timeline).
    pub prefill_run: RunOutcome,
    /// Each decode step's start and end, ns from the end of the prefill.
    pub decode_spans_ns: Vec<(u64, u64)>,
    /// Each decode step's wall time and, of it, the time its stages ran (see
    /// [`super::DecodeTime`]), ns.
    pub decode_step_times: Vec<super::DecodeTime>,
}

impl Session {
    /// Generates after `prompt` (this turn's tokens; a later turn continues the cache of
    /// the earlier ones, starting with the token the last turn ended on), calling
    /// `on_text` with each piece of text as it becomes final. Stops at the model's EOS,
    /// a stop string, `max_tokens`, or when `cancel` is set.
    ///
    /// The prompt plus `max_tokens` must fit in the context: otherwise
    /// [`GenerateError::BeyondContext`] before any work.
    ///
    /// After the prefill, sampling, `on_text` and the decode steps run on one of the
    /// session's pool threads (so `on_text` is `Send`): the steps' kernels then start
    /// there without handing each step to the pool and back.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        tokenizer: &GgufTokenizer,
        options: &GenerateOptions,
        cancel: &AtomicBool,
        mut on_text: impl FnMut(&str) + Send,
    ) -> Result<Generated, GenerateError> {
        let eos = tokenizer.eos_id().ok_or(GenerateError::NoEos)?;
        let sampler = Sampler::new(options.sampling)?;
        if options.max_tokens == 0 {
            return Err(GenerateError::NoTokens);
        }
        let turn = self.checked_turn(prompt, options.max_tokens)?;
        let needed = self.tokens().len() + turn.len() + options.max_tokens;
        self.reserve(needed)?;
        let started = Instant::now();
        let (prefill_run, plan_ns) = self.prefill(&turn)?;
        self.pending = None;
        let prefill_ns = started.elapsed().as_nanos() as u64;
        let decoded_before = self.decode_time();
        let inputs = TurnInputs {
            tokenizer,
            eos,
            options,
            cancel,
            started,
        };
        let mut continuation = Continuation::new(sampler, &options.stop);
        let mut out = TurnTokens::default();
        // The loop runs on one of the session's pool threads: each step's `pool.install`
        // is then a plain call, not a hand-off to a pool thread and a wake-up back (two
        // thread wake-ups a token, outside any stage, which the step's wall time counted).
        let pool = self.pool.clone();
        // A greedy turn on the GPU lane reads back only the token the device chose.
        self.set_gpu_logits(!options.sampling.is_greedy());
        let finish_reason =
            pool.install(|| self.decode_loop(&inputs, &mut continuation, &mut out, &mut on_text));
        self.set_gpu_logits(true);
        let finish_reason = finish_reason?;
        continuation.finish(&mut on_text);
        let decoded = self.decode_time();
        Ok(Generated {
            prompt_tokens: prompt.len(),
            tokens: continuation.tokens,
            text: continuation.text,
            finish_reason,
            ttft_ns: out.ttft_ns,
            prefill_ns,
            prefill_plan_ns: plan_ns,
            decode_ns: decoded.wall_ns - decoded_before.wall_ns,
            decode_steps: decoded.steps - decoded_before.steps,
            prefill_run,
            decode_spans_ns: out.decode_spans_ns,
            decode_step_times: out.decode_step_times,
        })
    }

    /// Samples, streams and feeds tokens after the prefill until a stop condition.
    fn decode_loop(
        &mut self,
        inputs: &TurnInputs<'_>,
        continuation: &mut Continuation,
        out: &mut TurnTokens,
        on_text: &mut (impl FnMut(&str) + Send),
    ) -> Result<FinishReason, GenerateError> {
        let prefilled = Instant::now();
        let limits = Limits {
            tokenizer: inputs.tokenizer,
            eos: inputs.eos,
            options: inputs.options,
        };
        loop {
            let greedy = inputs.options.sampling.is_greedy();
            let next = match (self.gpu_greedy_next(), self.logits()) {
                // The GPU lane's step chose the token on the device (greedy).
                (Some(token), _) if greedy => {
                    continuation.accept(token, &limits, inputs.cancel, &mut *on_text)?
                }
                (_, Some(logits)) => {
                    continuation.take(logits, &limits, inputs.cancel, &mut *on_text)?
                }
                (_, None) => {
                    return Err(crate::ExecError::MissingValue {
                        op: "decode step".into(),
                        chunk: 0,
                        value: "logits",
                    }
                    .into());
                }
            };
            if continuation.tokens.len() == 1 {
                out.ttft_ns = inputs.started.elapsed().as_nanos() as u64;
            }
            self.pending = continuation.tokens.last().copied();
            let token = match next {
                Next::Feed(token) => token,
                Next::Done(reason) => return Ok(reason),
            };
            self.pending = None;
            let start = prefilled.elapsed().as_nanos() as u64;
            let before = self.decode_time();
            self.step(token)?;
            let end = prefilled.elapsed().as_nanos() as u64;
            out.decode_spans_ns.push((start, end));
            out.decode_step_times.push(self.decode_time().since(before));
        }
    }

    /// This turn's tokens to prefill ([`Self::pending_turn`]), checked: not empty, and
    /// with `max_tokens` more within the context after the history.
    pub(super) fn checked_turn(
        &self,
        prompt: &[u32],
        max_tokens: usize,
    ) -> Result<Vec<u32>, GenerateError> {
        let turn = self.pending_turn(prompt);
        let (history, context) = (self.tokens().len(), self.model().config.context_length);
        // Saturating: `max_tokens` comes from the caller and may be anything.
        let needed = history
            .saturating_add(turn.len())
            .saturating_add(max_tokens);
        if needed > context {
            return Err(GenerateError::BeyondContext {
                history,
                prompt: turn.len(),
                max_tokens,
                context,
            });
        }
        if turn.is_empty() {
            return Err(GenerateError::EmptyTurn);
        }
        Ok(turn)
    }

    /// This turn's tokens to prefill: the token the last turn ended on (sampled, not yet
    /// fed), then `prompt`.
    fn pending_turn(&self, prompt: &[u32]) -> Vec<u32> {
        self.pending
            .iter()
            .copied()
            .chain(prompt.iter().copied())
            .collect()
    }
}
