//! What an embedder tells the engine about its backend's timing: the per-job deadline and
//! whether a run may be cancelled.

use std::time::Duration;

/// How much the engine trusts its backend's timing, and whether its caller may stop it.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// When a job has run too long, or `None` for never (simulation: virtual time).
    pub deadline: Option<Deadline>,
    /// Consecutive [`Backend::wait`] calls that may return no completion while jobs are
    /// in flight before the run fails with [`BackendFault::NoProgress`].
    ///
    /// [`Backend::wait`]: crate::backends::Backend::wait
    /// [`BackendFault::NoProgress`]: super::BackendFault::NoProgress
    pub max_empty_waits: u32,
    /// When set, the run stops at the next tick: jobs in flight are waited for (their
    /// slices recorded), no new job is submitted, and the run fails with
    /// [`EngineError::Cancelled`](super::EngineError::Cancelled).
    pub cancel: Option<crate::cancel::CancelFlag>,
}

impl Default for EngineOptions {
    /// No deadline, 1024 empty waits: what `engine::run` and `engine::simulate` use.
    fn default() -> Self {
        Self {
            deadline: None,
            max_empty_waits: 1024,
            cancel: None,
        }
    }
}

impl EngineOptions {
    /// Options for real queues: the default [`Deadline`].
    pub fn real_queues() -> Self {
        Self {
            deadline: Some(Deadline::default()),
            ..Self::default()
        }
    }
}

/// A job's wall-clock deadline: `estimated × factor + floor` after it was submitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadline {
    /// Multiple of the job's modeled cost it may take.
    pub factor: f64,
    /// Time every job may take whatever its estimate (cost models of a scene can be off
    /// by orders of magnitude on another host, and debug builds are slow).
    pub floor: Duration,
    /// Whether an overdue job is retried on another processor it may run on, when the
    /// policy chooses placement and the backend lets go of it ([`Backend::abandon`]);
    /// its processor is then given up for the rest of the run. Otherwise, or when no
    /// other processor may take it, the run fails with
    /// [`BackendFault::DeadlineExceeded`](super::BackendFault::DeadlineExceeded).
    ///
    /// [`Backend::abandon`]: crate::backends::Backend::abandon
    pub retry: bool,
}

impl Default for Deadline {
    /// 100 × the estimate plus 60 s: generous enough for a debug build on a busy host,
    /// short enough that a lost job does not block a run forever. Retry where allowed.
    fn default() -> Self {
        Self {
            factor: 100.0,
            floor: Duration::from_secs(60),
            retry: true,
        }
    }
}

impl Deadline {
    /// How long a job with a modeled cost of `estimated_ns` may run.
    pub fn allowance(&self, estimated_ns: u64) -> Duration {
        let scaled = estimated_ns as f64 * self.factor.max(0.0);
        // A NaN factor or an overflowing product saturates: no deadline beyond the floor
        // is better than a panic in Duration::from_secs_f64.
        let scaled = if scaled.is_finite() && scaled < 1e18 {
            Duration::from_nanos(scaled as u64)
        } else {
            Duration::from_secs(u32::MAX as u64)
        };
        scaled.saturating_add(self.floor)
    }
}
