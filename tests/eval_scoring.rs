//! `eval --scoring llama-cpp`: perplexity scored as llama.cpp's `llama-perplexity` scores
//! it (the second half of each window, the window's first token replaced by BOS) equals
//! the same scoring of the unchunked f32 reference forward, and reads lower than scoring
//! every position.
//!
//! Needs the model: run `scripts/fetch-model.sh` first.

use std::path::PathBuf;
use std::sync::Arc;

use hetsched::exec::{
    EvalWindows, ExecModel, LinearPrecision, PrefillOptions, Scoring, evaluate_windows,
};
use hetsched::import::{GgufFile, GgufTokenizer, LlamaModel, TEST_MODEL_PATH, token_nll};
use hetsched_runtime::progress::Silent;

#[test]
fn llama_cpp_scoring_equals_the_reference_forward_scored_the_same_way() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    assert!(path.is_file(), "run scripts/fetch-model.sh first");
    let file = GgufFile::open(&path).unwrap();
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let reference = LlamaModel::from_gguf(&file).unwrap();
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap_or_else(|_| {
        "The quick brown fox jumps over the lazy dog, and the dog sleeps on. ".repeat(20)
    });
    let tokens = tokenizer.encode(&text).unwrap();
    let (ctx, bos) = (40, 0);
    let options = PrefillOptions {
        chunk_len: 16,
        threads: 2,
        ..PrefillOptions::default()
    };
    let eval = |scoring| {
        let windows = EvalWindows {
            ctx,
            max_windows: 2,
            scoring,
        };
        evaluate_windows(&model, &model, &tokens, &windows, &options, &mut Silent).unwrap()
    };
    let llama = eval(Scoring::LlamaCpp { bos: Some(bos) });
    let all = eval(Scoring::All);
    assert_eq!(llama.scoring, "llama-cpp");
    assert_eq!(llama.tokens, 2 * (ctx - 1 - ctx / 2));
    assert_eq!(all.tokens, 2 * (ctx - 1));

    let vocab = model.config.vocab_size;
    let mut nll = 0.0;
    for window in tokens.chunks_exact(ctx).take(2) {
        let mut window = window.to_vec();
        window[0] = bos;
        let logits = reference.forward_all(&window).unwrap();
        for t in ctx / 2..ctx - 1 {
            nll += token_nll(&logits[t * vocab..(t + 1) * vocab], window[t + 1]);
        }
    }
    let want = (nll / llama.tokens as f64).exp();
    println!(
        "llama-cpp scoring {:.4} (reference {want:.4}), all {:.4}",
        llama.perplexity, all.perplexity
    );
    assert!((llama.perplexity - want).abs() <= 1e-3 * want);
    // Positions with half a window of context predict better than the average position.
    assert!(llama.perplexity < all.perplexity);
}
