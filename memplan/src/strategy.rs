//! Running the strategies: one ([`plan_with`]) or all, keeping the best
//! ([`plan_offsets`]), as much of them as a [`PlanEffort`] asks for.

use serde::{Deserialize, Serialize};

use super::align::aligned_sizes;
use super::bound::aligned_lower_bound;
use super::buffer::{Buffer, MemoryPlan, Placement, Strategy};
use super::error::MemoryError;
use super::order;
use super::place::Placer;
use super::sweep::place_in_start_order;

/// How many strategies a plan of a finished run tries: a scene's `[memory] plan_effort`.
///
/// The strategies other than the two sweeps place each buffer against an index of what
/// conflicts with it, about 5.5 us a buffer on a 2-core EPYC at 250 000 buffers and
/// growing with the count, while the sweeps stay near 0.6 us: at a million instances
/// they are most of what `simulate` spends. Where a region holds more buffers than
/// [`SWEEPS_ONLY_ABOVE`], the sweeps' plan (the lower of greedy by start and by end) is
/// what [`PlanEffort::Scaled`] keeps. On the shipped scenes' regions above it (prompt
/// 1024, chunk 1: 137 000-334 000 buffers; prompt 8192, chunk 16) that costs 0-1.1% of
/// the peak (docs/memory.md).
///
/// # Examples
/// ```
/// use hetsched_memplan::{PlanEffort, SWEEPS_ONLY_ABOVE, Strategy};
/// let all = PlanEffort::Scaled.strategies(SWEEPS_ONLY_ABOVE);
/// assert_eq!(all.len(), Strategy::ALL.len());
/// let sweeps = PlanEffort::Scaled.strategies(SWEEPS_ONLY_ABOVE + 1);
/// assert_eq!(sweeps, [Strategy::GreedyByStart, Strategy::GreedyByEnd]);
/// assert_eq!(PlanEffort::Exhaustive.strategies(1 << 30).len(), Strategy::ALL.len());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanEffort {
    /// Every strategy up to [`SWEEPS_ONLY_ABOVE`] buffers, the two sweeps above; a plan
    /// other than the sweeps' kept only where it beats theirs by [`SWEEPS_MARGIN`] parts
    /// of the bound ([`PlanEffort::keep_below`]).
    #[default]
    Scaled,
    /// Every strategy in [`Strategy::ALL`], at any size.
    Exhaustive,
}

/// The most buffers a region may hold for [`PlanEffort::Scaled`] to try every strategy.
pub const SWEEPS_ONLY_ABOVE: usize = 1 << 17;

/// The margin by which, under [`PlanEffort::Scaled`], a strategy other than the two
/// sweeps must beat their plan for its own to be kept: one part in this many of the
/// aligned lower bound (0.5%). The strategies other than the sweeps place against a
/// conflict index at two to three times the sweeps' cost a buffer, and at mid sizes
/// (3 000-50 000 instances) they were most of what `simulate` spent; with the margin,
/// one that cannot win by it gives up sooner (the last fraction of a peak is reached
/// late in a placement, where the small buffers go), and none runs where the sweeps'
/// plan is within the margin of the bound ([`PlanEffort::settled_by_sweeps`]: the
/// regions that hold the KV cache, whose activations are a sliver beside it). The plan
/// kept is never more than the margin above the one trying every strategy to the end
/// would keep (docs/memory.md).
pub const SWEEPS_MARGIN: u64 = 200;

impl PlanEffort {
    /// The strategies tried on a set of `buffers` buffers, in the order they run
    /// (greedy by start first: it never gives up, and its peak lets the others stop early).
    pub fn strategies(self, buffers: usize) -> Vec<Strategy> {
        run_order().filter(|&s| self.tries(s, buffers)).collect()
    }

    /// Whether `strategy` is tried on a set of `buffers` buffers.
    pub(super) fn tries(self, strategy: Strategy, buffers: usize) -> bool {
        let sweeps_only = self == PlanEffort::Scaled && buffers > SWEEPS_ONLY_ABOVE;
        !sweeps_only || strategy.is_sweep()
    }

