//! hetsched: a scheduling core for on-device LLM prefill on heterogeneous processors.
//!
//! A prompt is cut into fixed-size chunks; each chunk runs through a chain of subgraphs
//! cut at processor boundaries; the scheduler systems of [`hetsched_systems`] decide, tick
//! by tick, which ready subgraph each idle processor runs (`balance`, our refinement of
//! seed 000's NPU-stall contribution heuristic, by default). This crate wires the parts: [`scene`] files,
//! the [`engine`] tick loop, queue [`backends`], [`timeline`] dumps and the [`report`];
//! model [`import`] is its own crate (`hetsched-import`), re-exported. An embedding
//! runtime needs only the [`prelude`].
//!
//! # Examples
//! Simulate the shipped default scene (Qwen1.5-1.8B on a Snapdragon 8 Gen 3) and check
//! the schedule against its lower bound:
//! ```
//! use std::sync::Arc;
//! use hetsched::{engine, report::RunReport, scene::Scene};
//!
//! let scene = Scene::default_scene();
//! let plan = Arc::new(scene.plan()?);
//! let run = engine::simulate(plan, scene.new_policy()?)?;
//! let report = RunReport::new(&scene.name, &run);
//! // 6 subgraphs per layer, plus 3 for each of the 14 outlier-shadow sites kept.
//! assert_eq!(report.subgraphs_per_chunk, 24 * 6 + 14 * 3);
//! assert!(report.makespan_ms >= report.lower_bound_ms);
//! assert!(report.shadow.is_some_and(|s| s.hidden_share > 0.9));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod budget;
pub mod compare;
pub mod outliers;
pub mod prelude;
pub mod sweep;

pub use hetsched_exec as exec;
pub use hetsched_import as import;
pub use hetsched_import::limits;
pub use hetsched_runtime::{
    adapt, backends, cancel, engine, fsutil, history, prediction, profiling, progress, report,
    request_report, request_trace, requests, scene, timeline, weight_reuse,
};
pub use hetsched_systems as systems;
