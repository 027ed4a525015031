//! With the `gpu` feature: the family rows beyond llama on the GPU lanes. Tiny synthetic
//! Gemma 3 and Qwen2 files (random weights, written by the project's GGUF writer): the
//! resident GPU prefill (`GpuUse::Resident`) and the float lane (`GpuUse::FloatLane`) give
//! the CPU f32 path's logits, and resident greedy decoding its tokens and logits. The
//! Gemma file has six layers (five local, one global), a sliding window of 8 and prompts
//! longer than it, so the window, the local RoPE base, QK-norm, the post-norms, GELU and
//! the embedding scale all move the logits.
//!
//! `HETSCHED_REQUIRE_GPU=1 cargo test -p hetsched --features gpu --test gpu_family`.
//! Without a Vulkan device the tests say they skipped, unless `HETSCHED_REQUIRE_GPU=1`.
//! The real Gemma 3 270M check is ignored (needs `scripts/fetch-gemma3.sh`):
//! `cargo test --release -p hetsched --features gpu --test gpu_family -- --ignored`.
#![cfg(feature = "gpu")]

use std::path::PathBuf;
use std::sync::Arc;

use hetsched::exec::generate::{DecodePath, Session, argmax};
use hetsched::exec::{ExecModel, GpuUse, GpuWeights, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::{GgufFile, GgufTokenizer};
use hetsched_kernels::PackedF32Weights;

mod compare;
mod gpu_common;
mod tiny_family;
use compare::max_relative_diff;
use gpu_common::{greedy_steps_agree, unless_no_device};
use tiny_family::{Sizes, tiny_family_bytes};

/// GPU float kernels (f32, other summation orders) against the CPU path, relative to the
/// largest logit: the llama tests' tolerance (tests/gpu_prefill.rs).
const LOGIT_TOL: f32 = 1e-3;

const H: usize = 32;
const WINDOW: u32 = 8;
const VOCAB: usize = 64;

/// A 20-token prompt: past the window of 8 more than twice.
const PROMPT: [u32; 20] = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3];

/// A model of row `arch`: `layers` blocks of hidden 32 (2 query heads of 16, 1 KV head),
/// with every tensor its row needs, loaded f32.
fn tiny(arch: &str, layers: usize) -> Arc<ExecModel> {
    let sizes = Sizes {
        hidden: H,
        ffn: 48,
        vocab: VOCAB,
        window: WINDOW,
    };
    let file = GgufFile::from_bytes(tiny_family_bytes(arch, layers, sizes, |_| {})).unwrap();
    Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap())
}

fn options(chunk_len: usize, gpu: GpuUse) -> PrefillOptions {
    PrefillOptions {
        chunk_len: chunk_len as u32,
        threads: 2,
        all_logits: true,
        gpu,
        gpu_weights: GpuWeights::F32,
        ..PrefillOptions::default()
    }
}

/// In chunks of 5 (the attention of a few rows runs the decode kernel), 12 and 20 (the
/// prefill kernel), on both GPU lanes, every row of the last chunk's logits.
#[test]
fn gemma3_and_qwen2_prefill_on_the_gpu_lanes_like_the_cpu_path() {
    for (arch, layers) in [("gemma3", 6), ("qwen2", 2)] {
        let model = tiny(arch, layers);
        for chunk in [5, 12, 20] {
            let cpu = prefill(model.clone(), &PROMPT, &options(chunk, GpuUse::Off)).unwrap();
            for lane in [GpuUse::Resident, GpuUse::FloatLane] {
                let Some(gpu) =
                    unless_no_device(prefill(model.clone(), &PROMPT, &options(chunk, lane)))
                else {
                    return;
                };
                let diff = max_relative_diff(&gpu.logits, &cpu.logits);
                println!("{arch} {lane:?} in chunks of {chunk}: max relative diff {diff:.2e}");
                assert!(
                    diff <= LOGIT_TOL,
                    "{arch} {lane:?} chunks of {chunk}: {diff}"
                );
            }
        }
    }
}

