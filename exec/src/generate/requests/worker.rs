//! The engine thread: its loop over live requests (take, admit, one prefill chunk where
//! the request policy lets it run, one batched decode step), the only place requests'
//! sessions and caches live.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use hetsched_import::GgufTokenizer;
use hetsched_systems::ProcessorKind;
use hetsched_systems::request_policy::RequestPolicy;
use hetsched_systems::resources::TimelineLog;

mod decode;
mod order;

use decode::end_sample;

use super::{
    EngineLimits, EngineSnapshot, LaneBusy, Priority, RequestEvent, RequestId, RequestMetrics,
    Shared, Submitted, request_session,
};
use crate::generate::direct::DecodeBuffers;
use crate::generate::error::GenerateError;
use crate::generate::head::QuantizedHead;
use crate::generate::turn::{Continuation, GenerateOptions};
use crate::generate::{FinishReason, Session};
use crate::state::KvCache;
use crate::{ExecModel, PrefillOptions};

/// A sample decoding: its progress, the token to feed, its own cache after the prompt.
struct LiveSample {
    index: usize,
    continuation: Continuation,
    next: u32,
    caches: Vec<KvCache>,
    first_token: Instant,
}

/// A live request on the engine thread.
struct Live {
    id: RequestId,
    priority: Priority,
    prompt: Vec<u32>,
    options: GenerateOptions,
    n: usize,
    kv_bytes: usize,
    arrival: Instant,
    /// When its KV memory was reserved (its arrival until then).
    armed: Instant,
    events: Sender<RequestEvent>,
    cancel: Arc<AtomicBool>,
    /// Created when the request is admitted (its KV memory reserved).
    session: Option<Session>,
    /// Prompt tokens prefilled so far.
    prefilled: usize,
    /// The prefill chunk started and paused (preempted), if any.
    chunk: Option<StartedChunk>,
    samples: Vec<LiveSample>,
    /// Per sample: tokens generated and when it ended.
    ended: Vec<Option<(usize, Instant, Instant)>>,
    first_token: Option<Instant>,
}

/// A prefill chunk a session started: where it ends in the prompt and the time it ran.
struct StartedChunk {
    end: usize,
    ran: std::time::Duration,
}

impl Live {
    fn prefilling(&self) -> bool {
        self.session.is_some() && self.prefilled < self.prompt.len()
    }
}

