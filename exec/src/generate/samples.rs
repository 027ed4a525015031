//! Parallel sampling: `n` candidates of one prompt, decoded together.
//!
//! The prompt is prefilled once through the scheduler into the session's KV cache, which
//! every sample then reads as a shared prefix, never copied ([`super::SequenceKv`]); each
//! sample's own cache holds only the positions it generates. Each sample draws its first
//! token from the prompt's logits with its own sampler, then the live samples decode
//! together: one batched step ([`super::decode_batch`]) per token, the linears one small
//! GEMM over the samples' rows. A sample that ends (EOS, a stop string, `max_tokens`)
//! leaves the batch; the others go on.
//!
//! On a session resident on the GPU the samples decode there, up to
//! [`GPU_MAX_SAMPLES`] of them in one step: the device's caches hold
//! the prompt's rows, then each sample's own region (`max_tokens - 1` rows each) after
//! them, and a step maps every sample's positions past the prompt into its region. A
//! greedy step reads back only each sample's token.
//!
//! Sample `i` samples with the options' sampling and seed `seed + i` (wrapping), so
//! greedy samples are all the same text and a seeded run is reproducible. The session's
//! history stays the prompt: a later turn continues after the prompt, not after a sample.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use hetsched_import::GgufTokenizer;
use hetsched_runtime::engine::RunOutcome;
use rayon::prelude::*;

use super::error::GenerateError;
use super::gpu::StepRow;
use super::sampling::{Sampler, Sampling};
use super::session::{Chosen, Session};
use super::turn::{Continuation, FinishReason, GenerateOptions, Limits, Next};
use crate::state::KvCache;

/// The most samples of one prompt decoded together ([`Session::generate_samples`]): each
/// holds its own cache of up to `max_tokens` positions, and a batch's rows are its live
/// samples.
pub const MAX_SAMPLES: usize = 64;

/// The most samples decoded together on the GPU lane: one batched step of the
/// one-dispatch decode layers (`hetsched_gpu::DECODE_LAYER_MAX_ROWS`).
pub const GPU_MAX_SAMPLES: usize = 8;

#[cfg(feature = "gpu")]
const _: () = assert!(GPU_MAX_SAMPLES == hetsched_gpu::DECODE_LAYER_MAX_ROWS);

/// One finished sample.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Tokens generated (an end-of-sequence token included).
    pub tokens: Vec<u32>,
    /// Their text (up to a stop string; without the end-of-sequence token).
    pub text: String,
    /// Why it stopped.
    pub finish_reason: FinishReason,
}

/// `n` finished samples of one prompt.
#[derive(Clone, Debug)]
pub struct SamplesGenerated {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// The samples, in order (sample `i` seeded `seed + i`).
    pub samples: Vec<Sample>,
    /// From the start of the prefill to the first tokens sampled, ns.
    pub ttft_ns: u64,
    /// The scheduled prefill's wall time, ns.
    pub prefill_ns: u64,
    /// Of which building and compiling its plan, ns.
    pub prefill_plan_ns: u64,
    /// Wall time of the batched decode steps, ns.
    pub decode_ns: u64,
    /// Batched decode steps run.
    pub decode_steps: u64,
    /// Tokens fed by them, summed over the samples (a step feeds one per live sample).
    pub decode_tokens: u64,
    /// The scheduled prefill that ran.
    pub prefill_run: RunOutcome,
}

/// A sample still decoding: its progress and its own KV cache (per layer, the positions
/// after the prompt; none on the GPU lane, whose device caches hold them).
struct Live {
    index: usize,
    continuation: Continuation,
    next: u32,
    caches: Vec<KvCache>,
}

impl Session {
    /// Generates `n` samples of `prompt` (after the session's history, as
    /// [`Session::generate`]), decoded together in batched steps over the prompt's
    /// shared KV cache; `on_text(i, piece)` streams sample `i`'s text as it becomes
    /// final. Stops each sample at the model's EOS, a stop string or `max_tokens`, and
    /// all of them when `cancel` is set.
    ///
    /// # Errors
    /// [`GenerateError::Samples`] for `n` 0 or above [`MAX_SAMPLES`],
    /// [`GenerateError::BeyondContext`] as [`Session::generate`] (before any work), and
    /// an [`crate::ExecError::InvalidOption`] on a session whose decode steps are
    /// scheduled (batched steps run on the direct path).
    pub fn generate_samples(
        &mut self,
        prompt: &[u32],
        tokenizer: &GgufTokenizer,
        options: &GenerateOptions,
        n: usize,
        cancel: &AtomicBool,
        mut on_text: impl FnMut(usize, &str) + Send,
    ) -> Result<SamplesGenerated, GenerateError> {
        let eos = self.check_samples(tokenizer, options, n)?;
        let turn = self.checked_turn(prompt, options.max_tokens)?;
        let prompt_end = self.tokens().len() + turn.len();
        let started = Instant::now();
        let (prefill_run, plan_ns) = self.prefill(&turn)?;
        self.pending = None;
        let prefill_ns = started.elapsed().as_nanos() as u64;
        let limits = Limits {
            tokenizer,
            eos,
            options,
        };
        let kv_dim = self.model().config.kv_dim();
        let layers = self.model().layers.len();
        // A sample feeds at most max_tokens - 1 tokens: its last one is never fed.
        let own_positions = options.max_tokens.saturating_sub(1).max(1);
        let on_gpu = self.batched_rows().is_some();
        let own = || match on_gpu {
            true => Vec::new(),
            false => own_caches(layers, own_positions * kv_dim),
        };
        self.reserve_gpu_rows(prompt_end + n * own_positions)?;
        let logits = self.logits().ok_or(GenerateError::EmptyTurn)?.to_vec();
        let mut live = Vec::with_capacity(n);
        let mut done: Vec<Option<Sample>> = (0..n).map(|_| None).collect();
        for (index, slot) in done.iter_mut().enumerate() {
            let sampling = Sampling {
                seed: options.sampling.seed.wrapping_add(index as u64),
                ..options.sampling
            };
            let mut continuation = Continuation::new(Sampler::new(sampling)?, &options.stop);
            let next = continuation.take(&logits, &limits, cancel, &mut |t| on_text(index, t))?;
            match next {
                Next::Feed(next) => live.push(Live {
                    index,
                    continuation,
                    next,
                    caches: own(),
                }),
                Next::Done(reason) => {
                    *slot = Some(finished(continuation, reason, index, &mut on_text))
                }
            }
        }
        let ttft_ns = started.elapsed().as_nanos() as u64;
        let before = self.decode_time();
        let mut decode_tokens = 0u64;
        let pool = self.pool.clone();
        pool.install(|| -> Result<(), GenerateError> {
            while !live.is_empty() {
                decode_tokens += self.step_samples(
                    &mut live,
                    &mut done,
                    (prompt_end, own_positions),
                    &limits,
                    cancel,
                    &mut on_text,
                )?;
            }
            Ok(())
        })?;
        let decoded = self.decode_time().since(before);
        Ok(SamplesGenerated {
            prompt_tokens: prompt.len(),
            samples: done.into_iter().flatten().collect(),
            ttft_ns,
            prefill_ns,
            prefill_plan_ns: plan_ns,
            decode_ns: decoded.wall_ns,
            decode_steps: decoded.steps,
            decode_tokens,
            prefill_run,
        })
    }
}

