//! The engine's tokens: each sample's first token after its prompt's prefill, and the
//! batched decode step of every decoding sample of every request.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crossbeam_channel::Sender;
use rayon::prelude::*;

use super::{LiveSample, Worker, smoothed};
use crate::generate::direct::decode_batch;
use crate::generate::error::GenerateError;
use crate::generate::requests::RequestEvent;
use crate::generate::sequence_kv::{SequenceKv, SequenceStep};
use crate::generate::turn::{Continuation, Limits, Next};
use crate::generate::{FinishReason, Sampler, Sampling};
use crate::state::KvCache;

impl Worker {
    /// After the prompt's prefill: each sample's first token from the prompt's logits.
    pub(super) fn first_tokens(&mut self, i: usize) -> Result<(), GenerateError> {
        let (kv_dim, layers) = (self.model.config.kv_dim(), self.model.layers.len());
        let tokenizer = self.tokenizer.clone();
        let live = &mut self.live[i];
        let session = live.session.as_ref().expect("prefilled has a session");
        let logits = session.logits().ok_or(GenerateError::EmptyTurn)?.to_vec();
        let limits = Limits {
            tokenizer: &tokenizer,
            eos: self.eos,
            options: &live.options,
        };
        let own = live.options.max_tokens.saturating_sub(1).max(1) * kv_dim;
        let now = Instant::now();
        live.first_token = Some(now);
        for index in 0..live.n {
            let sampling = Sampling {
                seed: live.options.sampling.seed.wrapping_add(index as u64),
                ..live.options.sampling
            };
            let mut continuation = Continuation::new(Sampler::new(sampling)?, &live.options.stop);
            let next = take(&mut continuation, &logits, &limits, index, &live.events)?;
            match next {
                Next::Feed(next) => live.samples.push(LiveSample {
                    index,
                    continuation,
                    next,
                    caches: (0..layers)
                        .map(|_| KvCache {
                            k: vec![0.0; own],
                            v: vec![0.0; own],
                        })
                        .collect(),
                    first_token: now,
                }),
                Next::Done(reason) => {
                    let ended = &mut live.ended[index];
                    *ended = Some(end_sample(continuation, index, reason, now, &live.events));
                }
            }
        }
        self.finish_if_done(i);
        Ok(())
    }

    /// One batched decode step of every decoding sample of every request.
    pub(super) fn decode_step(&mut self) {
        let mut steps = Vec::new();
        let mut owners = Vec::new();
        for (r, live) in self.live.iter_mut().enumerate() {
            let Some(session) = live.session.as_ref() else {
                continue;
            };
            if live.samples.is_empty() {
                continue;
            }
            let Ok((shared, shared_len)) = session.history_cache() else {
                continue;
            };
            for s in live.samples.iter_mut() {
                let position = shared_len + s.continuation.tokens.len() - 1;
                owners.push((r, s.index));
                steps.push(SequenceStep {
                    token: s.next,
                    position,
                    kv: SequenceKv::after_prefix(shared, shared_len, &mut s.caches),
                });
            }
        }
        if steps.is_empty() {
            return;
        }
        let (model, head, buffers) = (&self.model, self.head.as_ref(), &mut self.buffers);
        let began = Instant::now();
        let ran = self
            .pool
            .install(|| decode_batch(model, head, &mut steps, buffers));
        drop(steps);
        let step_ns = began.elapsed().as_nanos() as u64;
        self.add_busy(self.decode_lane, step_ns);
        self.decode_ns_per_step = match self.decode_ns_per_step {
            0 => step_ns,
            old => smoothed(old, step_ns),
        };
        match ran {
            Ok(logits) => self.take_tokens(owners, logits),
            Err(e) => {
                let message = e.to_string();
                let failed = owners.iter().map(|o| (o.0, message.clone())).collect();
                self.fail_all(failed);
            }
        }
    }

