//! `--precision w4a8-g32` and `w4a8-g128` end to end on tiny synthetic llama files written
//! by the project's GGUF writer: `w4a8-g32` refused with a clear error when a linear's
//! input width is not a multiple of the activation group (32), and, where every width is,
//! prefilled in chunks like the per-tensor W4A8 path on the same 4-bit weights;
//! `w4a8-g128` on any width (a row's last activation group of 128 may be short), its
//! prefill following the other two.

use std::sync::Arc;

use hetsched::exec::{ExecModel, LinearPrecision, PrefillOptions, prefill};
use hetsched::import::gguf::writer::{GgufWriter, TinyModel, seeded_values};
use hetsched::import::{GgufFile, ImportError};

mod compare;
use compare::max_relative_diff;

const VOCAB: usize = 16;
const PROMPT: [u32; 9] = [2, 7, 1, 8, 2, 8, 1, 8, 4];

fn tiny_llama(hidden: usize, ffn: usize) -> GgufFile {
    let m = TinyModel {
        arch: "llama",
        layers: 2,
        hidden,
        heads: 2,
        kv_heads: 1,
        ffn,
        vocab: VOCAB,
        context: 64,
        tied: true,
    };
    GgufFile::from_bytes(GgufWriter::tiny_model(&m, seeded_values).to_bytes()).unwrap()
}

#[test]
fn widths_that_are_not_whole_groups_are_refused_by_name() {
    let err = ExecModel::load(&tiny_llama(8, 12), LinearPrecision::W4a8G32).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ImportError::InvalidConfig(_)), "{err:?}");
    assert!(
        message.contains("w4a8-g32") && message.contains("multiples of 32"),
        "{message}"
    );
    assert!(message.contains("layer 0"), "{message}");
    // The per-tensor W4A8 has no such rule.
    assert!(ExecModel::load(&tiny_llama(8, 12), LinearPrecision::W4a8).is_ok());
}

#[test]
fn whole_groups_prefill_like_per_tensor_w4a8() {
    // Hidden 64 (two heads of 32), FFN 96: every input width is whole groups of 32.
    let file = tiny_llama(64, 96);
    let logits = |precision| logits(&file, precision);
    // The same 4-bit weights; only the INT8 activations' scales differ (per group of 32
    // against per tensor: about 0.4% error each on these activations without outliers).
    // On these random weights the logits are small sums of cancelling terms, so the
    // 4-bit weights alone move them by half the largest logit against the f32 forward:
    // the per-tensor W4A8 path is the reference that isolates the activations.
    let (grouped, per_tensor) = (
        logits(LinearPrecision::W4a8G32),
        logits(LinearPrecision::W4a8),
    );
    let diff = max_relative_diff(&grouped, &per_tensor);
    // Measured 0.067 (mostly the per-tensor side's rounding, amplified by the
    // cancellation); a misplaced scale or group reads O(1).
    assert!(diff <= 0.1, "w4a8-g32 against w4a8: relative diff {diff}");
    assert!(
        grouped != per_tensor,
        "the activations are quantized differently"
    );
    let f32 = logits(LinearPrecision::F32);
    assert!(max_relative_diff(&grouped, &f32) < 1.0);
}

fn logits(file: &GgufFile, precision: LinearPrecision) -> Vec<f32> {
    let options = PrefillOptions {
        chunk_len: 4,
        threads: 2,
        all_logits: true,
        ..PrefillOptions::default()
    };
    let model = Arc::new(ExecModel::load(file, precision).unwrap());
    prefill(model, &PROMPT, &options).unwrap().logits
}

#[test]
fn g128_runs_widths_that_are_not_whole_groups() {
    // Hidden 8 and FFN 12: w4a8-g32 refuses these widths, w4a8-g128 takes one short
    // activation group per row.
    let file = tiny_llama(8, 12);
    assert!(ExecModel::load(&file, LinearPrecision::W4a8G32).is_err());
    let got = logits(&file, LinearPrecision::W4a8G128);
    assert!(
        got.len() >= VOCAB && got.len().is_multiple_of(VOCAB),
        "{}",
        got.len()
    );
    assert!(got.iter().all(|v| v.is_finite()));
}

#[test]
fn g128_prefill_follows_the_per_32_and_per_tensor_paths() {
    // Hidden 160 (two heads of 80), FFN 288: rows of one whole and one short activation
    // group of 128 (160), two whole and one short (288), all whole groups of 32.
    let file = tiny_llama(160, 288);
    let g128 = logits(&file, LinearPrecision::W4a8G128);
    let g32 = logits(&file, LinearPrecision::W4a8G32);
    let per_tensor = logits(&file, LinearPrecision::W4a8);
    // The same 4-bit weights; only the activation scales differ (about 0.4% error per
    // value on these activations without outliers). On random weights the logits are
    // small sums of cancelling terms, which amplify that rounding: w4a8-g32 reads 0.067
    // against per-tensor W4A8 on a similar file (tests/w4a8_g32.rs); a misplaced scale or
    // group reads O(1).
    for (name, other) in [("w4a8-g32", &g32), ("w4a8", &per_tensor)] {
        let diff = max_relative_diff(&g128, other);
        println!("w4a8-g128 against {name}: relative diff {diff}");
        assert!(
            diff <= 0.1,
            "w4a8-g128 against {name}: relative diff {diff}"
        );
    }
    assert!(g128 != g32, "the activations are quantized differently");
}

/// Direct decode steps of a W4A8 model run the head at its own width, 4 bits, with its
/// best candidates rescored from INT8 rows: every layer reads the same bytes as with an
/// INT8 head, the head a packed 4-bit matrix and the candidates' rows (here all 16 rows,
/// fewer than the candidates), and the logits stay within rounding of the INT8 head's for
/// each W4A8 activation rule.
#[test]
fn direct_decode_runs_a_four_bit_head() {
    use hetsched::exec::generate::{DecodePath, Session};
    let file = tiny_llama(64, 128);
    for precision in [
        LinearPrecision::W4a8G32,
        LinearPrecision::W4a8G128,
        LinearPrecision::W4a8,
    ] {
        let model = Arc::new(ExecModel::load(&file, precision).unwrap());
        let step = |path| {
            let options = PrefillOptions {
                threads: 1,
                chunk_len: 8,
                ..PrefillOptions::default()
            };
            let mut session = Session::new(model.clone(), options, path).unwrap();
            session.prefill(&PROMPT).unwrap();
            session.step(3).unwrap();
            let logits = session.logits().unwrap().to_vec();
            (session.weight_bytes_per_token(), logits)
        };
        let (four_bit, own) = step(DecodePath::Direct);
        let (int8, reference) = step(DecodePath::DirectInt8Head);
        assert_eq!(four_bit.layers, int8.layers, "{precision:?}");
        // 16 x 64: 512 bytes of nibbles and 160 of scales, and 16 rows of 64 bytes and a
        // scale, against 1024 + 128.
        assert_eq!(
            (four_bit.head, int8.head),
            (672 + 16 * 68, 1152),
            "{precision:?}"
        );
        assert!(own != reference, "{precision:?}: another head ran");
        let diff = max_relative_diff(&own, &reference);
        println!("{precision:?}: 4-bit head against INT8: relative diff {diff}");
        assert!(diff <= 0.15, "{precision:?}: relative diff {diff}");
    }
}
