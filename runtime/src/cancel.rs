//! Cooperative cancellation: a flag that a caller sets (a Ctrl-C handler, a server
//! whose client went away) and long-running loops check at their safe points (the
//! engine between ticks, so a prefill stops at the next subgraph boundary).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A shared cancellation flag; clones share one flag.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag not yet set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every holder of this flag to stop at its next safe point.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`cancel`](Self::cancel) was called (or the shared flag set).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The underlying flag, for a signal handler that sets it
    /// (`signal_hook::flag::register`).
    pub fn shared(&self) -> &Arc<AtomicBool> {
        &self.0
    }
}

/// Two flags are equal when they are one shared flag.
impl PartialEq for CancelFlag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_flag() {
        let flag = CancelFlag::new();
        let clone = flag.clone();
        assert!(!clone.is_cancelled());
        flag.cancel();
        assert!(clone.is_cancelled());
        assert_eq!(flag, clone);
        assert_ne!(flag, CancelFlag::new());
    }
}
