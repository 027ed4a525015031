//! The strategies, and running them: one ([`plan_with`]) or all, keeping the best
//! ([`plan_offsets`]).

use serde::{Deserialize, Serialize};

use super::align::aligned_sizes;
use super::bound::aligned_lower_bound;
use super::buffer::{Buffer, MemoryPlan, Placement};
use super::error::MemoryError;
use super::order;
use super::place::Placer;

/// An offset-assignment strategy: an order in which buffers are placed, each into
/// the smallest address gap among already placed buffers whose lifetimes intersect
/// its own (best fit), or above them all when no gap holds it.
///
/// # Examples
/// ```
/// use hetsched_systems::memory::Strategy;
/// assert_eq!(Strategy::ALL[0], Strategy::GreedyBySize);
/// assert_eq!(Strategy::GreedyByStart.name(), "greedy-by-start");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Largest aligned size first (ties: longer lifetime, then id): TFLite's
    /// greedy by size.
    GreedyBySize,
    /// Largest `size x lifetime` first (ties: larger, then id).
    GreedyBySizeTimesLifetime,
    /// TFLite's greedy by breadth: time steps with the most live bytes first, within
    /// a step its buffers largest first.
    GreedyByBreadth,
    /// Earliest start first (ties: larger, then id).
    GreedyByStart,
    /// Largest aligned size first, ties by earliest start (then larger lifetime, id):
    /// equal-size tensors of successive chunks stack in time order, which packs the
    /// many same-size activations of a chunked prefill tighter than the lifetime
    /// tie-break (gemma-2b at chunk 128: 1.034x the bound instead of 1.063x).
    GreedyBySizeThenStart,
}

impl Strategy {
    /// Every strategy, in the order [`plan_offsets`] tries them (and breaks ties).
    pub const ALL: [Strategy; 5] = [
        Strategy::GreedyBySize,
        Strategy::GreedyBySizeTimesLifetime,
        Strategy::GreedyByBreadth,
        Strategy::GreedyByStart,
        Strategy::GreedyBySizeThenStart,
    ];

    /// A short kebab-case name, as in serialized form.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::GreedyBySize => "greedy-by-size",
            Strategy::GreedyBySizeTimesLifetime => "greedy-by-size-times-lifetime",
            Strategy::GreedyByBreadth => "greedy-by-breadth",
            Strategy::GreedyByStart => "greedy-by-start",
            Strategy::GreedyBySizeThenStart => "greedy-by-size-then-start",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
/// use hetsched_systems::memory::{Buffer, Strategy, check_plan, plan_with};
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
/// use hetsched_systems::memory::{Buffer, Strategy, plan_offsets, plan_with};
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
    // No plan of aligned sizes is below this: once one reaches it, no later strategy
    // can win (ties go to the earlier one), and a strategy is given up as soon as its
    // arena reaches the best peak so far. Both only skip plans that would be dropped.
    let floor = aligned_lower_bound(buffers, alignment)?;
    let mut placer = Placer::new(buffers);
    let mut best: Option<MemoryPlan> = None;
    for strategy in Strategy::ALL {
        let give_up_at = best.as_ref().map(|b| b.peak_bytes);
        if give_up_at.is_some_and(|peak| peak <= floor) {
            break;
        }
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

/// One strategy's plan, or `None` once its arena reaches `give_up_at` bytes, if given.
fn run(
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
    };
    let offsets = placer.place(sizes, &order, give_up_at)?;
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
