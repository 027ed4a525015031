//! The byte-level BPE tokenizer against llama.cpp's own tokenizer tests: the vocabulary
//! files of its `models/` folder (`ggml-vocab-qwen2.gguf`, `ggml-vocab-llama-bpe.gguf`:
//! metadata only) with their `.inp` texts and the ids llama.cpp's `test-tokenizer-0`
//! expects (`.out`), so Qwen2's and Llama-3's pre-tokenizers are checked on the real
//! vocabularies, edge cases included (runs of spaces and line breaks, digits, accents,
//! emoji, contractions).
//!
//! Needs the llama.cpp source that `scripts/build-llamacpp.sh` unpacks (or `LLAMACPP_SRC`
//! naming a llama.cpp checkout): ignored by default, run with
//! `cargo test --test bpe_vocab_llamacpp -- --ignored`.

use std::path::PathBuf;

use hetsched::import::{GgufFile, GgufTokenizer};

fn llamacpp_models() -> PathBuf {
    let src = std::env::var_os("LLAMACPP_SRC").map_or_else(
        || {
            let home = std::env::var_os("HOME").expect("HOME or LLAMACPP_SRC");
            PathBuf::from(home)
                .join(".cache/llamacpp-0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp")
        },
        PathBuf::from,
    );
    let models = src.join("models");
    assert!(
        models.is_dir(),
        "{} is missing: run scripts/build-llamacpp.sh or set LLAMACPP_SRC",
        models.display()
    );
    models
}

/// Every text of `NAME.gguf.inp` encodes to the ids of the same line of `.out`.
fn matches_llamacpp(name: &str) {
    let models = llamacpp_models();
    let file = GgufFile::open(models.join(format!("{name}.gguf"))).unwrap();
    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    let read = |ext: &str| std::fs::read_to_string(models.join(format!("{name}.gguf.{ext}")));
    let inputs = read("inp").unwrap();
    let outputs = read("out").unwrap();
    let texts: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<&str> = outputs.lines().collect();
    // The input file ends with a separator line, leaving one empty text after it.
    assert_eq!(texts.len(), expected.len() + 1, "{name}: test count");
    let skip = usize::from(tok.add_bos() && tok.bos_id().is_some());
    for (text, want) in texts.iter().zip(&expected) {
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|id| id.parse().unwrap())
            .collect();
        let got = tok.encode(text).unwrap();
        assert_eq!(&got[skip..], &want[..], "{name}: {text:?}");
    }
}

#[test]
#[ignore = "needs the llama.cpp source (scripts/build-llamacpp.sh)"]
fn qwen2_vocabulary_tokenizes_as_llamacpp() {
    matches_llamacpp("ggml-vocab-qwen2");
}

#[test]
#[ignore = "needs the llama.cpp source (scripts/build-llamacpp.sh)"]
fn llama3_vocabulary_tokenizes_as_llamacpp() {
    matches_llamacpp("ggml-vocab-llama-bpe");
}
