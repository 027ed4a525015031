//! The `hetsched` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use hetsched::engine;
use hetsched::report::RunReport;
use hetsched::scene::{DEFAULT_SCENE, Scene, shipped_scenes};
use hetsched::systems::Policy;
use hetsched::timeline::{Trace, chrome::to_chrome_json, svg::to_svg};

#[derive(Parser)]
#[command(
    name = "hetsched",
    version,
    about = "Scheduling core for on-device LLM prefill on CPU, GPU and NPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a prefill on a device profile with a virtual clock.
    Simulate(SimulateArgs),
    /// Compare every policy over scenes and prompt lengths.
    Compare(CompareArgs),
    /// List the scenes shipped inside the binary.
    Scenes,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Scene files or shipped scene names [default: every shipped phone scene].
    scenes: Vec<PathBuf>,
    /// Prompt lengths, comma-separated [default: each scene's own].
    #[arg(long, value_delimiter = ',')]
    prompt_lens: Vec<u32>,
    /// Policies, comma-separated [default: all].
    #[arg(long, value_delimiter = ',')]
    policies: Vec<Policy>,
    /// Print the rows as a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// Scene file, or the name of a shipped scene [default: qwen1.5-1.8b-xiaomi14].
    scene: Option<PathBuf>,
    /// Override the prompt length (tokens).
    #[arg(long)]
    prompt_len: Option<u32>,
    /// Override the chunk length (tokens).
    #[arg(long)]
    chunk_len: Option<u32>,
    /// Scheduling policy: stall (seed 000, Eq. 6), inorder, peer, heft, cpf, lookahead.
    #[arg(long)]
    policy: Option<Policy>,
    /// Write a Chrome trace JSON timeline (open in ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write an SVG timeline picture.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    json: bool,
    /// Memory budget per region: BYTES (e.g. 512MiB), REGION=BYTES[,..], or FACTORx (times
    /// the in-order policy's planned peak).
    #[arg(long, value_name = "BUDGET")]
    memory_budget: Option<hetsched::budget::BudgetSpec>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Compare(args) => compare(args),
        Command::Scenes => {
            for name in shipped_scenes() {
                println!("{name}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: SimulateArgs) -> Result<(), String> {
    let scene_path = args.scene.unwrap_or_else(|| PathBuf::from(DEFAULT_SCENE));
    let mut scene = Scene::load(&scene_path).map_err(|e| e.to_string())?;
    if let Some(n) = args.prompt_len {
        scene.workload.prompt_len = n;
    }
    if let Some(n) = args.chunk_len {
        scene.workload.chunk_len = n;
    }
    if let Some(p) = args.policy {
        scene.workload.policy = p;
    }
    if let Some(budget) = &args.memory_budget {
        hetsched::budget::apply_budget(&mut scene, budget).map_err(|e| e.to_string())?;
    }
    let plan = Arc::new(scene.plan().map_err(|e| e.to_string())?);
    let run = engine::simulate(plan).map_err(|e| e.to_string())?;
    let report = RunReport::new(&scene.name, &run);
    if args.trace.is_some() || args.svg.is_some() {
        let title = format!(
            "{} — {}, {} tokens, chunk {}",
            scene.name, report.policy, report.prompt_len, report.chunk_len
        );
        let trace = Trace::new(&title, &run);
        if let Some(path) = &args.trace {
            write(path, &to_chrome_json(&trace))?;
        }
        if let Some(path) = &args.svg {
            write(path, &to_svg(&trace))?;
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report always serialises")
        );
    } else {
        print!("{}", report.summary());
    }
    Ok(())
}

fn compare(args: CompareArgs) -> Result<(), String> {
    let names: Vec<PathBuf> = if args.scenes.is_empty() {
        shipped_scenes()
            .into_iter()
            .filter(|n| !n.contains("desktop"))
            .map(PathBuf::from)
            .collect()
    } else {
        args.scenes
    };
    let scenes = names
        .iter()
        .map(|p| Scene::load(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let policies = if args.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policies
    };
    let rows = hetsched::compare::compare(&scenes, &args.prompt_lens, &policies)
        .map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("rows always serialise")
        );
    } else {
        print!("{}", hetsched::compare::table(&rows));
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
