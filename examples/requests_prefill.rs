//! The agent burst's prefills, simulated together on every shipped phone scene: a
//! 4096-token background prefill, and an interactive 64-token prompt arriving 100 ms in.
//! Prints, per scene and request policy, each request's time to first token beside the
//! same prefill alone (simulated outputs).
//!
//! ```sh
//! cargo run --release --example requests_prefill
//! ```

use hetsched::requests::{RequestSpec, simulate_prefills};
use hetsched::scene::{Scene, shipped_scenes};
use hetsched::systems::{Priority, RequestId, SloTargets};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let burst = [
        RequestSpec {
            id: RequestId(0),
            priority: Priority::BACKGROUND,
            targets: SloTargets::default(),
            arrival_ns: 0,
            prompt_len: 4096,
            max_tokens: 1,
            samples: 1,
        },
        RequestSpec {
            id: RequestId(1),
            priority: Priority::INTERACTIVE,
            targets: SloTargets::default(),
            arrival_ns: 100_000_000,
            prompt_len: 64,
            max_tokens: 1,
            samples: 1,
        },
    ];
    println!(
        "scene                        policy    interactive ttft / alone (ms)   background prefill / alone (ms)"
    );
    for name in shipped_scenes() {
        let scene = Scene::load(std::path::Path::new(name))?;
        for policy in ["fcfs", "priority", "slack"] {
            let out = simulate_prefills(&scene, &burst, policy)?;
            let ms = |ns: u64| ns as f64 / 1e6;
            let (Some(bg), Some(fg)) = (out[0].served, out[1].served) else {
                return Err("no KV budget: every request is served".into());
            };
            println!(
                "{name:28} {policy:9} {:8.1} / {:7.1} = {:5.2}x        {:8.1} / {:8.1} = {:5.3}x",
                ms(fg.ttft_ns),
                ms(fg.alone_ttft_ns),
                fg.ttft_ns as f64 / fg.alone_ttft_ns as f64,
                ms(bg.ttft_ns),
                ms(bg.alone_ttft_ns),
                bg.ttft_ns as f64 / bg.alone_ttft_ns as f64,
            );
        }
    }
    Ok(())
}
