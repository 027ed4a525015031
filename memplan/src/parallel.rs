//! [`plan_offsets`] for several independent buffer sets at once, their strategies
//! spread over threads.
//!
//! A set's strategies are independent placements; only the give-up limits tie them
//! (each runs against the best plan so far, [`limit_against`]). So the work is a list
//! of (set, strategy) tasks that free threads take in turn: first every set's greedy
//! by start (the cheap sweep whose plan gives the others their limits), then every
//! set's greedy by end (the other sweep), then the rest in [`run_order`], larger sets
//! first. A set's task waits for the one before it in that chain only (greedy by end
//! for its greedy by start, the rest for its greedy by end): a thread that finds the
//! next task waiting takes a later one that is ready (the sweeps of a small set done,
//! its strategies start while the large set's sweep still runs), and sleeps only when
//! every task left is waiting. A task reads its set's best plan when it starts; a plan
//! that completes is kept if it beats the best (lower peak, earlier in
//! [`Strategy::ALL`] on ties). A limit read from any plan already made only gives up a
//! strategy that would lose to that plan, so each set keeps the first lowest plan in
//! `ALL` order, whichever thread ran what when: [`plan_offsets`]'s plan.
//!
//! Under [`PlanEffort::Scaled`], the other strategies must beat the sweeps' plan by a
//! margin ([`PlanEffort::keep_below`]), and a set whose sweeps' plan is within it of the
//! lower bound runs none ([`PlanEffort::settled_by_sweeps`]). Both sweeps are done
//! before any other strategy of the set starts, so the margin is read from their plans
//! only, whatever else ran: the same plan on any number of threads.
//!
//! A thread that finds no task left frees the sets' idle conflict indexes (millions of
//! small allocations: a tenth of a second at a million instances) while the others
//! finish their last tasks, instead of one thread freeing them all at the end.
//!
//! This saves wall time where cores are free (one region's losing strategies run
//! beside another's), not CPU time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::align::aligned_sizes;
use super::bound::aligned_lower_bound;
use super::buffer::{Buffer, MemoryPlan, Strategy};
use super::error::MemoryError;
use super::place::Placer;
use super::strategy::{PlanEffort, limit_against, run, run_order};

/// One buffer set's inputs and what its tasks share.
struct SetPlan<'a> {
    buffers: &'a [Buffer],
    alignment: u64,
    sizes: Vec<u64>,
    /// The aligned lower bound.
    floor: u64,
    best: Mutex<Option<MemoryPlan>>,
    /// The lower peak of the two sweeps' plans (`u64::MAX` until one completes).
    sweeps_peak: AtomicU64,
    effort: PlanEffort,
    /// Indexes free for the next task (each task holds one while it runs).
    placers: Mutex<Vec<Placer>>,
}

impl SetPlan<'_> {
    /// Runs `strategy` against the best so far; keeps its plan if it beats it.
    fn run(&self, strategy: Strategy) {
        // (Read only by the other strategies, which start once both sweeps are done.)
        let sweeps_peak = self.sweeps_peak.load(Ordering::Acquire);
        if !strategy.is_sweep() && self.effort.settled_by_sweeps(sweeps_peak, self.floor) {
            return;
        }
        let best = self.best.lock().expect("no task panics holding it").clone();
        let Some(mut give_up_at) = limit_against(best.as_ref(), strategy, self.floor) else {
            return;
        };
        if !strategy.is_sweep()
            && let Some(below) = self.effort.keep_below(sweeps_peak, self.floor)
        {
            give_up_at = Some(give_up_at.map_or(below, |limit| limit.min(below)));
        }
        let placer = self
            .placers
            .lock()
            .expect("no task panics holding it")
            .pop();
        let mut placer = placer.unwrap_or_else(|| Placer::new(self.buffers));
        let plan = run(
            &mut placer,
            self.buffers,
            &self.sizes,
            self.alignment,
            strategy,
            give_up_at,
        );
        self.placers
            .lock()
            .expect("no task panics holding it")
            .push(placer);
        if let Some(plan) = plan {
            if strategy.is_sweep() {
                self.sweeps_peak
                    .fetch_min(plan.peak_bytes, Ordering::AcqRel);
            }
            let mut best = self.best.lock().expect("no task panics holding it");
            let beats =
                |b: &MemoryPlan| (plan.peak_bytes, plan.strategy) < (b.peak_bytes, b.strategy);
            if best.as_ref().is_none_or(beats) {
                *best = Some(plan);
            }
        }
    }
}

