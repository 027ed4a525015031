//! The family rows through the real executor: tiny synthetic Gemma 3, Qwen2 and Llama-3
//! (RoPE scaling) files written by the project's GGUF writer, prefilled in chunks on the scheduler's queues
//! and decoded token by token (both decode paths), against the f32 reference forward
//! (`LlamaModel`), which computes every row. The Gemma file has six layers, so that
//! five local (sliding-window) layers and one global layer run, and prompts longer than
//! its window of 3. The graph the executor schedules has each row's operators.

use std::sync::Arc;

use hetsched::exec::generate::{DecodePath, Session};
use hetsched::exec::{ExecError, ExecModel, GpuUse, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::gguf::writer::{GgufWriter, Llama3Scaling, llama3_rope_factors};
use hetsched::import::{GgufFile, LlamaModel, MetadataValue as V, family};
use hetsched::systems::graph::build_stages;
use hetsched::systems::op::OpRole;

mod compare;
mod tiny_family;
use compare::max_relative_diff;
use tiny_family::{Sizes, tiny_family_bytes};

/// f32 executor logits against the reference: max |diff| <= this × max |logit| (the
/// reference accumulates attention in f64, the executor's GEMMs in f32).
const F32_TOL: f32 = 1e-4;
/// W8A8 (per-row INT8 weights, per-tensor INT8 activations) against the f32 reference.
const W8A8_TOL: f32 = 0.05;

const H: usize = 8;
const HEAD: usize = 4;
const WINDOW: u32 = 3;
const VOCAB: usize = 16;

/// A model of row `arch`: `layers` blocks of hidden 8 (2 query heads of 4, 1 KV head),
/// with every tensor its row needs.
fn tiny(arch: &str, layers: usize) -> GgufFile {
    GgufFile::from_bytes(tiny_bytes(arch, layers, |_| {})).unwrap()
}

/// [`tiny`]'s file, with `more` adding metadata or tensors before it is written.
fn tiny_bytes(arch: &str, layers: usize, more: impl FnOnce(&mut GgufWriter)) -> Vec<u8> {
    let sizes = Sizes {
        hidden: H,
        ffn: 12,
        vocab: VOCAB,
        window: WINDOW,
    };
    tiny_family_bytes(arch, layers, sizes, more)
}

fn options(chunk_len: u32) -> PrefillOptions {
    PrefillOptions {
        chunk_len,
        threads: 2,
        all_logits: true,
        ..PrefillOptions::default()
    }
}

const PROMPT: [u32; 11] = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4];

/// Every position's logits of a prefill in chunks of `chunk_len` (the last chunk's rows:
/// with one chunk, the whole prompt's).
fn executed(model: &Arc<ExecModel>, tokens: &[u32], chunk_len: u32) -> Vec<f32> {
    prefill(model.clone(), tokens, &options(chunk_len))
        .unwrap()
        .logits
}

/// Checks an f32 prefill of `file`, whole and in chunks of each of `chunks` (the last
/// chunk's rows are the last positions'), against the reference forward within
/// [`F32_TOL`]; returns the reference's logits and the whole prefill's.
fn prefills_like_the_reference(
    file: &GgufFile,
    chunks: &[usize],
    label: &str,
) -> (Vec<f32>, Vec<f32>) {
    let reference = LlamaModel::from_gguf(file).unwrap();
    let want = reference.forward_all(&PROMPT).unwrap();
    let model = Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap());
    let whole = executed(&model, &PROMPT, PROMPT.len() as u32);
    let diff = max_relative_diff(&whole, &want);
    assert!(diff <= F32_TOL, "{label}: relative diff {diff}");
    for &chunk in chunks {
        let rows = PROMPT.len() - (PROMPT.len() - 1) / chunk * chunk;
        let got = executed(&model, &PROMPT, chunk as u32);
        let diff = max_relative_diff(&got, &want[(PROMPT.len() - rows) * VOCAB..]);
        assert!(diff <= F32_TOL, "{label} in chunks of {chunk}: {diff}");
    }
    (want, whole)
}

