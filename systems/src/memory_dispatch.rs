//! Memory-aware dispatch: the [`MemoryLedger`] of live bytes per region and the
//! admission rule `dispatch_ready` asks before it starts a job; `collect_completions`
//! frees a finished job's dead tensors.
//!
//! A job allocates its outputs and workspace when it starts; a tensor is freed when its
//! last consumer ends; the KV cache is held from the start. The ledger follows each chunk
//! by memory steps ([`PrefillPlan::memory_step`]): an INT8 stage and the outlier shadow
//! beside it are one step, allocated when the first of the two starts and freed when the
//! last ends; the second to start is admitted at once (its memory is already held). A job is admitted only if the
//! state after it is *safe*: the chunks in flight can all finish one after another, in
//! chunk order, each with what is free plus what the chunks before it release (a banker's
//! algorithm over chunks). Chunk order is the one order that always exists: a chunk's
//! cross-chunk stages wait for earlier chunks only, and chunks start in order. Running
//! jobs need no more memory and end on their own, so the check looks at the state once
//! they have ended. Then either a job is running, or the first unfinished chunk's next
//! job is ready and admitted: no set of waiting jobs can hold memory the others need,
//! and there is no memory deadlock. The check costs O(chunks in flight x regions) per
//! candidate; when every chunk fits at its peak at once the ledger only counts.

use crate::graph::StageDependency;
use crate::memory::MemoryProfile;
use crate::plan::{InstanceKey, PrefillPlan};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ChunkState {
    /// Memory steps done.
    done: u32,
    /// Stages of step `done` started.
    started: u32,
    /// Stages of step `done` finished.
    finished: u32,
}

impl ChunkState {
    /// Step `done` holds its memory.
    fn running(&self) -> bool {
        self.started > 0
    }
}

/// Live bytes per region, and each chunk's progress through its memory profile.
#[derive(Debug, Clone)]
pub struct MemoryLedger {
    profile: MemoryProfile,
    live: Vec<u64>,
    high_water: Vec<u64>,
    chunks: Vec<ChunkState>,
    /// Chunks whose first stage was dispatched (always a prefix: chunks start in order).
    started: u32,
    first_unfinished: u32,
    unconstrained: bool,
    /// Per memory step: whether it waits for the previous step of every earlier chunk.
    cross: Vec<bool>,
    /// Per stage: its memory step.
    step_of: Vec<u32>,
    /// Per memory step: how many stages it has.
    step_size: Vec<u32>,
    /// Whether the safety witness may settle chunks out of order first. Not for a policy
    /// with strict chunk order (`inorder`), which only ever runs a lane's jobs in
    /// (chunk, stage) order: it needs the first unfinished chunk's next job admitted in
    /// every safe state, which only the plain chunk-order witness guarantees. Other
    /// policies get the dispatch fallback.
    settle: bool,
}

impl MemoryLedger {
    /// Nothing running; the KV cache and the shadow's weight rows allocated. `settle`:
    /// whether the safety witness may settle chunks out of order first (false for a
    /// policy with [`crate::policy::Policy::strict_chunk_order`]).
    pub fn new(plan: &PrefillPlan, settle: bool) -> MemoryLedger {
        let profile = plan.memory_profile().clone();
        let steps = plan.memory_step_count() as usize;
        let (mut cross, mut step_size) = (vec![false; steps], vec![0u32; steps]);
        let step_of: Vec<u32> = (0..plan.stage_count())
            .map(|s| plan.memory_step(s))
            .collect();
        for (stage, &step) in plan.stages.iter().zip(&step_of) {
            cross[step as usize] |= stage.dependency == StageDependency::CrossChunk;
            step_size[step as usize] += 1;
        }
        let live: Vec<u64> = (0..profile.columns())
            .map(|c| profile.resident_bytes(c))
            .collect();
        MemoryLedger {
            settle,
            cross,
            step_of,
            step_size,
            unconstrained: profile.unconstrained(),
            high_water: live.clone(),
            live,
            chunks: vec![ChunkState::default(); plan.chunks as usize],
            started: 0,
            first_unfinished: 0,
            profile,
        }
    }

