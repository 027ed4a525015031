//! Gemma 3 270M (Q4_K_M) through the real executor: a chunked, scheduled f32 prefill
//! against the f32 reference forward, and greedy decoding against the reference's
//! greedy continuation, with the GGUF tokenizer (SentencePiece) every command uses.
//!
//! Needs `scripts/fetch-gemma3.sh` (253 MB, not fetched by setup.sh): ignored by default,
//! run with `cargo test --release --test gemma3_exec -- --ignored`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hetsched::exec::generate::{DecodePath, GenerateOptions, Session};
use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::{GgufFile, GgufTokenizer, LlamaModel, top_k};

mod compare;
use compare::max_relative_diff;

/// Executor logits against the reference: max |diff| <= this × max |logit|.
const LOGIT_TOL: f32 = 1e-3;

const PASSAGE: &str = "The quick brown fox jumps over the lazy dog. Rust is a systems \
programming language that runs blazingly fast, prevents segfaults, and guarantees thread \
safety. A prompt is cut into fixed-size chunks, and each chunk runs through the graph.";

fn open() -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "run scripts/fetch-gemma3.sh first");
    GgufFile::open(path).unwrap()
}

fn options(chunk_len: u32) -> PrefillOptions {
    PrefillOptions {
        chunk_len,
        threads: 2,
        ..PrefillOptions::default()
    }
}

#[test]
#[ignore = "needs scripts/fetch-gemma3.sh"]
fn gemma3_prefills_and_decodes_like_the_reference() {
    let file = open();
    let tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let reference = LlamaModel::from_gguf(&file).unwrap();
    let model = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let tokens = tokenizer.encode(PASSAGE).unwrap();
    assert!(tokens.len() > 40, "{} tokens", tokens.len());
    let want = reference.forward_last(&tokens).unwrap();
    for chunk in [16, 64] {
        let run = prefill(model.clone(), &tokens, &options(chunk)).unwrap();
        let diff = max_relative_diff(&run.logits, &want);
        println!("chunks of {chunk}: max relative logit diff {diff:.2e}");
        assert!(diff <= LOGIT_TOL, "chunks of {chunk}: {diff}");
    }

    // Greedy decoding: the reference's continuation, one full forward per token.
    let prompt = tokenizer.encode("The capital of France is").unwrap();
    let count = 8;
    let mut expected = prompt.clone();
    for _ in 0..count {
        let next = top_k(&reference.forward_last(&expected).unwrap(), 2);
        assert!(next[0].1 - next[1].1 > 1e-3, "near tie: {next:?}");
        expected.push(next[0].0);
    }
    for path in [DecodePath::DirectF32Head, DecodePath::Scheduled] {
        let mut session = Session::new(model.clone(), options(8), path).unwrap();
        let generated = session
            .generate(
                &prompt,
                &tokenizer,
                &GenerateOptions {
                    max_tokens: count,
                    ..GenerateOptions::default()
                },
                &AtomicBool::new(false),
                |_| {},
            )
            .unwrap();
        println!("{path:?}: {:?}", generated.text);
        assert_eq!(generated.tokens, expected[prompt.len()..], "{path:?}");
    }
}
