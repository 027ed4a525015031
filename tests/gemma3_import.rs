//! Gemma 3 270M (Q4_K_M) through the importer and the f32 reference forward: the `gemma3`
//! family row, every tensor type of the file dequantized (Q8_0, Q5_0, Q4_K, Q6_K, F32),
//! the SentencePiece tokenizer, and a prediction that only a correct forward makes.
//!
//! Needs `scripts/fetch-gemma3.sh` (253 MB, not fetched by setup.sh): ignored by default,
//! run with `cargo test --release --test gemma3_import -- --ignored`.

use std::path::PathBuf;

use hetsched::exec::{ExecModel, LinearPrecision};
use hetsched::import::family::GEMMA3;
use hetsched::import::{GgufFile, GgufTokenizer, LlamaModel, SpmTokenizer, top_k};

fn open() -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "run scripts/fetch-gemma3.sh first");
    GgufFile::open(path).unwrap()
}

/// The id of `token` in the file's vocabulary (SentencePiece pieces: `▁` for a space).
fn id(file: &GgufFile, token: &str) -> u32 {
    let tokens = file
        .metadata()
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    tokens.iter().position(|t| *t == token).unwrap() as u32
}

#[test]
#[ignore = "needs scripts/fetch-gemma3.sh"]
fn gemma3_270m_predicts_berlin_in_the_reference_forward() {
    let file = open();
    for t in file.tensors() {
        let values = t.to_f32().unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        assert_eq!(values.len(), t.info.n_elements);
    }
    let model = LlamaModel::from_gguf(&file).unwrap();
    let c = model.config();
    assert_eq!(c.family, GEMMA3);
    assert_eq!(
        (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads),
        (18, 640, 4, 1)
    );
    assert_eq!((c.head_dim, c.ffn, c.sliding_window), (256, 2048, 512));
    assert!(c.tied_output);

    // The SentencePiece tokenizer splits a plain sentence into the pieces looked up by
    // hand, BOS first.
    let tokenizer = SpmTokenizer::from_metadata(file.metadata()).unwrap();
    let words = ["The", "▁capital", "▁of", "▁France", "▁is"];
    let by_hand: Vec<u32> = words.iter().map(|w| id(&file, w)).collect();
    let encoded = tokenizer.encode("The capital of France is");
    assert_eq!(encoded[0], tokenizer.bos_id().unwrap());
    assert_eq!(encoded[1..], by_hand);

    let prompt = tokenizer.encode("The capital of France is Paris. The capital of Germany is");
    let logits = model.forward_last(&prompt).unwrap();
    let best = top_k(&logits, 3);
    let shown: Vec<(String, f32)> = best
        .iter()
        .map(|b| (tokenizer.decode(&[b.0]), b.1))
        .collect();
    println!("top 3: {shown:?}");
    assert_eq!(best[0].0, id(&file, "▁Berlin"), "{shown:?}");

    // The executor loads it (tests/gemma3_exec.rs runs it), and the GGUF tokenizer
    // every command uses takes the SentencePiece vocabulary.
    let exec = ExecModel::load(&file, LinearPrecision::F32).unwrap();
    assert_eq!(exec.config.family, GEMMA3);
    let gguf = GgufTokenizer::from_gguf(&file).unwrap();
    assert_eq!(gguf.encode("The capital of France is").unwrap(), encoded);
}
