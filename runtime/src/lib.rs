//! The runtime core of hetsched, below real execution and the facade: the [`engine`] tick
//! loop (with its guard: no backend reaches the scheduler unchecked), the queue
//! [`backends`] contract and the simulated queues, [`scene`] files, the run [`report`],
//! [`progress`] reporting and atomic file writes ([`fsutil`]).
//!
//! Use it through the `hetsched` crate, which re-exports every module here under the
//! same name (`hetsched_runtime::engine`, `hetsched_runtime::scene`, ...).

pub mod adapt;
pub mod backends;
pub mod cancel;
pub mod decision;
pub mod engine;
pub mod fsutil;
pub mod history;
mod overlap;
pub mod prediction;
pub mod profiling;
pub mod progress;
pub mod report;
pub mod request_report;
pub mod request_trace;
pub mod request_world;
pub mod requests;
pub mod scene;
pub mod timeline;
pub mod weight_reuse;

pub use hetsched_limits as limits;
