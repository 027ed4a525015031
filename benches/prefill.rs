//! Real prefill speed: SmolLM2-135M on a 512-token prompt, through the scheduler and the
//! thread queues, in tokens per second ("elem/s" below). The W8A8 path runs the INT8
//! linears as the emulated NPU (w8a8-shadow adds the float outlier shadow); the f32 path
//! is the accuracy reference. `cold_row_smollm2` times one cold shadow row: a column of a
//! linear read from the memory-mapped GGUF file (what a shadow miss costs).
//!
//! Needs the model (`scripts/fetch-model.sh`); without it the bench says so and skips.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::{ColumnSource, GgufFile, GgufTokenizer, LayerTensor, TEST_MODEL_PATH};

const PROMPT_TOKENS: usize = 512;

/// A 512-token prompt from a text every Debian machine has (cycled if short).
fn prompt(tokenizer: &GgufTokenizer) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| "The quick brown fox jumps over the lazy dog. ".repeat(200));
    let ids = tokenizer.encode(&text).expect("the text tokenizes");
    ids.iter().copied().cycle().take(PROMPT_TOKENS).collect()
}

fn bench(c: &mut Criterion) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    if !path.is_file() {
        eprintln!(
            "skipping prefill bench: {} is missing (run scripts/fetch-model.sh)",
            path.display()
        );
        return;
    }
    let file = GgufFile::open(&path).expect("the test model opens");
    let tokens = prompt(&GgufTokenizer::from_gguf(&file).expect("tokenizer"));
    let mut group = c.benchmark_group("prefill_smollm2_512");
    group.sample_size(10);
    group.throughput(Throughput::Elements(PROMPT_TOKENS as u64));
    for precision in [
        LinearPrecision::W8a8,
        LinearPrecision::W8a8Shadow,
        LinearPrecision::F32,
        LinearPrecision::W4a8,
    ] {
        let model = Arc::new(ExecModel::load(&file, precision).expect("the model loads"));
        let runs: &[(u32, usize, &str)] = match precision {
            LinearPrecision::W8a8 => &[
                (128, 2, "stall"),
                (256, 2, "stall"),
                (128, 2, "inorder"),
                (128, 1, "stall"),
            ],
            _ => &[(128, 2, "stall")],
        };
        for &(chunk_len, threads, policy) in runs {
            let options = PrefillOptions {
                chunk_len,
                policy: policy.to_string(),
                threads,
                ..PrefillOptions::default()
            };
            let id = format!(
                "{} chunk {chunk_len} {threads} threads {}",
                precision.as_str(),
                policy
            );
            group.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| prefill(model.clone(), &tokens, &options).expect("prefill runs"))
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("cold_row_smollm2");
    for which in [LayerTensor::Down, LayerTensor::Up] {
        let mut channel = 0;
        group.bench_function(BenchmarkId::from_parameter(format!("{which:?}")), |b| {
            b.iter(|| {
                // A different channel each time, as misses are.
                channel = (channel + 7) % 576;
                file.layer_column(15, which, channel)
                    .expect("the column reads")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