/// Resident greedy decoding from a 12-token prompt for 10 steps (positions up to 21,
/// each step's keys cut by the window): the CPU f32 path's tokens, and logits within
/// the tolerance at every step.
#[test]
fn gemma3_resident_decode_steps_like_the_cpu_path() {
    let model = tiny("gemma3", 6);
    let session = |gpu, path| Session::new(model.clone(), options(5, gpu), path);
    let Some(mut gpu) = unless_no_device(session(GpuUse::Resident, DecodePath::Scheduled)) else {
        return;
    };
    let mut cpu = session(GpuUse::Off, DecodePath::Direct).unwrap();
    let prompt = &PROMPT[..12];
    for s in [&mut gpu, &mut cpu] {
        s.reserve(prompt.len() + 10).unwrap();
        s.prefill(prompt).unwrap();
    }
    let worst = greedy_steps_agree(&mut gpu, &mut cpu, 10, LOGIT_TOL);
    println!("gemma3 resident decode: worst step's relative diff {worst:.2e}");
}

/// Vocabulary rows the real model keeps for the GPU check: lavapipe binds at most 128 MiB
/// per storage buffer, and Gemma 3's f32 head of 262144 x 640 is 640 MiB (an H100 binds
/// 4 GiB). 49152 rows are 120 MiB.
const REAL_VOCAB_ROWS: usize = 49_152;

/// The real model's window for the GPU check (the file's is 512): the 34-token prompt
/// passes it in every chunk but the first.
const REAL_WINDOW: usize = 16;

/// Gemma 3 270M (Q4_K_M, loaded f32), its head and embeddings cut to
/// [`REAL_VOCAB_ROWS`] tokens (the prompt's and the first ids) and its window to
/// [`REAL_WINDOW`] (every layer's weights as in the file): the resident GPU prefill's
/// last-token logits against the CPU f32 path's, in chunks of 16, through every family
/// step, both RoPE bases and the window.
///
/// `scripts/fetch-gemma3.sh`, then
/// `HETSCHED_REQUIRE_GPU=1 cargo test -p hetsched --features gpu --test gpu_family -- --ignored`.
#[test]
#[ignore = "needs models/gemma-3-270m-q4_k_m.gguf (scripts/fetch-gemma3.sh)"]
fn gemma3_270m_resident_prefill_like_the_cpu_path() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "run scripts/fetch-gemma3.sh first");
    let file = GgufFile::open(path).unwrap();
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let text = "The quick brown fox jumps over the lazy dog. Rust is a systems programming \
                language that runs blazingly fast, prevents segfaults, and guarantees thread safety.";
    let tokens = tokenizer.encode(text).unwrap();
    let mut model = ExecModel::load(&file, LinearPrecision::F32).unwrap();
    // The prompt's tokens, then the first ids up to the row budget; the prompt renumbered.
    let mut kept: Vec<u32> = tokens.clone();
    kept.sort_unstable();
    kept.dedup();
    let extra = (0u32..).filter(|id| kept.binary_search(id).is_err());
    let extra: Vec<u32> = extra.take(REAL_VOCAB_ROWS - kept.len()).collect();
    kept.extend(extra);
    let tokens: Vec<u32> = tokens
        .iter()
        .map(|t| kept.iter().position(|k| k == t).unwrap() as u32)
        .collect();
    let h = model.config.hidden;
    let gather = |table: &[f32]| -> Vec<f32> {
        kept.iter()
            .flat_map(|&id| {
                table[id as usize * h..(id as usize + 1) * h]
                    .iter()
                    .copied()
            })
            .collect()
    };
    // A window the prompt passes, so that the local layers' mask cuts keys.
    model.config.sliding_window = REAL_WINDOW;
    model.config.vocab_size = kept.len();
    model.token_embd = gather(&model.token_embd);
    model.output = PackedF32Weights::pack(&gather(&model.output.to_rows()), kept.len(), h);
    let model = Arc::new(model);
    let chunked = |gpu| PrefillOptions {
        all_logits: false,
        ..options(16, gpu)
    };
    let cpu = prefill(model.clone(), &tokens, &chunked(GpuUse::Off)).unwrap();
    let Some(gpu) = unless_no_device(prefill(model.clone(), &tokens, &chunked(GpuUse::Resident)))
    else {
        return;
    };
    let diff = max_relative_diff(&gpu.logits, &cpu.logits);
    println!(
        "gemma3 270M, {} tokens: resident GPU vs CPU f32 max relative diff {diff:.2e}",
        tokens.len()
    );
    assert_eq!(argmax(&gpu.logits), argmax(&cpu.logits));
    assert!(diff <= LOGIT_TOL, "relative diff {diff}");
}
