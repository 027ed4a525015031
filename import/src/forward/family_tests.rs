//! The family rows on tiny synthetic GGUF files from the project's writer, through the
//! importer and the reference forward: each row's extra step is checked by an identity
//! it must satisfy (zero biases change nothing, RoPE factors of 2 equal a linear scale of
//! 1/2, a window wider than the prompt is plain attention) and by changing the output
//! where it should.

use super::LlamaModel;
use super::tests::rand;
use crate::ImportError;
use crate::family::{GEMMA3, LLAMA, QWEN2};
use crate::gguf::GgufFile;
use crate::gguf::MetadataValue as V;
use crate::gguf::writer::{GgufWriter, Llama3Scaling, TinyModel};

const H: usize = 8;
const HEAD: usize = 4;
const FFN: usize = 12;
const VOCAB: usize = 10;

/// Seeded values for tensor `name` (seeded by name, so that two rows' files share the
/// tensors they both have), norm weights around 1.
fn values(name: &str, len: usize, scale: f32) -> Vec<f32> {
    let seed = name
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let one = if name.contains("norm") { 1.0 } else { 0.0 };
    rand(len, seed)
        .into_iter()
        .map(|x| x * scale + one)
        .collect()
}

/// A 2-layer model of `arch` (hidden 8, 2 heads of 4, 1 KV head), with the tensors its
/// row needs; `extra` adds metadata and `bias` scales the QKV biases (families with them).
fn tiny(arch: &str, extra: &[(&str, V)], bias: f32, rope_freqs: Option<f32>) -> GgufFile {
    let family = crate::family::family(arch).unwrap();
    let m = TinyModel {
        arch,
        layers: 2,
        hidden: H,
        heads: 2,
        kv_heads: 1,
        ffn: FFN,
        vocab: VOCAB,
        context: 16,
        tied: true,
    };
    let mut w = GgufWriter::tiny_model(&m, |name, n| values(name, n, 1.0));
    for (key, v) in extra {
        w.kv(key, v.clone());
    }
    if let Some(f) = rope_freqs {
        w.tensor_f32("rope_freqs.weight", &[HEAD / 2], &[f; HEAD / 2]);
    }
    for i in 0..2 {
        let mut layer: Vec<(&str, usize, f32)> = Vec::new();
        if family.qkv_bias {
            layer.extend([
                ("attn_q.bias", H, bias),
                ("attn_k.bias", HEAD, bias),
                ("attn_v.bias", HEAD, bias),
            ]);
        }
        if family.qk_norm {
            layer.extend([
                ("attn_q_norm.weight", HEAD, 1.0),
                ("attn_k_norm.weight", HEAD, 1.0),
            ]);
        }
        if family.post_norms {
            layer.extend([
                ("post_attention_norm.weight", H, 1.0),
                ("post_ffw_norm.weight", H, 1.0),
            ]);
        }
        for (name, len, scale) in layer {
            let name = format!("blk.{i}.{name}");
            w.tensor_f32(&name, &[len], &values(&name, len, scale));
        }
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

const TOKENS: [u32; 6] = [3, 1, 4, 1, 5, 9];

fn logits(file: &GgufFile) -> Vec<f32> {
    LlamaModel::from_gguf(file)
        .unwrap()
        .forward_all(&TOKENS)
        .unwrap()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5)
}

#[test]
fn qwen2_row_reads_biases_and_half_split_rope() {
    let zero = tiny("qwen2", &[], 0.0, None);
    let model = LlamaModel::from_gguf(&zero).unwrap();
    assert_eq!(model.config().family, QWEN2);
    // Zero biases: the llama computation with Qwen2's half-split RoPE. The llama file
    // holds the same weights (tensors are seeded by name).
    let llama = tiny("llama", &[], 0.0, None);
    let mut config = crate::LlamaConfig::from_gguf(&llama).unwrap();
    config.rope_style = QWEN2.rope_style;
    let as_llama = LlamaModel::from_gguf_with_config(&llama, config).unwrap();
    assert!(close(
        &logits(&zero),
        &as_llama.forward_all(&TOKENS).unwrap()
    ));
    // Biases change the output.
    assert!(!close(
        &logits(&zero),
        &logits(&tiny("qwen2", &[], 1.0, None))
    ));
}

#[test]
fn llama3_rope_factors_equal_linear_scaling() {
    let plain = logits(&tiny("llama", &[], 0.0, None));
    let ones = logits(&tiny("llama", &[], 0.0, Some(1.0)));
    assert!(close(&plain, &ones));
    let twos = logits(&tiny("llama", &[], 0.0, Some(2.0)));
    let linear = [
        ("llama.rope.scaling.type", V::String("linear".into())),
        ("llama.rope.scaling.factor", V::F32(2.0)),
    ];
    let scaled = tiny("llama", &linear, 0.0, None);
    assert_eq!(
        LlamaModel::from_gguf(&scaled)
            .unwrap()
            .config()
            .rope_freq_scale,
        0.5
    );
    assert!(close(&twos, &logits(&scaled)));
    assert!(!close(&plain, &twos));
    for kind in ["yarn", "longrope", "llama3"] {
        let other = [("llama.rope.scaling.type", V::String(kind.into()))];
        let err = LlamaModel::from_gguf(&tiny("llama", &other, 0.0, None)).unwrap_err();
        assert!(
            matches!(&err, ImportError::UnsupportedRopeScaling { kind: k, .. } if k == kind),
            "{err}"
        );
        assert!(err.to_string().contains(kind), "{err}");
    }
    let bad = LlamaModel::from_gguf(&tiny("llama", &[], 0.0, Some(0.0))).unwrap_err();
    assert!(bad.to_string().contains("rope_freqs.weight[0]"), "{bad}");
}

/// Hugging Face's `_compute_llama3_parameters`, in f64, written apart from the
/// converter's rule: the scaled inverse frequencies themselves (`inv_freq / factor` for
/// long wavelengths, a blend of `inv_freq / factor` and `inv_freq` between).
fn hf_llama3_frequencies(d: usize, base: f64, s: &Llama3Scaling) -> Vec<f64> {
    let (factor, low, high, old) = (
        f64::from(s.factor),
        f64::from(s.low_freq_factor),
        f64::from(s.high_freq_factor),
        f64::from(s.original_context),
    );
    (0..d)
        .step_by(2)
        .map(|j| {
            let inv_freq = 1.0 / base.powf(j as f64 / d as f64);
            let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
            if wavelen > old / low {
                inv_freq / factor
            } else if wavelen < old / high {
                inv_freq
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        })
        .collect()
}

#[test]
fn llama3_frequencies_match_hugging_face_rule() {
    // Llama 3.1's scaling on a head of 128 with base 500000 hits all three bands.
    let scaling = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192.0,
    };
    let (d, base) = (128, 500_000.0);
    let file = |factors: bool| {
        let mut w = GgufWriter::tiny_model(
            &TinyModel {
                arch: "llama",
                layers: 1,
                hidden: d,
                heads: 1,
                kv_heads: 1,
                ffn: 4,
                vocab: 4,
                context: 16,
                tied: true,
            },
            |name, n| values(name, n, 0.3),
        );
        w.kv("llama.rope.freq_base", V::F32(base));
        if factors {
            w.llama3_rope_freqs(d, base, &scaling);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let scaled = file(true);
    let config = crate::LlamaConfig::from_gguf(&scaled).unwrap();
    let weights = crate::LlamaWeights::from_gguf(&scaled, &config).unwrap();
    let factors = weights.rope_factors().unwrap().unwrap();
    let got = config.rope_frequencies(base, Some(&factors));
    let want = hf_llama3_frequencies(d, f64::from(base), &scaling);
    assert!(factors.contains(&1.0) && factors.contains(&8.0));
    assert!(factors.iter().any(|&f| f > 1.0 && f < 8.0));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // The factors are stored as f32: a relative error of a few 2^-24.
        assert!((g - w).abs() <= 1e-6 * w, "pair {i}: {g} vs {w}");
    }
    // The reference forward rotates by them: the logits differ from the unscaled file's.
    let tokens = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0];
    let run = |f: &GgufFile| {
        LlamaModel::from_gguf(f)
            .unwrap()
            .forward_all(&tokens)
            .unwrap()
    };
    assert!(!close(&run(&scaled), &run(&file(false))));
}

#[test]
fn gemma3_row_runs_causally_with_its_window() {
    let window = |w: u32| {
        [
            ("gemma3.attention.sliding_window", V::U32(w)),
            ("gemma3.attention.key_length", V::U32(HEAD as u32)),
        ]
    };
    let file = tiny("gemma3", &window(3), 0.0, None);
    let model = LlamaModel::from_gguf(&file).unwrap();
    assert_eq!(model.config().family, GEMMA3);
    assert_eq!(model.config().sliding_window, 3);
    let all = model.forward_all(&TOKENS).unwrap();
    assert!(all.iter().all(|v| v.is_finite()));
    let prefix = model.forward_all(&TOKENS[..3]).unwrap();
    assert!(close(&prefix, &all[..3 * VOCAB]));
    // Within the window the local layers see everything: a wide window agrees on the
    // first 3 tokens and differs after.
    let wide = logits(&tiny("gemma3", &window(16), 0.0, None));
    assert!(close(&wide[..3 * VOCAB], &all[..3 * VOCAB]));
    assert!(!close(&wide[3 * VOCAB..], &all[3 * VOCAB..]));
    // A Gemma file without its window is refused.
    let err = LlamaModel::from_gguf(&tiny("gemma3", &[], 0.0, None)).unwrap_err();
    assert!(err.to_string().contains("sliding_window"), "{err}");
    assert_eq!(LLAMA.sliding_window_period, 0);
}