    /// The peak below which a plan of a strategy other than the sweeps is kept, given
    /// the sweeps' best plan's peak and the set's aligned lower bound `floor`: under
    /// [`PlanEffort::Scaled`], [`SWEEPS_MARGIN`] parts of the bound below the sweeps'
    /// peak; `None` under [`PlanEffort::Exhaustive`] (any plan that beats the best).
    ///
    /// # Examples
    /// ```
    /// use hetsched_memplan::PlanEffort;
    /// assert_eq!(PlanEffort::Scaled.keep_below(1_100, 1_000), Some(1_095));
    /// assert_eq!(PlanEffort::Exhaustive.keep_below(1_100, 1_000), None);
    /// ```
    pub fn keep_below(self, sweeps_peak: u64, floor: u64) -> Option<u64> {
        (self == PlanEffort::Scaled).then(|| sweeps_peak.saturating_sub(floor / SWEEPS_MARGIN))
    }

    /// Whether no strategy but the sweeps can be kept ([`PlanEffort::keep_below`] is at
    /// or under the bound, which no plan is below), so none is run.
    ///
    /// # Examples
    /// ```
    /// use hetsched_memplan::PlanEffort;
    /// assert!(PlanEffort::Scaled.settled_by_sweeps(1_005, 1_000));
    /// assert!(!PlanEffort::Scaled.settled_by_sweeps(1_006, 1_000));
    /// assert!(!PlanEffort::Exhaustive.settled_by_sweeps(1_000, 1_000));
    /// ```
    pub fn settled_by_sweeps(self, sweeps_peak: u64, floor: u64) -> bool {
        self.keep_below(sweeps_peak, floor)
            .is_some_and(|below| below <= floor)
    }
}

/// Plans offsets with one strategy. Every offset is a multiple of `alignment`, and
/// sizes are rounded up to it when packed.
///
/// # Errors
/// [`MemoryError::BadAlignment`] unless `alignment` is a power of two;
/// [`MemoryError::EmptyLifetime`] for a buffer with `end <= start`;
/// [`MemoryError::Overflow`] when the aligned sizes add up past `u64::MAX`.
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, Strategy, check_plan, plan_with};
/// let buffers = [
///     Buffer { id: 0, bytes: 64, start: 0, end: 10 },
///     Buffer { id: 1, bytes: 64, start: 10, end: 20 },
/// ];
/// let plan = plan_with(&buffers, 16, Strategy::GreedyByStart).unwrap();
/// assert_eq!(plan.peak_bytes, 64); // disjoint lifetimes share offset 0
/// check_plan(&buffers, &plan, 16).unwrap();
/// ```
pub fn plan_with(
    buffers: &[Buffer],
    alignment: u64,
    strategy: Strategy,
) -> Result<MemoryPlan, MemoryError> {
    let sizes = aligned_sizes(buffers, alignment)?;
    let mut placer = Placer::new(buffers);
    Ok(run(&mut placer, buffers, &sizes, alignment, strategy, None)
        .expect("a plan without a limit is never given up"))
}

/// Plans offsets with every strategy in [`Strategy::ALL`] and keeps the plan with
/// the lowest peak (the first in that order on ties). Deterministic.
///
/// # Errors
/// As [`plan_with`].
///
/// # Examples
/// ```
/// use hetsched_memplan::{Buffer, Strategy, plan_offsets, plan_with};
/// let buffers: Vec<Buffer> = (0..50)
///     .map(|i| Buffer { id: i, bytes: 100 + 37 * u64::from(i % 7), start: u64::from(i), end: u64::from(i) + 5 })
///     .collect();
/// let best = plan_offsets(&buffers, 16).unwrap();
/// for s in Strategy::ALL {
///     assert!(best.peak_bytes <= plan_with(&buffers, 16, s).unwrap().peak_bytes);
/// }
/// assert!(plan_offsets(&buffers, 24).is_err());
/// ```
pub fn plan_offsets(buffers: &[Buffer], alignment: u64) -> Result<MemoryPlan, MemoryError> {
    let sizes = aligned_sizes(buffers, alignment)?;
    // No plan of aligned sizes is below this: once one reaches it, no strategy after
    // it in `ALL` can win (ties go to the earlier one).
    let floor = aligned_lower_bound(buffers, alignment)?;
    let mut placer = Placer::new(buffers);
    // Greedy by start goes first: its sweep is the cheapest, and its peak lets the
    // others give up early (`limit_against`).
    let mut best: Option<MemoryPlan> = None;
    for strategy in run_order() {
        let Some(give_up_at) = limit_against(best.as_ref(), strategy, floor) else {
            continue;
        };
        if let Some(plan) = run(
            &mut placer,
            buffers,
            &sizes,
            alignment,
            strategy,
            give_up_at,
        ) {
            best = Some(plan);
        }
    }
    Ok(best.expect("the first strategy never gives up"))
}

