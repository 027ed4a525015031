//! The `hetsched` command line: parses arguments, runs one command, prints its result
//! and maps errors to the exit code. The work itself is the `hetsched` library's; each
//! module here holds one family of commands (their arguments and the glue).

mod bench_memory;
mod choices;
mod error;
mod eval;
mod generate;
mod gpu_env;
mod interrupt;
mod model;
mod offline;
mod outliers;
mod output;
mod profile;
mod progress;
mod real;
mod real_requests;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use error::CliError;

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
    Simulate(offline::SimulateArgs),
    /// Prefill a real model (GGUF) on this machine's queues and print the next token.
    Run(real::RunArgs),
    /// Prefill a prompt on this machine's queues, then generate text, streamed.
    Generate(generate::GenerateArgs),
    /// Perplexity of a text, and KL / top-1 agreement of a precision against f32.
    Eval(eval::EvalArgs),
    /// Record activation ranges and outliers over a corpus; decide which layers keep the
    /// outlier shadow; write the calibration file that w8a8-shadow runs follow.
    Calibrate(outliers::CalibrateArgs),
    /// Outlier statistics of a calibration file (seed 000 Figs 10-11): table, JSON, SVG.
    Outliers(outliers::OutliersArgs),
    /// Compare every policy over scenes and prompt lengths.
    Compare(offline::CompareArgs),
    /// Sweep chunk length x policy (x prompt length) on one scene: CSV and an SVG plot.
    Sweep(offline::SweepArgs),
    /// List the scenes shipped inside the binary.
    Scenes(offline::ScenesArgs),
    /// Measure every stage kind of a real model on this machine and write a measured
    /// device profile (fitted cost per stage kind and processor) with its raw samples.
    Profile(profile::ProfileArgs),
    /// Measure this machine's streaming-read memory bandwidth (the decode speed limit).
    BenchMemory(bench_memory::BenchMemoryArgs),
    /// Serve the model over HTTP: OpenAI-compatible chat completions and completions,
    /// streamed as server-sent events, with /health and Prometheus /metrics.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => offline::simulate(args),
        Command::Run(args) => real::run(args),
        Command::Generate(args) => generate::generate(args),
        Command::Eval(args) => eval::eval(args),
        Command::Calibrate(args) => outliers::calibrate(args),
        Command::Outliers(args) => outliers::outliers(args),
        Command::Compare(args) => offline::compare(args),
        Command::Sweep(args) => offline::sweep(args),
        Command::Scenes(args) => offline::scenes(args),
        Command::Profile(args) => profile::profile(args),
        Command::BenchMemory(args) => bench_memory::bench_memory(args),
        Command::Serve(args) => serve::serve(args),
    };
    let result = result.and_then(|()| output::take_stdout_error());
    match result {
        Ok(()) if interrupt::interrupted() => ExitCode::from(interrupt::INTERRUPTED_STATUS),
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`| head`): nothing to say, and no one to say it to.
        Err(CliError::Stdout { error }) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(output::BROKEN_PIPE_STATUS)
        }
        Err(error) if interrupt::interrupted() => {
            eprintln!("interrupted (Ctrl-C): {error}");
            ExitCode::from(interrupt::INTERRUPTED_STATUS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
