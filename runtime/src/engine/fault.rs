//! The ways a backend can break its contract with the engine, each naming the instance and
//! lane (docs/robustness.md).

use thiserror::Error;

/// A backend broke its contract (docs/robustness.md).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendFault {
    /// A completion for an id outside the plan.
    #[error(
        "processor {processor} reported job {id}, which is not in the plan ({ids} ids): the backend must report the ids it was given"
    )]
    UnknownInstance {
        /// The reported id.
        id: u32,
        /// The reporting lane.
        processor: usize,
        /// Size of the plan's id space.
        ids: usize,
    },
    /// A completion on a lane the device does not have.
    #[error(
        "a completion of chunk {chunk} stage {stage} names processor {processor}, but the device has {lanes}: report the job's own `processor`"
    )]
    LaneOutOfRange {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reported lane.
        processor: usize,
        /// Lanes of the device.
        lanes: usize,
    },
    /// A completion for an instance never submitted.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage}, which was never dispatched: the backend reported a job it was not given"
    )]
    NotDispatched {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
    },
    /// A second completion for one instance.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage} a second time: a backend reports each job once"
    )]
    CompletedTwice {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
    },
    /// A completion on another lane than the one the job was dispatched to.
    #[error(
        "chunk {chunk} stage {stage} was dispatched to processor {dispatched} but reported by processor {processor}: a backend runs a job on `Job::processor`"
    )]
    WrongLane {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
        /// The lane it was dispatched to.
        dispatched: usize,
    },
    /// A completion that ends before it starts.
    #[error(
        "processor {processor} reported chunk {chunk} stage {stage} ending at {end_ns} ns, before its start at {start_ns} ns"
    )]
    TimeReversed {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The reporting lane.
        processor: usize,
        /// Reported start.
        start_ns: u64,
        /// Reported end.
        end_ns: u64,
    },
    /// `submit` or `wait` panicked.
    #[error("the backend panicked in `{call}`: {message}")]
    Panicked {
        /// `submit` or `wait`.
        call: &'static str,
        /// The panic's message.
        message: String,
    },
    /// Waits kept returning nothing while jobs were in flight.
    #[error(
        "{waits} waits in a row returned no completion with {in_flight} jobs in flight: the backend lost a job or its `wait` does not block"
    )]
    NoProgress {
        /// Consecutive empty waits.
        waits: u32,
        /// Jobs in flight.
        in_flight: usize,
    },
    /// A job ran past its deadline.
    #[error(
        "chunk {chunk} stage {stage} on processor {processor} has run {elapsed_ms} ms, past its deadline of {limit_ms} ms (modeled {estimated_ns} ns): the job is lost or hung"
    )]
    DeadlineExceeded {
        /// Chunk.
        chunk: u32,
        /// Stage.
        stage: u32,
        /// The lane running it.
        processor: usize,
        /// Modeled cost.
        estimated_ns: u64,
        /// Time since submission.
        elapsed_ms: u64,
        /// The allowance.
        limit_ms: u64,
    },
    /// A processor was given up (a job there ran past its deadline and was retried
    /// elsewhere), and work that only it may run is left.
    #[error(
        "processor {processor} was given up after chunk {chunk} stage {stage} ran past its deadline there; {waiting} subgraphs are left, waiting on work only it may run"
    )]
    LaneLost {
        /// Chunk of the overdue job.
        chunk: u32,
        /// Stage of the overdue job.
        stage: u32,
        /// The processor given up.
        processor: usize,
        /// Instances not done.
        waiting: usize,
    },
}