/// [`plan_offsets`] of every `(buffers, alignment)` in `sets`, in order, the
/// strategies of all of them spread over up to `threads` threads (at least one); each
/// set tries the strategies `effort` gives its size ([`PlanEffort::Exhaustive`]: every
/// one, as [`plan_offsets`]; [`PlanEffort::Scaled`] keeps another strategy's plan only
/// where it beats the sweeps' by [`PlanEffort::keep_below`]'s margin).
///
/// # Errors
/// Per set, as [`plan_offsets`].
///
/// [`plan_offsets`]: super::plan_offsets
pub fn plan_offsets_each(
    sets: &[(&[Buffer], u64)],
    threads: usize,
    effort: PlanEffort,
) -> Vec<Result<MemoryPlan, MemoryError>> {
    let prepared: Vec<Result<SetPlan, MemoryError>> = sets
        .iter()
        .map(|&(buffers, alignment)| {
            Ok(SetPlan {
                buffers,
                alignment,
                sizes: aligned_sizes(buffers, alignment)?,
                floor: aligned_lower_bound(buffers, alignment)?,
                best: Mutex::new(None),
                sweeps_peak: AtomicU64::new(u64::MAX),
                effort,
                placers: Mutex::new(Vec::new()),
            })
        })
        .collect();
    {
        let valid: Vec<(usize, &SetPlan)> = prepared
            .iter()
            .enumerate()
            .filter_map(|(k, p)| p.as_ref().ok().map(|p| (k, p)))
            .collect();
        // Larger sets first within a phase, so the longest tasks start soonest.
        let mut by_size = valid;
        by_size.sort_by_key(|(k, p)| (std::cmp::Reverse(p.buffers.len()), *k));
        // Every set's greedy by start, then every set's greedy by end, then the rest;
        // `after` is the index of the set's task before it in that chain.
        // (Every set tries both sweeps, so each of the two phases lists every set.)
        debug_assert!(run_order().take(2).all(Strategy::is_sweep));
        let sets = by_size.len();
        let mut tasks: Vec<Task> = Vec::new();
        for (phase, strategy) in run_order().enumerate() {
            let chained = phase.min(2);
            tasks.extend(
                by_size
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, set))| effort.tries(strategy, set.buffers.len()))
                    .map(|(k, &(_, set))| Task {
                        set,
                        strategy,
                        after: (chained > 0).then(|| (chained - 1) * sets + k),
                    }),
            );
        }
        run_tasks(&tasks, threads);
    }
    prepared
        .into_iter()
        .map(|p| {
            let p = p?;
            Ok(p.best
                .into_inner()
                .expect("no task panics holding it")
                .expect("greedy by start never gives up"))
        })
        .collect()
}

/// A set's strategy to run, after the task at index `after` (its set's sweep before it
/// in the chain) is done.
struct Task<'a> {
    set: &'a SetPlan<'a>,
    strategy: Strategy,
    after: Option<usize>,
}

/// Which tasks a thread has taken and which are done, shared by the threads.
struct Progress {
    taken: Vec<bool>,
    done: Vec<bool>,
}

/// Runs `tasks` on up to `threads` threads, each taking the first task not yet taken
/// whose `after` is done (waiting while none is), then freeing the idle indexes.
fn run_tasks(tasks: &[Task], threads: usize) {
    let progress = Mutex::new(Progress {
        taken: vec![false; tasks.len()],
        done: vec![false; tasks.len()],
    });
    let changed = Condvar::new();
    let work = || {
        while let Some(k) = next_task(tasks, &progress, &changed) {
            tasks[k].set.run(tasks[k].strategy);
            progress.lock().expect("no task panics holding it").done[k] = true;
            changed.notify_all();
        }
        // No task left to take: the indexes idle now are not needed again.
        for task in tasks {
            loop {
                // (The lock is released before the index is freed.)
                let placer = task
                    .set
                    .placers
                    .lock()
                    .expect("no task panics holding it")
                    .pop();
                let Some(placer) = placer else { break };
                drop(placer);
            }
        }
    };
    let helpers = threads.clamp(1, tasks.len().max(1)) - 1;
    std::thread::scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(work);
        }
        work();
    });
}

/// Takes the first task not yet taken whose `after` is done, waiting while every task
/// left waits; `None` once every task is taken.
fn next_task(tasks: &[Task], progress: &Mutex<Progress>, changed: &Condvar) -> Option<usize> {
    let mut state = progress.lock().expect("no task panics holding it");
    loop {
        let ready = (0..tasks.len())
            .find(|&k| !state.taken[k] && tasks[k].after.is_none_or(|first| state.done[first]));
        if let Some(k) = ready {
            state.taken[k] = true;
            return Some(k);
        }
        if state.taken.iter().all(|&t| t) {
            return None;
        }
        // A set's first task is taken and still running: its completion notifies.
        state = changed.wait(state).expect("no task panics holding it");
    }
}