#[test]
fn gemma3_and_qwen2_prefill_like_the_reference() {
    for (arch, layers) in [("gemma3", 6), ("qwen2", 2), ("llama", 2)] {
        let file = tiny(arch, layers);
        // In chunks of 4 and 5: past Gemma's window of 3.
        let (want, _) = prefills_like_the_reference(&file, &[4, 5], arch);
        // W8A8 on the rows without post-norms. Gemma's post-norms rescale each block's
        // output to unit RMS, and on these random weights the outputs are small sums of
        // cancelling terms, so INT8 rounding grows to 27% of the largest logit: Gemma's
        // INT8 path is checked against its own prefill below and on the real file
        // (docs/model-import.md).
        if arch != "gemma3" {
            let int8 = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8).unwrap());
            let diff = max_relative_diff(&executed(&int8, &PROMPT, 4), &want[8 * VOCAB..]);
            assert!(diff <= W8A8_TOL, "{arch} w8a8: {diff}");
        }
    }
}

/// A 2-layer llama with Llama-3's RoPE scaling as llama.cpp's converter writes it
/// (`rope_freqs.weight`), on a base (100) and original context (32) small enough that
/// the two frequencies of a head of 4 fall in the blended and the fully scaled bands.
fn tiny_llama3() -> GgufFile {
    let scaling = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 8.0,
        original_context: 32.0,
    };
    let factors = llama3_rope_factors(HEAD, 100.0, &scaling);
    assert!(factors[0] > 1.0 && factors[0] < 8.0 && factors[1] == 8.0);
    let bytes = tiny_bytes("llama", 2, |w| {
        w.kv("llama.rope.freq_base", V::F32(100.0))
            .llama3_rope_freqs(HEAD, 100.0, &scaling);
    });
    GgufFile::from_bytes(bytes).unwrap()
}

#[test]
fn llama3_rope_scaling_prefills_like_the_reference() {
    let file = tiny_llama3();
    let (_, whole) = prefills_like_the_reference(&file, &[3, 4], "llama-3");
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    assert!(model.rope_scaled);
    // The factors matter: the same weights unscaled give other logits.
    let unscaled = GgufFile::from_bytes(tiny_bytes("llama", 2, |w| {
        w.kv("llama.rope.freq_base", V::F32(100.0));
    }))
    .unwrap();
    let plain = LlamaModel::from_gguf(&unscaled).unwrap();
    let other = plain.forward_all(&PROMPT).unwrap();
    assert!(max_relative_diff(&whole, &other) > 100.0 * F32_TOL);
    // A GPU lane cannot rotate by them: a clear error before any device is opened.
    let gpu = PrefillOptions {
        gpu: GpuUse::FloatLane,
        ..options(4)
    };
    let err = prefill(model.clone(), &PROMPT, &gpu).unwrap_err();
    assert!(matches!(err, ExecError::NotOnGpu { .. }), "{err}");
    assert!(err.to_string().contains("--backends cpu,npu"), "{err}");
}

#[test]
fn the_window_and_the_family_steps_matter() {
    // A wrong window, a missing post-norm or SiLU for GELU would each move the logits
    // by far more than the tolerance: the comparison above can fail.
    let file = tiny("gemma3", 6);
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let got = executed(&model, &PROMPT, PROMPT.len() as u32);
    let reference = LlamaModel::from_gguf(&file).unwrap();
    let mut wide = reference.config().clone();
    wide.sliding_window = 64;
    let unwindowed = LlamaModel::from_gguf_with_config(&file, wide).unwrap();
    let other = unwindowed.forward_all(&PROMPT).unwrap();
    assert!(max_relative_diff(&got, &other) > 100.0 * F32_TOL);
    let mut llama_like = reference.config().clone();
    llama_like.family = family::LLAMA;
    llama_like.sliding_window = 0;
    llama_like.rope_style = family::GEMMA3.rope_style;
    let plain = LlamaModel::from_gguf_with_config(&file, llama_like).unwrap();
    let plain = plain.forward_all(&PROMPT).unwrap();
    assert!(max_relative_diff(&got, &plain) > 100.0 * F32_TOL);
}

