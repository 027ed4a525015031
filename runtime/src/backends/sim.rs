//! Simulated queues: each job takes exactly its modeled duration on a virtual clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hetsched_systems::resources::{Completion, Job};

use super::{Backend, BackendError};

/// A virtual-clock backend. Jobs start when dispatched and end `estimated_ns` later;
/// [`Backend::wait`] advances the clock to the earliest end.
#[derive(Debug, Default)]
pub struct SimBackend {
    /// (end, processor, id, start); min-heap through `Reverse`. The processor breaks ties
    /// so equal end times complete in a fixed order.
    running: BinaryHeap<Reverse<(u64, usize, u32, u64)>>,
}

impl Backend for SimBackend {
    fn submit(&mut self, job: Job) -> Result<(), BackendError> {
        let end = job.dispatched_ns + job.estimated_ns;
        self.running
            .push(Reverse((end, job.processor, job.id, job.dispatched_ns)));
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.running.len()
    }

    fn wait(&mut self) -> Result<(u64, Vec<Completion>), BackendError> {
        let Some(&Reverse((now, ..))) = self.running.peek() else {
            return Ok((0, Vec::new()));
        };
        let mut done = Vec::new();
        while let Some(&Reverse((end, processor, id, start))) = self.running.peek() {
            if end != now {
                break;
            }
            self.running.pop();
            done.push(Completion {
                id,
                processor,
                start_ns: start,
                end_ns: end,
            });
        }
        Ok((now, done))
    }
}