impl Session {
    /// Refuses `n` samples out of range, a session whose decode steps cannot be batched,
    /// a tokenizer without an end-of-sequence token, bad sampling settings and no new
    /// tokens, in that order; returns the end-of-sequence token.
    fn check_samples(
        &self,
        tokenizer: &GgufTokenizer,
        options: &GenerateOptions,
        n: usize,
    ) -> Result<u32, GenerateError> {
        let max = self.batched_rows().unwrap_or(MAX_SAMPLES).min(MAX_SAMPLES);
        if n == 0 || n > max {
            return Err(GenerateError::Samples { n, max });
        }
        self.check_batched()?;
        let eos = tokenizer.eos_id().ok_or(GenerateError::NoEos)?;
        options.sampling.validate()?;
        if options.max_tokens == 0 {
            return Err(GenerateError::NoTokens);
        }
        Ok(eos)
    }

    /// One batched decode step of the `live` samples (their prompt ends at `prompt_end`;
    /// each has `own` positions after it): each is fed its next token and samples one
    /// more, streaming its text through `on_text`; one that ends moves to `done`. Returns
    /// the tokens fed.
    fn step_samples(
        &mut self,
        live: &mut Vec<Live>,
        done: &mut [Option<Sample>],
        (prompt_end, own): (usize, usize),
        limits: &Limits<'_>,
        cancel: &AtomicBool,
        on_text: &mut impl FnMut(usize, &str),
    ) -> Result<u64, GenerateError> {
        let position = |s: &Live| prompt_end + s.continuation.tokens.len() - 1;
        let chosen = match self.batched_rows() {
            Some(_) => {
                let rows: Vec<StepRow> = live
                    .iter()
                    .map(|s| StepRow {
                        token: s.next,
                        position: position(s),
                        shift: (prompt_end, s.index * own),
                    })
                    .collect();
                let greedy = limits.options.sampling.is_greedy();
                self.step_rows_on_gpu(&rows, prompt_end + own, !greedy)?
            }
            None => {
                let mut batch: Vec<(u32, usize, &mut [KvCache])> = live
                    .iter_mut()
                    .map(|s| (s.next, position(s), s.caches.as_mut_slice()))
                    .collect();
                Chosen::Logits(self.step_after_history(&mut batch)?)
            }
        };
        let fed = live.len() as u64;
        let mut still = Vec::with_capacity(live.len());
        let tokens: Vec<u32> = match chosen {
            // Each sample draws from its own logits with its own generator, so the draws
            // (a vocabulary's softmax each) run side by side on the pool, the same tokens
            // as one after another; they are taken (streamed, checked for stops) in order.
            Chosen::Logits(rows) => live
                .par_iter_mut()
                .zip(rows.par_iter())
                .map(|(s, logits)| s.continuation.sample(logits))
                .collect(),
            Chosen::Tokens(tokens) => tokens,
        };
        for (mut s, token) in live.drain(..).zip(tokens) {
            let index = s.index;
            let mut emit = |t: &str| on_text(index, t);
            let next = s.continuation.accept(token, limits, cancel, &mut emit)?;
            match next {
                Next::Feed(next) => {
                    s.next = next;
                    still.push(s);
                }
                Next::Done(reason) => {
                    done[index] = Some(finished(s.continuation, reason, index, on_text));
                }
            }
        }
        *live = still;
        Ok(fed)
    }
}

/// A sample's own KV cache: `values` zeros of K and as many of V in each of `layers`.
fn own_caches(layers: usize, values: usize) -> Vec<KvCache> {
    (0..layers)
        .map(|_| KvCache {
            k: vec![0.0; values],
            v: vec![0.0; values],
        })
        .collect()
}

/// A sample that ended for `reason`, its held-back text handed out.
fn finished(
    mut continuation: Continuation,
    reason: FinishReason,
    index: usize,
    on_text: &mut impl FnMut(usize, &str),
) -> Sample {
    continuation.finish(&mut |t| on_text(index, t));
    Sample {
        tokens: continuation.tokens,
        text: continuation.text,
        finish_reason: reason,
    }
}