/// What `strategy` may still do against `best`, the best plan so far, of buffers
/// whose aligned lower bound is `floor`: `None` when it cannot win (the best meets the
/// bound and comes first in [`Strategy::ALL`]), else the peak at which to give it up:
/// the best's, or one byte more when `strategy` comes before the best in `ALL` (it
/// would win the tie). Both only skip plans that would be dropped, so the plan kept
/// is the first lowest in `ALL` order.
pub(super) fn limit_against(
    best: Option<&MemoryPlan>,
    strategy: Strategy,
    floor: u64,
) -> Option<Option<u64>> {
    match best {
        None => Some(None),
        Some(b) if b.peak_bytes <= floor && strategy > b.strategy => None,
        // (No peak is above `u64::MAX`: an earlier strategy at that best runs on.)
        Some(b) if strategy < b.strategy => Some(b.peak_bytes.checked_add(1)),
        Some(b) => Some(Some(b.peak_bytes)),
    }
}

/// The order [`plan_offsets`] runs the strategies in: greedy by start and by end (the
/// cheapest: sweeps), then greedy by size then start (the lowest peak of the shipped
/// scenes' CPU regions, so the rest give up sooner), then the others in
/// [`Strategy::ALL`] order.
pub(super) fn run_order() -> impl Iterator<Item = Strategy> {
    let first = [
        Strategy::GreedyByStart,
        Strategy::GreedyByEnd,
        Strategy::GreedyBySizeThenStart,
    ];
    first.into_iter().chain(
        Strategy::ALL
            .into_iter()
            .filter(move |s| !first.contains(s)),
    )
}

/// One strategy's plan, or `None` once its arena reaches `give_up_at` bytes, if given.
pub(super) fn run(
    placer: &mut Placer,
    buffers: &[Buffer],
    sizes: &[u64],
    alignment: u64,
    strategy: Strategy,
    give_up_at: Option<u64>,
) -> Option<MemoryPlan> {
    let order = match strategy {
        Strategy::GreedyBySize => order::by_size(buffers, sizes),
        Strategy::GreedyBySizeTimesLifetime => order::by_area(buffers, sizes),
        Strategy::GreedyByBreadth => order::by_breadth(buffers, sizes),
        Strategy::GreedyByStart => order::by_start(buffers, sizes),
        Strategy::GreedyBySizeThenStart => order::by_size_then_start(buffers, sizes),
        Strategy::GreedyByEnd => order::by_end(buffers, sizes),
    };
    let offsets = match strategy {
        // Latest end first is earliest start first on reversed time: `[start, end)`
        // becomes `[last - end, last - start)`, which intersects the same lifetimes.
        _ if strategy.is_sweep() => {
            let last = buffers.iter().map(|b| b.end).max().unwrap_or(0);
            let spans: Vec<(u64, u64)> = buffers
                .iter()
                .map(|b| match strategy {
                    Strategy::GreedyByEnd => (last - b.end, last - b.start),
                    _ => (b.start, b.end),
                })
                .collect();
            place_in_start_order(&spans, sizes, &order, give_up_at)?
        }
        _ => placer.place(sizes, alignment, &order, give_up_at)?,
    };
    let peak_bytes = offsets
        .iter()
        .zip(sizes)
        .map(|(o, s)| o + s)
        .max()
        .unwrap_or(0);
    Some(MemoryPlan {
        placements: buffers
            .iter()
            .zip(offsets)
            .map(|(b, offset)| Placement { id: b.id, offset })
            .collect(),
        peak_bytes,
        strategy,
        alignment,
    })
}
