//! How long work reports how far it got: a small trait the library calls and a front end
//! draws (the CLI adapts it to indicatif bars on stderr), so the library names no
//! terminal crate.

/// Receives the progress of one piece of work: its length in steps, then steps done.
///
/// Every method has a default that does nothing, so [`Silent`] (and a test's own
/// counter) implement only what they need.
pub trait Progress {
    /// The work has `total` steps (called again when the total becomes known or grows).
    fn set_len(&mut self, total: u64) {
        let _ = total;
    }
    /// `steps` more steps are done.
    fn inc(&mut self, steps: u64) {
        let _ = steps;
    }
    /// What the work is doing now (e.g. the setting being simulated).
    fn set_message(&mut self, message: &str) {
        let _ = message;
    }
    /// The work is over; a drawn bar may be cleared.
    fn finish(&mut self) {}
}

/// Progress that nobody watches.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {}