/// The engine thread's state.
pub(super) struct Worker {
    model: Arc<ExecModel>,
    tokenizer: Arc<GgufTokenizer>,
    eos: u32,
    options: PrefillOptions,
    pool: Arc<rayon::ThreadPool>,
    limits: EngineLimits,
    shared: Arc<Shared>,
    started: Instant,
    head: Option<QuantizedHead>,
    buffers: DecodeBuffers,
    /// Requests in arrival order (waiting ones have no session yet).
    live: VecDeque<Live>,
    /// Orders the requests for the next prefill chunk and for memory, as a world's
    /// dispatch does ([`pick_next`]).
    policy: Box<dyn RequestPolicy>,
    /// Measured prefill time per prompt token, ns (0 until a chunk ran): the requests'
    /// work as the policy sees it.
    prefill_ns_per_token: u64,
    /// Measured time of a batched decode step, ns (0 until one ran).
    decode_ns_per_step: u64,
    /// The lane the decode steps count their busy time on ([`EngineSnapshot::lanes`]): the
    /// CPU's.
    decode_lane: usize,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        model: Arc<ExecModel>,
        tokenizer: Arc<GgufTokenizer>,
        eos: u32,
        options: PrefillOptions,
        pool: Arc<rayon::ThreadPool>,
        limits: EngineLimits,
        shared: Arc<Shared>,
        started: Instant,
        policy: Box<dyn RequestPolicy>,
    ) -> Self {
        let head = QuantizedHead::own_width(&model);
        let device = crate::run_device(&options);
        shared.snapshot.lock().lanes = device
            .processors
            .iter()
            .map(|p| LaneBusy {
                name: p.name.clone(),
                kind: p.kind.as_str().to_string(),
                busy_ns: 0,
            })
            .collect();
        Self {
            model,
            tokenizer,
            eos,
            options,
            pool,
            limits,
            shared,
            started,
            head,
            buffers: DecodeBuffers::default(),
            live: VecDeque::new(),
            policy,
            prefill_ns_per_token: 0,
            decode_ns_per_step: 0,
            decode_lane: device.first_of(ProcessorKind::Cpu).unwrap_or(0),
        }
    }

    /// The loop, until the engine is dropped (its channel closed).
    pub(super) fn run(mut self, inbox: Receiver<Submitted>) {
        loop {
            if self.live.is_empty() {
                match inbox.recv() {
                    Ok(s) => self.take(s),
                    Err(_) => return,
                }
            }
            loop {
                match inbox.try_recv() {
                    Ok(s) => self.take(s),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.stop_all();
                        return;
                    }
                }
            }
            self.end_cancelled();
            self.admit_waiting();
            if let Some(i) = self.turn_prefill() {
                self.prefill_chunk(i, &inbox);
            }
            self.decode_step();
            self.publish();
        }
    }

    fn take(&mut self, s: Submitted) {
        let spec = s.spec;
        let options = GenerateOptions {
            max_tokens: spec.max_tokens,
            sampling: spec.sampling,
            stop: spec.stop,
            ignore_eos: spec.ignore_eos,
        };
        let mut live = Live {
            id: s.id,
            priority: spec.priority,
            prompt: spec.prompt,
            options,
            n: spec.n,
            kv_bytes: s.kv_bytes,
            arrival: s.arrival,
            armed: s.arrival,
            events: s.events,
            cancel: s.cancel,
            session: None,
            prefilled: 0,
            chunk: None,
            samples: Vec::new(),
            ended: vec![None; spec.n],
            first_token: None,
        };
        let opened = match s.admitted {
            true => open(&self.model, &self.options, &self.pool, &mut live),
            false => Ok(()),
        };
        self.live.push_back(live);
        if let Err(e) = opened {
            self.fail(self.live.len() - 1, e);
        }
    }

    /// Admits waiting requests whose caches fit now, in the request policy's order; the
    /// first that does not fit stops the rest (no request overtakes it for memory).
    fn admit_waiting(&mut self) {
        let mut failed = Vec::new();
        let mut tried = Vec::new();
        while let Some(i) = self.pick(|l| l.session.is_none() && !tried.contains(&l.id)) {
            tried.push(self.live[i].id);
            let needed = self.live[i].kv_bytes;
            if !self
                .shared
                .ledger
                .lock()
                .reserve(needed, self.limits.kv_budget_bytes)
            {
                break;
            }
            if let Err(e) = open(&self.model, &self.options, &self.pool, &mut self.live[i]) {
                failed.push((i, e.to_string()));
            }
        }
        self.fail_all(failed);
    }

    /// Runs the next prefill chunk of request `i`, or resumes the one it paused. A
    /// request that arrives meanwhile pauses the chunk at the next subgraph boundary
    /// (preemption: the next turn's order decides which request's prefill runs on), and
    /// so does a cancel of this one.
    fn prefill_chunk(&mut self, i: usize, inbox: &Receiver<Submitted>) {
        let chunk = self.options.chunk_len.max(1) as usize;
        let began = Instant::now();
        if self.live[i].chunk.is_none() {
            let live = &mut self.live[i];
            let end = (live.prefilled + chunk).min(live.prompt.len());
            let session = live.session.as_mut().expect("prefilling has a session");
            if let Err(e) = session.start_prefill(&live.prompt[live.prefilled..end]) {
                return self.fail(i, e);
            }
            live.chunk = Some(StartedChunk {
                end,
                ran: std::time::Duration::ZERO,
            });
            // The request shows as prefilling while its first chunk runs, not after.
            self.publish();
        }
        let live = &mut self.live[i];
        let session = live.session.as_mut().expect("prefilling has a session");
        let cancel = &live.cancel;
        let yield_now = || !inbox.is_empty() || cancel.load(Ordering::Acquire);
        let ran = match session.resume_prefill(&yield_now) {
            Ok(None) => {
                if let Some(started) = &mut live.chunk {
                    started.ran += began.elapsed();
                }
                return;
            }
            Ok(Some(ran)) => Ok(ran),
            Err(e) => Err(e),
        };
        let StartedChunk { end, ran: before } = live.chunk.take().expect("a chunk was started");
        let per_token =
            (before + began.elapsed()).as_nanos() as u64 / (end - live.prefilled) as u64;
        self.prefill_ns_per_token = match self.prefill_ns_per_token {
            0 => per_token,
            old => smoothed(old, per_token),
        };
        live.prefilled = end;
        let complete = end == live.prompt.len();
        // Before the first tokens go out: whoever saw one sees the chunk's busy time.
        if let Ok((outcome, _)) = &ran {
            self.add_run_busy(&outcome.timeline);
        }
        let done = ran.and_then(|_| match complete {
            true => self.first_tokens(i),
            false => Ok(()),
        });
        if let Err(e) = done {
            self.fail(i, e);
        }
    }

    /// Fails the requests at the given indices (each once, whatever the order).
    fn fail_all(&mut self, mut failed: Vec<(usize, String)>) {
        failed.sort_by_key(|f| std::cmp::Reverse(f.0));
        failed.dedup_by_key(|f| f.0);
        for (i, message) in failed {
            self.fail(i, message);
        }
    }

    /// Ends every sample of cancelled requests and frees their caches.
    fn end_cancelled(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.live.len() {
            let live = &mut self.live[i];
            if !live.cancel.load(Ordering::Acquire) {
                i += 1;
                continue;
            }
            let samples = std::mem::take(&mut live.samples);
            let started: Vec<usize> = samples.iter().map(|s| s.index).collect();
            for s in samples {
                let reason = FinishReason::Cancelled;
                let end = end_sample(s.continuation, s.index, reason, s.first_token, &live.events);
                live.ended[s.index] = Some(end);
            }
            for index in 0..live.n {
                if live.ended[index].is_none() && !started.contains(&index) {
                    let _ = live.events.send(RequestEvent::SampleFinished {
                        sample: index,
                        reason: FinishReason::Cancelled,
                        text: String::new(),
                    });
                    live.ended[index] = Some((0, now, now));
                }
            }
            self.finish(i, true);
        }
    }

    /// Finishes request `i` if every sample ended.
    fn finish_if_done(&mut self, i: usize) {
        if self.live[i].ended.iter().all(Option::is_some) {
            self.finish(i, false);
        }
    }

    /// Request `i` ended (`cancelled` or not): its metrics sent, its caches and its place
    /// freed.
    fn finish(&mut self, i: usize, cancelled: bool) {
        let Some(live) = self.live.remove(i) else {
            return;
        };
        let end = live
            .ended
            .iter()
            .flatten()
            .map(|e| e.2)
            .max()
            .unwrap_or_else(Instant::now);
        let ms =
            |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1e3;
        let tpots: Vec<f64> = live
            .ended
            .iter()
            .flatten()
            .filter(|e| e.0 > 1)
            .map(|&(tokens, first, last)| ms(first, last) / (tokens - 1) as f64)
            .collect();
        let metrics = RequestMetrics {
            id: live.id,
            priority: live.priority,
            arrival_ms: ms(self.started, live.arrival),
            ttft_ms: live.first_token.map_or(0.0, |t| ms(live.arrival, t)),
            tpot_ms: match tpots.len() {
                0 => 0.0,
                k => tpots.iter().sum::<f64>() / k as f64,
            },
            e2e_ms: ms(live.arrival, end),
            prompt_tokens: live.prompt.len(),
            generated_tokens: live.ended.iter().flatten().map(|e| e.0).sum(),
        };
        // Freed and counted before the last event: a caller that saw it sees the memory
        // free and the request no longer live.
        self.release(&live);
        self.publish_with(|snapshot| {
            snapshot.finished += 1;
            snapshot.cancelled += u64::from(cancelled);
        });
        let _ = live.events.send(RequestEvent::Finished(metrics));
    }

    /// Request `i` failed: the error sent, its caches and its place freed.
    fn fail(&mut self, i: usize, error: impl std::fmt::Display) {
        let Some(live) = self.live.remove(i) else {
            return;
        };
        self.release(&live);
        self.publish_with(|snapshot| snapshot.failed += 1);
        let _ = live.events.send(RequestEvent::Failed(error.to_string()));
    }

    fn release(&self, live: &Live) {
        self.shared.live.lock().remove(&live.id);
        let held = if live.session.is_some() {
            live.kv_bytes
        } else {
            0
        };
        self.shared.ledger.lock().release(held);
    }

    /// The engine was dropped: every live request fails.
    fn stop_all(&mut self) {
        while !self.live.is_empty() {
            self.fail(0, "the request engine stopped");
        }
        self.publish();
    }

    /// Adds `ns` of busy time to `lane` in the snapshot at once (a caller that saw a token
    /// of that work then sees its busy time).
    fn add_busy(&self, lane: usize, ns: u64) {
        if let Some(busy) = self.shared.snapshot.lock().lanes.get_mut(lane) {
            busy.busy_ns += ns;
        }
    }

    /// Adds a run's busy time on each lane to the snapshot at once, as [`Self::add_busy`].
    fn add_run_busy(&self, timeline: &TimelineLog) {
        let mut snapshot = self.shared.snapshot.lock();
        let busy = timeline.busy_ns_by_lane(snapshot.lanes.len());
        for (lane, ns) in snapshot.lanes.iter_mut().zip(busy) {
            lane.busy_ns += ns;
        }
    }

    /// Publishes the counts by state.
    fn publish(&self) {
        self.publish_with(|_| {});
    }

    /// Publishes the counts by state with `ended`'s change to the totals, under one lock:
    /// a reader never sees a request counted as ended and still live.
    fn publish_with(&self, ended: impl FnOnce(&mut EngineSnapshot)) {
        let mut snapshot = self.shared.snapshot.lock();
        ended(&mut snapshot);
        snapshot.waiting = self.live.iter().filter(|l| l.session.is_none()).count();
        snapshot.prefilling = self.live.iter().filter(|l| l.prefilling()).count();
        snapshot.decoding = self.live.iter().filter(|l| !l.samples.is_empty()).count();
    }
}

/// Gives an admitted request its session, the prompt's cache reserved.
fn open(
    model: &Arc<ExecModel>,
    options: &PrefillOptions,
    pool: &Arc<rayon::ThreadPool>,
    live: &mut Live,
) -> Result<(), GenerateError> {
    let mut session = request_session(model, options, pool)?;
    session.reserve(live.prompt.len())?;
    live.session = Some(session);
    live.armed = Instant::now();
    Ok(())
}

/// A measured cost's running estimate after `new`: one slow run (a loaded machine) does
/// not swing the policy.
fn smoothed(old: u64, new: u64) -> u64 {
    (3 * old + new) / 4
}

/// Nanoseconds from `origin` to `at` (0 before it).
fn ns_since(origin: Instant, at: Instant) -> u64 {
    at.saturating_duration_since(origin).as_nanos() as u64
}
