//! [`plan_offsets`] for several independent buffer sets at once, their strategies
//! spread over threads.
//!
//! A set's strategies are independent placements; only the give-up limits tie them
//! (each runs against the best plan so far, [`limit_against`]). So the work is a list
//! of (set, strategy) tasks that free threads take in turn: first every set's greedy
//! by start (the cheap sweep whose plan gives the others their limits), then the rest
//! in [`run_order`], larger sets first. A task reads its set's best plan when it
//! starts; a plan that completes is kept if it beats the best (lower peak, earlier in
//! [`Strategy::ALL`] on ties). A limit read from any plan already made only gives up a
//! strategy that would lose to that plan, so each set keeps the first lowest plan in
//! `ALL` order, whichever thread ran what when: [`plan_offsets`]'s plan.
//!
//! This saves wall time where cores are free (one region's losing strategies run
//! beside another's), not CPU time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::align::aligned_sizes;
use super::bound::aligned_lower_bound;
use super::buffer::{Buffer, MemoryPlan};
use super::error::MemoryError;
use super::place::Placer;
use super::strategy::{Strategy, limit_against, run, run_order};

/// One buffer set's inputs and what its tasks share.
struct SetPlan<'a> {
    buffers: &'a [Buffer],
    alignment: u64,
    sizes: Vec<u64>,
    /// The aligned lower bound.
    floor: u64,
    best: Mutex<Option<MemoryPlan>>,
    /// Indexes free for the next task (each task holds one while it runs).
    placers: Mutex<Vec<Placer>>,
}

impl SetPlan<'_> {
    /// Runs `strategy` against the best so far; keeps its plan if it beats it.
    fn run(&self, strategy: Strategy) {
        let best = self.best.lock().expect("no task panics holding it").clone();
        let Some(give_up_at) = limit_against(best.as_ref(), strategy, self.floor) else {
            return;
        };
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
/// strategies of all of them spread over up to `threads` threads (at least one).
///
/// # Errors
/// Per set, as [`plan_offsets`].
///
/// [`plan_offsets`]: super::plan_offsets
pub fn plan_offsets_each(
    sets: &[(&[Buffer], u64)],
    threads: usize,
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
        let mut strategies = run_order();
        let first = strategies.next().expect("there are strategies");
        let rest: Vec<Strategy> = strategies.collect();
        let first_phase: Vec<(&SetPlan, Strategy)> =
            by_size.iter().map(|&(_, p)| (p, first)).collect();
        let second_phase: Vec<(&SetPlan, Strategy)> = rest
            .iter()
            .flat_map(|&s| by_size.iter().map(move |&(_, p)| (p, s)))
            .collect();
        run_tasks(&first_phase, threads);
        run_tasks(&second_phase, threads);
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

/// Runs `tasks` on up to `threads` threads, each taking the next task not yet taken.
fn run_tasks(tasks: &[(&SetPlan, Strategy)], threads: usize) {
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(&(set, strategy)) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) {
            set.run(strategy);
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