    /// Back to the state [`Self::new`] gives for the same plan (nothing running, only the
    /// resident bytes live), keeping the profile: a long-lived world re-running one plan
    /// (a decode step) does not clone the profile again.
    pub fn restart(&mut self) {
        for (c, live) in self.live.iter_mut().enumerate() {
            *live = self.profile.resident_bytes(c);
        }
        self.high_water.clone_from(&self.live);
        self.chunks.fill(ChunkState::default());
        self.started = 0;
        self.first_unfinished = 0;
    }

    /// Whether the safety witness may settle chunks out of order (see [`Self::new`]).
    pub fn settles(&self) -> bool {
        self.settle
    }

    /// The profile the ledger follows.
    pub fn profile(&self) -> &MemoryProfile {
        &self.profile
    }

    /// Bytes live in each region now (KV cache included), then in the whole device.
    pub fn live(&self) -> &[u64] {
        &self.live
    }

    /// Whether budgets are large enough that memory never delays a job.
    pub fn unconstrained(&self) -> bool {
        self.unconstrained
    }

    /// Whether `key` may start now: its allocation fits now, and the state after it is
    /// safe (see the module doc).
    pub fn admits(&self, key: InstanceKey) -> bool {
        self.unconstrained || self.step_held(key) || self.admits_after(None, key)
    }

    /// Whether `key`'s memory step already holds its memory (the other stage of the step
    /// started): then `key` needs nothing more.
    fn step_held(&self, key: InstanceKey) -> bool {
        let state = self.chunks[key.chunk as usize];
        state.running() && self.step_of[key.stage as usize] == state.done
    }

    /// Whether `key` could still start if `first` (of another chunk) started before it.
    /// Dispatch uses it so a later chunk's job never takes the memory an earlier chunk's
    /// ready job needs (which would leave the later chunk's tensors waiting on the
    /// earlier chunk, and the earlier chunk waiting on memory).
    pub fn admits_after(&self, first: Option<InstanceKey>, key: InstanceKey) -> bool {
        if self.unconstrained {
            return true;
        }
        let mut started = self.started;
        let mut live = self.live.clone();
        let first = first.map(|f| (f, self.step_of[f.stage as usize]));
        if let Some((f, f_step)) = first {
            debug_assert_ne!(f.chunk, key.chunk);
            if f_step == 0 {
                if f.chunk != started {
                    return false;
                }
                started += 1;
            }
            if !self.step_held(f) {
                let p = self.profile.of(f.chunk);
                for (l, &a) in live.iter_mut().zip(p.row(&p.alloc, f_step)) {
                    *l += a;
                }
            }
        }
        let step = self.step_of[key.stage as usize];
        if step == 0 && key.chunk != started {
            return false;
        }
        if self.step_held(key) {
            return true;
        }
        let p = self.profile.of(key.chunk);
        let alloc = p.row(&p.alloc, step);
        let budgets = self.profile.budgets.iter().copied();
        if alloc
            .iter()
            .zip(&live)
            .zip(budgets)
            .any(|((&need, &live), budget)| need > 0 && live.saturating_add(need) > budget)
        {
            return false;
        }
        // Running jobs need nothing more and end on their own, so safety is judged on
        // the state once they have ended: every chunk settled, `first` and `key` run.
        let end = started.max(key.chunk + 1);
        let mut next: Vec<u32> = (self.first_unfinished..end)
            .map(|chunk| match first {
                _ if chunk == key.chunk => step + 1,
                Some((f, f_step)) if f.chunk == chunk => f_step + 1,
                _ => {
                    let s = self.chunks[chunk as usize];
                    s.done + u32::from(s.running())
                }
            })
            .collect();
        self.safe(&mut next)
    }

