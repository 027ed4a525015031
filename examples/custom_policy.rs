//! Plugging a scheduling policy of your own into the scheduling core.
//!
//! A policy is a type that implements [`Policy`]: given an idle processor and the ready
//! subgraph instances it may run, it picks one (or none). It keeps its own state. Register
//! it by name beside the built-in ones, then hand a fresh instance to the engine; the
//! scheduler systems, the memory ledger and the timeline treat it like any built-in one.
//!
//! This one, `shortest`, runs the ready instance with the shortest modeled cost on the
//! picking processor (shortest processing time first), and is compared with `inorder`
//! and the default `balance` on the default scene.
//!
//! Run it: `cargo run --release --example custom_policy`

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use hetsched::prelude::*;

/// Shortest processing time first, on the picking processor; ties to the earliest
/// (chunk, stage). Counts how often it chose, to show that a policy keeps state.
#[derive(Default)]
struct Shortest {
    picks: u64,
}

impl Policy for Shortest {
    fn name(&self) -> &str {
        "shortest"
    }

    fn pick(&mut self, ctx: &PickContext<'_>, candidates: &BTreeSet<u32>) -> Option<u32> {
        let choice = pick_max_by(candidates, |id| {
            let key = ctx.plan.key(id as usize);
            // Largest score wins: negate the cost. A candidate this processor cannot run
            // (another's job it has no cost for) is skipped.
            ctx.plan.cost_on(key, ctx.lane).map(|ns| -(ns as i64))
        });
        self.picks += u64::from(choice.is_some());
        choice
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = PolicyRegistry::builtin();
    registry.register("shortest", "shortest processing time first", || {
        Box::new(Shortest::default())
    });
    let scene = Scene::load(Path::new("qwen1.5-1.8b-xiaomi14"))?;
    let plan = Arc::new(scene.plan()?);
    for name in ["inorder", "balance", "shortest"] {
        let run = simulate(plan.clone(), registry.create(name)?)?;
        let report = RunReport::new(&scene.name, &run);
        println!(
            "{name:>9}: {:8.2} ms, {:.3}x the lower bound, NPU bubbles {:.1}%",
            report.makespan_ms,
            report.ratio_to_lower_bound,
            100.0 * report.npu_bubble_rate.unwrap_or(0.0)
        );
    }
    Ok(())
}
