//! Hugging Face safetensors checkpoints: the GGUF test model written out as a Hugging
//! Face directory (f32, query/key rows un-permuted back to Hugging Face's layout) loads
//! and prefills to the same logits as the GGUF file; broken directories are refused with
//! the file and the reason.
//!
//! Needs the model: run `scripts/fetch-model.sh` first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::{
    ColumnSource, GgufFile, GgufSource, GgufTokenizer, HfModel, ImportError, LayerTensor,
    LlamaSource, TEST_MODEL_PATH,
};
use safetensors::{Dtype, tensor::TensorView};

fn gguf() -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    assert!(
        path.is_file(),
        "test model {} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    GgufFile::open(path).unwrap()
}

/// llama.cpp's converter permutes query/key rows of head h from (half s, pair i) to
/// (pair i, half s); this undoes it.
fn unpermute(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    let half = head_dim / 2;
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..half {
                let hf_row = h * head_dim + s * half + i;
                let gguf_row = h * head_dim + 2 * i + s;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&w[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    out
}

fn write_checkpoint(dir: &Path, file: &GgufFile) {
    std::fs::create_dir_all(dir).unwrap();
    let src = GgufSource::new(file).unwrap();
    let c = src.config().clone();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        (
            "model.embed_tokens.weight".into(),
            vec![c.vocab_size, c.hidden],
            src.token_embd().unwrap(),
        ),
        (
            "model.norm.weight".into(),
            vec![c.hidden],
            src.output_norm().unwrap(),
        ),
    ];
    let names = [
        (LayerTensor::AttnNorm, "input_layernorm"),
        (LayerTensor::Q, "self_attn.q_proj"),
        (LayerTensor::K, "self_attn.k_proj"),
        (LayerTensor::V, "self_attn.v_proj"),
        (LayerTensor::O, "self_attn.o_proj"),
        (LayerTensor::FfnNorm, "post_attention_layernorm"),
        (LayerTensor::Gate, "mlp.gate_proj"),
        (LayerTensor::Up, "mlp.up_proj"),
        (LayerTensor::Down, "mlp.down_proj"),
    ];
    for l in 0..c.n_layers {
        for (which, name) in names {
            let mut w = src.layer(l, which).unwrap();
            match which {
                LayerTensor::Q => w = unpermute(&w, c.n_heads, c.head_dim, c.hidden),
                LayerTensor::K => w = unpermute(&w, c.n_kv_heads, c.head_dim, c.hidden),
                _ => {}
            }
            tensors.push((
                format!("model.layers.{l}.{name}.weight"),
                which.shape(&c),
                w,
            ));
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, w)| (n, s, w.iter().flat_map(|v| v.to_le_bytes()).collect()))
        .collect();
    let views: HashMap<String, TensorView<'_>> = bytes
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn,
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "num_key_value_heads": c.n_kv_heads,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_base,
        "max_position_embeddings": c.context_length,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tokenizer = GgufTokenizer::from_gguf(file).unwrap();
    tokenizer
        .inner()
        .expect("SmolLM2's vocabulary is byte-level BPE")
        .save(dir.join("tokenizer.json"), false)
        .unwrap();
}

#[test]
fn a_safetensors_checkpoint_prefills_like_the_gguf_file() {
    let file = gguf();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-smollm2");
    write_checkpoint(&dir, &file);
    let hf = HfModel::open(&dir).unwrap();
    let tokenizer = GgufTokenizer::from_tokenizer_json(&hf.tokenizer_path(), false).unwrap();
    let gguf_tokenizer = GgufTokenizer::from_gguf(&file).unwrap();
    let text = "The capital of France is";
    let tokens = tokenizer.encode(text).unwrap();
    assert_eq!(tokens, gguf_tokenizer.encode(text).unwrap());

    let options = PrefillOptions {
        chunk_len: 4,
        threads: 2,
        ..PrefillOptions::default()
    };
    let from_hf = Arc::new(ExecModel::from_source(&hf, LinearPrecision::F32).unwrap());
    let from_gguf = Arc::new(ExecModel::load(&file, LinearPrecision::F32).unwrap());
    let a = prefill(from_hf, &tokens, &options).unwrap().logits;
    let b = prefill(from_gguf, &tokens, &options).unwrap().logits;
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    println!("HF vs GGUF: max |diff| {diff:.2e} of max |logit| {scale:.2}");
    assert!(diff <= 1e-4 * scale, "max diff {diff}");

    // The outlier shadow's cold rows: a column read from the safetensors map equals the
    // column of the whole tensor.
    for which in [LayerTensor::Q, LayerTensor::Down] {
        let whole = hf.layer(3, which).unwrap();
        let cols = which.shape(hf.config())[1];
        for c in [0, 7, cols - 1] {
            let want: Vec<f32> = whole.chunks_exact(cols).map(|row| row[c]).collect();
            assert_eq!(hf.layer_column(3, which, c).unwrap(), want, "{which:?} {c}");
        }
        assert!(hf.layer_column(3, which, cols).is_err());
    }
}

#[test]
fn broken_checkpoints_name_the_file_and_the_problem() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-broken");
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("config.json"));
    let err = HfModel::open(&dir).unwrap_err();
    assert!(
        matches!(err, ImportError::Io { .. }) && err.to_string().contains("config.json"),
        "{err}"
    );

    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let err = HfModel::open(&dir).unwrap_err();
    assert!(matches!(err, ImportError::BadFile { .. }), "{err}");

    let mistral = r#"{"model_type": "mistral", "hidden_size": 8, "intermediate_size": 16,
        "num_attention_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 64, "vocab_size": 10}"#;
    std::fs::write(dir.join("config.json"), mistral).unwrap();
    let err = HfModel::open(&dir).unwrap_err();
    assert!(
        matches!(err, ImportError::UnsupportedArchitecture(ref a) if a == "mistral"),
        "{err}"
    );

    let llama = mistral.replace("mistral", "llama");
    std::fs::write(dir.join("config.json"), &llama).unwrap();
    let err = HfModel::open(&dir).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");

    std::fs::write(
        dir.join("model.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage",
    )
    .unwrap();
    let err = HfModel::open(&dir).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}
