//! `hetsched bench-memory`: this machine's streaming-read bandwidth, the limit of decode
//! speed (a decode step reads every weight once), at each thread count asked for.

use hetsched::exec::generate::bandwidth::{ReadBandwidth, measure_read_bandwidth, probe_bytes};

use crate::CliError;
use crate::output::print_json_or;

/// `hetsched bench-memory`.
#[derive(clap::Args)]
pub struct BenchMemoryArgs {
    /// Thread counts to measure, each reading its own part of the buffer.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Buffer size in MiB (far larger than the last-level cache, so passes read memory);
    /// default: 4x the largest cache, 256 to 2048.
    #[arg(long)]
    mib: Option<usize>,
    /// Timed passes per thread count (the median and the fastest are reported).
    #[arg(long, default_value_t = 7)]
    passes: usize,
    /// Print one JSON array instead of the table.
    #[arg(long)]
    json: bool,
}

/// Measures and prints the bandwidth at each thread count.
pub fn bench_memory(args: BenchMemoryArgs) -> Result<(), CliError> {
    let mib = args.mib.unwrap_or(probe_bytes() >> 20);
    let bytes = mib.saturating_mul(1 << 20);
    let rows = args
        .threads
        .iter()
        .map(|&t| measure_read_bandwidth(t, bytes, args.passes))
        .collect::<Result<Vec<ReadBandwidth>, _>>()?;
    print_json_or(args.json, &rows, || {
        let mut text = format!(
            "streaming read of {} MiB, {} passes (measured)\nthreads  median GB/s  best GB/s\n",
            mib, args.passes
        );
        for r in &rows {
            text += &format!(
                "{:>7}  {:>11.2}  {:>9.2}\n",
                r.threads, r.median_gb_s, r.best_gb_s
            );
        }
        text
    });
    Ok(())
}