    /// The next token of each row's sample (`owners`: its request index and sample)
    /// from its logits, `None` for a sample no longer decoding. Each sample draws with
    /// its own generator from its own row, so the draws (a vocabulary's softmax each)
    /// run side by side on the pool: the tokens of draws one after another.
    fn draw_tokens(&mut self, owners: &[(usize, usize)], logits: &[Vec<f32>]) -> Vec<Option<u32>> {
        let mut by_owner: HashMap<(usize, usize), &mut Continuation> = (self.live.iter_mut())
            .enumerate()
            .flat_map(|(r, live)| {
                (live.samples.iter_mut()).map(move |s| ((r, s.index), &mut s.continuation))
            })
            .collect();
        let mut rows: Vec<(Option<&mut Continuation>, &Vec<f32>)> = owners
            .iter()
            .map(|owner| by_owner.remove(owner))
            .zip(logits)
            .collect();
        self.pool.install(|| {
            rows.par_iter_mut()
                .map(|(continuation, logits)| continuation.as_mut().map(|c| c.sample(logits)))
                .collect()
        })
    }

    /// Samples each decoding sample's next token from its logits (`owners`: the request
    /// index and sample of each row), ending the samples and requests that are done.
    fn take_tokens(&mut self, owners: Vec<(usize, usize)>, logits: Vec<Vec<f32>>) {
        let tokens = self.draw_tokens(&owners, &logits);
        let tokenizer = self.tokenizer.clone();
        let mut touched = Vec::new();
        let mut failed = Vec::new();
        for ((r, index), token) in owners.into_iter().zip(tokens) {
            let Some(token) = token else { continue };
            let live = &mut self.live[r];
            let limits = Limits {
                tokenizer: &tokenizer,
                eos: self.eos,
                options: &live.options,
            };
            let at = live.samples.iter().position(|s| s.index == index);
            let Some(at) = at else { continue };
            let sample = &mut live.samples[at];
            match send_token(
                &mut sample.continuation,
                token,
                &limits,
                index,
                &live.events,
            ) {
                Ok(Next::Feed(next)) => sample.next = next,
                Ok(Next::Done(reason)) => {
                    let s = live.samples.remove(at);
                    let end =
                        end_sample(s.continuation, index, reason, s.first_token, &live.events);
                    live.ended[index] = Some(end);
                }
                Err(e) => failed.push((r, e.to_string())),
            }
            touched.push(r);
        }
        if !failed.is_empty() {
            self.fail_all(failed);
            return;
        }
        touched.dedup();
        for r in touched.into_iter().rev() {
            self.finish_if_done(r);
        }
    }
}

/// Samples one token of `sample` and sends its event.
fn take(
    continuation: &mut Continuation,
    logits: &[f32],
    limits: &Limits<'_>,
    sample: usize,
    events: &Sender<RequestEvent>,
) -> Result<Next, GenerateError> {
    let token = continuation.sample(logits);
    send_token(continuation, token, limits, sample, events)
}

/// Takes `token`, drawn for `sample`, and sends its event.
fn send_token(
    continuation: &mut Continuation,
    token: u32,
    limits: &Limits<'_>,
    sample: usize,
    events: &Sender<RequestEvent>,
) -> Result<Next, GenerateError> {
    let mut piece = String::new();
    let next = continuation.accept(token, limits, &AtomicBool::new(false), &mut |t| {
        piece.push_str(t)
    })?;
    let token = *continuation.tokens.last().expect("a token was taken");
    if token != limits.eos || limits.options.ignore_eos {
        let _ = events.send(RequestEvent::Token {
            sample,
            token,
            text: piece,
        });
    }
    Ok(next)
}

/// Sample `index` ended for `reason` (its first token at `first`): its held-back text
/// and its end sent; returns its tokens, first token and end.
pub(super) fn end_sample(
    mut continuation: Continuation,
    index: usize,
    reason: FinishReason,
    first: Instant,
    events: &Sender<RequestEvent>,
) -> (usize, Instant, Instant) {
    let mut text = String::new();
    continuation.finish(&mut |t| text.push_str(t));
    let _ = events.send(RequestEvent::SampleFinished {
        sample: index,
        reason,
        text,
    });
    (continuation.tokens.len(), first, Instant::now())
}