#[test]
fn each_rows_graph_has_its_operators() {
    let roles = |arch: &str, layers| -> Vec<OpRole> {
        let file = tiny(arch, layers);
        let model = ExecModel::load(&file, LinearPrecision::W8a8).unwrap();
        let stages = build_stages(&model.model_config()).unwrap();
        stages
            .iter()
            .flat_map(|s| s.ops.iter().filter_map(|op| op.role))
            .collect()
    };
    let count = |roles: &[OpRole], role: OpRole| roles.iter().filter(|&&r| r == role).count();
    let gemma = roles("gemma3", 6);
    assert_eq!(count(&gemma, OpRole::EmbedScale), 1);
    assert_eq!(count(&gemma, OpRole::QkNorm), 6);
    assert_eq!(count(&gemma, OpRole::GeluMul), 6);
    assert_eq!(count(&gemma, OpRole::SiluMul), 0);
    assert_eq!(count(&gemma, OpRole::QkvBias), 0);
    let post = |b| OpRole::PostNorm(b);
    use hetsched::systems::op::Block;
    assert_eq!(count(&gemma, post(Block::Attention)), 6);
    assert_eq!(count(&gemma, post(Block::FeedForward)), 6);
    let qwen = roles("qwen2", 2);
    assert_eq!(count(&qwen, OpRole::QkvBias), 2);
    assert_eq!(count(&qwen, OpRole::SiluMul), 2);
    assert_eq!(
        count(&qwen, OpRole::QkNorm) + count(&qwen, OpRole::EmbedScale),
        0
    );
    let llama = roles("llama", 2);
    let extra = [
        OpRole::QkvBias,
        OpRole::QkNorm,
        OpRole::EmbedScale,
        OpRole::GeluMul,
    ];
    assert!(extra.iter().all(|&r| count(&llama, r) == 0));
}

#[test]
fn int8_decoding_continues_like_a_prefill_of_one_token_chunks() {
    // Per-tensor INT8 activations of one row: a decode step quantizes as a prefill in
    // chunks of one token does, operator for operator.
    for (arch, layers) in [("gemma3", 6), ("qwen2", 2)] {
        let file = tiny(arch, layers);
        let model = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8).unwrap());
        for path in [DecodePath::DirectF32Head, DecodePath::Scheduled] {
            let one = PrefillOptions {
                all_logits: false,
                ..options(1)
            };
            let mut session = Session::new(model.clone(), one.clone(), path).unwrap();
            session.prefill(&PROMPT[..1]).unwrap();
            for n in 2..=PROMPT.len() {
                session.step(PROMPT[n - 1]).unwrap();
                let want = prefill(model.clone(), &PROMPT[..n], &one).unwrap().logits;
                let diff = max_relative_diff(session.logits().unwrap(), &want);
                assert!(diff <= F32_TOL, "{arch} {path:?} at {n}: {diff}");
            }
        }
    }
}

#[test]
fn decoding_continues_like_the_reference() {
    for (arch, layers) in [("gemma3", 6), ("qwen2", 2)] {
        let file = tiny(arch, layers);
        let reference = LlamaModel::from_gguf(&file).unwrap();
        for precision in [LinearPrecision::F32] {
            let model = Arc::new(ExecModel::load(&file, precision).unwrap());
            for path in [DecodePath::Direct, DecodePath::Scheduled] {
                let prefill_options = PrefillOptions {
                    all_logits: false,
                    ..options(2)
                };
                let mut session = Session::new(model.clone(), prefill_options, path).unwrap();
                let mut tokens = PROMPT[..4].to_vec();
                session.prefill(&tokens).unwrap();
                // Eight steps: past the window of 3 from the first of them.
                for next in [3, 9, 0, 5, 11, 6, 2, 14] {
                    let want = reference.forward_last(&tokens).unwrap();
                    let got = session.logits().unwrap();
                    let diff = max_relative_diff(got, &want);
                    assert!(
                        diff <= F32_TOL,
                        "{arch} {path:?} at {}: {diff}",
                        tokens.len()
                    );
                    session.step(next).unwrap();
                    tokens.push(next);
                }
            }
        }
    }
}

#[test]
fn a_profile_of_another_family_does_not_fit() {
    use hetsched::systems::ProfileOrigin;
    // A measured profile (or a scene's model) records the shape it was made for; the
    // family is part of it, so one written for a llama of the same sizes is refused.
    let gemma = ExecModel::load(&tiny("gemma3", 6), LinearPrecision::F32).unwrap();
    let llama = ExecModel::load(&tiny("llama", 6), LinearPrecision::F32).unwrap();
    let (g, l) = (
        ProfileOrigin::shape_of(&gemma.model_config()),
        ProfileOrigin::shape_of(&llama.model_config()),
    );
    assert!(g.ends_with(", family gemma3"), "{g}");
    assert!(!l.contains("family"), "{l}");
    assert_ne!(g, l);
}