    /// Whether a state is safe: `next[i]` is the next memory step of chunk
    /// `first_unfinished + i` once running jobs have ended. The witness: first every
    /// chunk, in order, runs the stages that free at least what they take (and whose
    /// dependencies are met in this hypothetical); then chunks finish one after another
    /// in chunk order, each releasing what it held to those after it.
    fn safe(&self, next: &mut [u32]) -> bool {
        let columns = self.profile.columns();
        let mut free: Vec<i128> = (0..columns)
            .map(|c| {
                i128::from(self.profile.budgets[c]) - i128::from(self.profile.resident_bytes(c))
            })
            .collect();
        let chunk_of = |i: usize| self.first_unfinished + i as u32;
        for (i, &n) in next.iter().enumerate() {
            let p = self.profile.of(chunk_of(i));
            for (f, &held) in free.iter_mut().zip(p.row(&p.wait, n)) {
                *f -= i128::from(held);
            }
        }
        // Settle: stages that take no net memory, in chunk order (a cross-chunk stage
        // needs the earlier chunks past its previous stage).
        let mut earlier_done = u32::MAX;
        for (i, n) in next.iter_mut().enumerate().filter(|_| self.settle) {
            let p = self.profile.of(chunk_of(i));
            while *n < p.steps && (!self.cross[*n as usize] || earlier_done >= *n) {
                let (alloc, before, after) = (
                    p.row(&p.alloc, *n),
                    p.row(&p.wait, *n),
                    p.row(&p.wait, *n + 1),
                );
                let settles =
                    (0..columns).all(|c| i128::from(alloc[c]) <= free[c] && after[c] <= before[c]);
                if !settles {
                    break;
                }
                for c in 0..columns {
                    free[c] += i128::from(before[c] - after[c]);
                }
                *n += 1;
            }
            earlier_done = earlier_done.min(*n);
        }
        // Then chunks finish in order.
        next.iter().enumerate().all(|(i, &n)| {
            let p = self.profile.of(chunk_of(i));
            let (held, peak) = (p.row(&p.wait, n), p.row(&p.peak_from, n));
            (0..columns).all(|c| {
                let ok = i128::from(peak[c]) - i128::from(held[c]) <= free[c];
                free[c] += i128::from(held[c]);
                ok
            })
        })
    }

    /// Records that `key` started: its step's outputs and workspace are allocated, unless
    /// the other stage of the step already started.
    pub fn start(&mut self, key: InstanceKey) {
        let step = self.step_of[key.stage as usize];
        let state = self.chunks[key.chunk as usize];
        debug_assert_eq!(state.done, step, "a chunk's memory steps run in order");
        if !state.running() {
            let p = self.profile.of(key.chunk);
            for (r, &bytes) in p.row(&p.alloc, step).iter().enumerate() {
                self.live[r] += bytes;
                self.high_water[r] = self.high_water[r].max(self.live[r]);
            }
        }
        self.chunks[key.chunk as usize].started += 1;
        if step == 0 {
            self.started = self.started.max(key.chunk + 1);
        }
    }

    /// Undoes [`MemoryLedger::start`] for `key`, given up on its processor and to be
    /// started again elsewhere: what its step allocated is released unless another stage
    /// of the step is running.
    pub fn abandon(&mut self, key: InstanceKey) {
        let step = self.step_of[key.stage as usize];
        let state = &mut self.chunks[key.chunk as usize];
        debug_assert!(state.running(), "abandoning a stage that never started");
        state.started = state.started.saturating_sub(1);
        if !state.running() {
            let p = self.profile.of(key.chunk);
            for (r, &bytes) in p.row(&p.alloc, step).iter().enumerate() {
                self.live[r] -= bytes;
            }
        }
    }

    /// Records that `key` finished; when it was the last stage of its step, the step's
    /// workspace and the tensors it read last are freed.
    pub fn finish(&mut self, key: InstanceKey) {
        let step = self.step_of[key.stage as usize];
        let state = &mut self.chunks[key.chunk as usize];
        state.finished += 1;
        if state.finished < self.step_size[step as usize] {
            return;
        }
        *state = ChunkState {
            done: state.done + 1,
            started: 0,
            finished: 0,
        };
        let p = self.profile.of(key.chunk);
        for (r, &bytes) in p.row(&p.free, step).iter().enumerate() {
            self.live[r] -= bytes;
        }
        while self
            .chunks
            .get(self.first_unfinished as usize)
            .is_some_and(|s| s.done == self.profile.of(self.first_unfinished).steps)
        {
            self.first_unfinished += 1;
        }
    }
}
