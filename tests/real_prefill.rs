//! Real prefill of SmolLM2-135M through the scheduler: chunked, out-of-order execution
//! on thread queues equals the unchunked f32 reference forward; the W8A8 (emulated
//! NPU) path's agreement with f32 is measured; bad prompts are refused.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail, not skip,
//! without it).

mod common;
mod compare;

use common::loaded;
use compare::max_relative_diff;
use std::path::PathBuf;
use std::sync::Arc;

use hetsched::exec::{ExecError, ExecModel, LinearPrecision, PrefillOptions, evaluate, prefill};
use hetsched::import::{GgufFile, TEST_MODEL_PATH, top_k};
use hetsched::systems::testing::{Timing, check_schedule};
use hetsched::systems::{PlacementConfig, PolicyRegistry};

/// Logits of the chunked run against the reference: max |diff| <= this × max |logit|.
const LOGIT_TOL: f32 = 1e-3;

fn options(chunk_len: u32, policy: &str) -> PrefillOptions {
    PrefillOptions {
        chunk_len,
        policy: policy.to_string(),
        threads: 2,
        ..PrefillOptions::default()
    }
}

/// Whether the built-in policy keeps every instance on its home processor.
fn home_only(policy: &str) -> bool {
    !PolicyRegistry::builtin()
        .create(policy)
        .unwrap()
        .chooses_placement()
}

const PASSAGE: &str = "The quick brown fox jumps over the lazy dog. Rust is a systems \
programming language that runs blazingly fast, prevents segfaults, and guarantees thread \
safety. A prompt is cut into fixed-size chunks, and each chunk runs through the graph.";

#[test]
fn chunked_out_of_order_prefill_equals_the_reference() {
    let l = loaded();
    let tokens = l.tokenizer.encode(PASSAGE).unwrap();
    assert!(tokens.len() > 48, "{} tokens", tokens.len());
    let want = l.reference.forward_last(&tokens).unwrap();
    for policy in ["stall", "lookahead", "inorder", "peer"] {
        let run = prefill(l.f32.clone(), &tokens, &options(16, policy)).unwrap();
        let diff = max_relative_diff(&run.logits, &want);
        println!(
            "{policy:?}: {} tokens in chunks of 16, max relative logit diff {diff:.2e}",
            tokens.len()
        );
        assert!(diff <= LOGIT_TOL, "{policy:?}: relative diff {diff}");
        let plan = &run.outcome.plan;
        check_schedule(
            plan,
            &run.outcome.timeline.slices,
            Timing::Measured,
            home_only(policy),
        )
        .unwrap();
        if policy == "stall" {
            // Out of order: some chunk starts a subgraph before an earlier chunk has
            // finished all of its own.
            let slices = &run.outcome.timeline.slices;
            let last_end = |chunk| {
                slices
                    .iter()
                    .filter(|s| s.key.chunk == chunk)
                    .map(|s| s.end_ns)
                    .max()
                    .unwrap()
            };
            let interleaved = slices
                .iter()
                .any(|s| s.key.chunk > 0 && s.start_ns < last_end(s.key.chunk - 1));
            assert!(
                interleaved,
                "the stall policy ran the chunks strictly one after another"
            );
        }
    }
}

#[test]
fn flexible_placement_runs_each_job_where_the_dispatcher_placed_it() {
    // INT8 linears on the emulated NPU or the CPU, float stages on the CPU or the
    // emulated NPU: each job runs on the lane the dispatcher chose at run time.
    let l = loaded();
    let tokens = l.tokenizer.encode(PASSAGE).unwrap();
    let want = l.reference.forward_last(&tokens).unwrap();
    for policy in ["heft", "balance"] {
        let flexible = PrefillOptions {
            placement: PlacementConfig {
                int8_linear: Some(vec!["npu-emu".into(), "cpu".into()]),
                attention: Some(vec!["cpu".into(), "npu-emu".into()]),
                float: Some(vec!["cpu".into(), "npu-emu".into()]),
                shadow: None,
            },
            ..options(16, policy)
        };
        let run = prefill(l.f32.clone(), &tokens, &flexible).unwrap();
        let plan = &run.outcome.plan;
        check_schedule(plan, &run.outcome.timeline.slices, Timing::Measured, false).unwrap();
        let away = run
            .outcome
            .timeline
            .slices
            .iter()
            .filter(|s| s.processor != plan.processor(s.key))
            .count();
        assert!(away > 0, "{policy}: every job ran on its home processor");
        let diff = max_relative_diff(&run.logits, &want);
        println!("{policy}: {away} jobs off their home lane; max relative logit diff {diff:.2e}");
        assert!(diff <= LOGIT_TOL, "{policy}: relative diff {diff}");
    }
}

#[test]
fn greedy_next_token_matches_the_reference() {
    let l = loaded();
    for prompt in [
        "The capital of France is",
        "Monday, Tuesday, Wednesday, Thursday,",
        "def fibonacci(n):\n    if n <",
    ] {
        let tokens = l.tokenizer.encode(prompt).unwrap();
        let want = top_k(&l.reference.forward_last(&tokens).unwrap(), 1)[0].0;
        let got = prefill(l.f32.clone(), &tokens, &options(4, "stall")).unwrap();
        assert_eq!(top_k(&got.logits, 1)[0].0, want, "{prompt:?}");
    }
}

/// KL(p || q) of two logit vectors' softmax distributions, in nats.
fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let log_softmax = |l: &[f32]| {
        let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
        l.iter().map(|&v| v as f64 - lse).collect::<Vec<_>>()
    };
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

#[test]
fn w8a8_agrees_with_f32_on_the_next_token() {
    let l = loaded();
    let prompts = [
        "The capital of France is",
        "Monday, Tuesday, Wednesday, Thursday,",
        "One, two, three, four,",
        PASSAGE,
        "The capital of Germany is",
        "def fibonacci(n):\n    if n <",
    ];
    let (mut agree, mut kl_sum) = (0, 0.0);
    for prompt in prompts {
        let tokens = l.tokenizer.encode(prompt).unwrap();
        let f = prefill(l.f32.clone(), &tokens, &options(32, "stall")).unwrap();
        let q = prefill(l.w8a8.clone(), &tokens, &options(32, "stall")).unwrap();
        let same = top_k(&f.logits, 1)[0].0 == top_k(&q.logits, 1)[0].0;
        let kl = kl_divergence(&f.logits, &q.logits);
        println!("{prompt:?}: top-1 same = {same}, KL(f32 || w8a8) = {kl:.4}");
        agree += usize::from(same);
        kl_sum += kl;
    }
    let mean_kl = kl_sum / prompts.len() as f64;
    println!(
        "W8A8 vs f32: top-1 agreement {agree}/{}, mean KL {mean_kl:.4} nats",
        prompts.len()
    );
    // Per-tensor W8A8 without outlier handling loses accuracy (seed 000 section 3.3: the
    // activation outliers stretch the one scale); measured here: 4/6 and 0.67 nats. The
    // bounds guard against a broken quantized path (which gives near-random tokens and
    // KL of several nats); outlier shadowing is what closes the remaining gap.
    assert!(
        agree * 2 >= prompts.len(),
        "top-1 agreement {agree}/{}",
        prompts.len()
    );
    assert!(mean_kl < 1.0, "mean KL {mean_kl}");
}

#[test]
fn bad_prompts_are_refused_before_any_work() {
    let l = loaded();
    let opts = options(16, "stall");
    assert!(matches!(
        prefill(l.w8a8.clone(), &[], &opts),
        Err(ExecError::EmptyPrompt)
    ));
    let context = l.w8a8.config.context_length;
    let too_long = vec![1u32; context + 1];
    let err = prefill(l.w8a8.clone(), &too_long, &opts).unwrap_err();
    assert!(matches!(err, ExecError::PromptTooLong { .. }), "{err}");
    assert!(err.to_string().contains("shorten the prompt"), "{err}");
    let vocab = l.w8a8.config.vocab_size as u32;
    let err = prefill(l.w8a8.clone(), &[1, vocab], &opts).unwrap_err();
    assert!(
        matches!(err, ExecError::TokenOutOfRange { id, .. } if id == vocab),
        "{err}"
    );
}

#[test]
fn eval_perplexity_equals_the_reference_forward() {
    let l = loaded();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| PASSAGE.repeat(4));
    let tokens = l.tokenizer.encode(&text).unwrap();
    let ctx = 48;
    let opts = options(16, "stall");
    let f32_report = evaluate(&l.f32, &l.f32, &tokens, ctx, 2, &opts).unwrap();
    // The same windows through the unchunked reference forward.
    let vocab = l.f32.config.vocab_size;
    let mut nll = 0f64;
    for window in tokens.chunks_exact(ctx).take(2) {
        let logits = l.reference.forward_all(window).unwrap();
        for t in 0..ctx - 1 {
            let row = &logits[t * vocab..(t + 1) * vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            nll -= row[window[t + 1] as usize] as f64 - lse;
        }
    }
    let want = (nll / (2 * (ctx - 1)) as f64).exp();
    println!(
        "eval f32 perplexity {:.4}, reference {want:.4}",
        f32_report.perplexity
    );
    assert_eq!(f32_report.tokens, 2 * (ctx - 1));
    assert!((f32_report.perplexity - want).abs() <= 1e-3 * want);
    assert_eq!(f32_report.kl_divergence, 0.0);
    assert_eq!(f32_report.top1_agreement, 1.0);

    let w8a8 = evaluate(&l.w8a8, &l.f32, &tokens, ctx, 2, &opts).unwrap();
    println!("{w8a8:?}");
    assert_eq!(w8a8.precision, "w8a8");
    assert!((w8a8.perplexity_f32 - want).abs() <= 1e-3 * want);
    assert!(w8a8.kl_divergence > 0.0 && w8a8.top1_agreement < 1.0);
    assert!(matches!(
        evaluate(&l.f32, &l.f32, &tokens[..10], ctx, 2, &opts),
        Err(ExecError::InvalidEval(_))
    ));
}

#[test]
fn shadowing_recovers_what_per_tensor_w8a8_loses() {
    let l = loaded();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    let shadow = Arc::new(
        ExecModel::load(&GgufFile::open(&path).unwrap(), LinearPrecision::W8a8Shadow).unwrap(),
    );
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| PASSAGE.repeat(4));
    let tokens = l.tokenizer.encode(&text).unwrap();
    let opts = options(64, "stall");
    let plain = evaluate(&l.w8a8, &l.f32, &tokens, 64, 2, &opts).unwrap();
    let shadowed = evaluate(&shadow, &l.f32, &tokens, 64, 2, &opts).unwrap();
    println!("plain {plain:?}\nshadow {shadowed:?}");
    // Measured on 8 windows of 256 tokens: f32 28.43, w8a8 61.94, w8a8-shadow 28.46 (KL
    // 0.0024). On these 126 tokens: KL 0.0055, perplexity +5.4%: perplexity on so few
    // tokens moves by several percent between settings of equal KL (docs/outliers.md), so
    // the bound on it is loose and KL carries the test.
    assert!(shadowed.kl_divergence < plain.kl_divergence / 10.0);
    assert!(shadowed.kl_divergence < 0.01, "{shadowed:?}");
    assert!(
        shadowed.perplexity <= 1.08 * shadowed.perplexity_f32,
        "{shadowed:?}"
    );
    assert!(shadowed.top1_agreement > plain.top1_agreement);
}

#[test]
fn w4a8_halves_the_weights_and_the_shadow_recovers_its_activations() {
    let l = loaded();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    let file = GgufFile::open(&path).unwrap();
    let w4a8 = Arc::new(ExecModel::load(&file, LinearPrecision::W4a8).unwrap());
    let shadow = Arc::new(ExecModel::load(&file, LinearPrecision::W4a8Shadow).unwrap());
    // 0.5 + 1/32 bytes per weight and 8 per row, against 1 byte and 8 per row.
    let ratio = w4a8.linear_weight_bytes() as f64 / l.w8a8.linear_weight_bytes() as f64;
    assert!(
        (0.52..0.55).contains(&ratio),
        "W4A8 / W8A8 weight bytes {ratio}"
    );
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| PASSAGE.repeat(4));
    let tokens = l.tokenizer.encode(&text).unwrap();
    let opts = options(64, "stall");
    let plain = evaluate(&w4a8, &l.f32, &tokens, 64, 2, &opts).unwrap();
    let shadowed = evaluate(&shadow, &l.f32, &tokens, 64, 2, &opts).unwrap();
    println!("w4a8 {plain:?}\nw4a8-shadow {shadowed:?}");
    assert_eq!(
        (plain.precision, shadowed.precision),
        ("w4a8", "w4a8-shadow")
    );
    // Over all of GPL-3 at context 512 (second halves scored): KL 1.06 (per-tensor)
    // against 0.126 (shadow), docs/real-execution.md. On these 126 tokens, every position
    // scored: 1.82 against 0.56; the 4-bit weights keep the shadow's KL above W8A8's.
    assert!(
        shadowed.kl_divergence < plain.kl_divergence / 2.0,
        "{shadowed:?}"
    );
    assert!(shadowed.kl_divergence < 0.8, "{shadowed:?}");
    assert!(shadowed.top1_agreement > plain.top1_agreement);
}

#[test]
fn w4a8_g32_keeps_the_w4a8_weights_and_recovers_its_activations_without_a_shadow() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
    let file = GgufFile::open(&path).unwrap();
    let l = loaded();
    let w4a8 = Arc::new(ExecModel::load(&file, LinearPrecision::W4a8).unwrap());
    let grouped = Arc::new(ExecModel::load(&file, LinearPrecision::W4a8G32).unwrap());
    // The same packed 4-bit weights; the group scales are activations', not resident.
    assert_eq!(grouped.linear_weight_bytes(), w4a8.linear_weight_bytes());
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .unwrap_or_else(|_| PASSAGE.repeat(4));
    let tokens = l.tokenizer.encode(&text).unwrap();
    let opts = options(64, "stall");
    let plain = evaluate(&w4a8, &l.f32, &tokens, 64, 2, &opts).unwrap();
    let g32 = evaluate(&grouped, &l.f32, &tokens, 64, 2, &opts).unwrap();
    println!("w4a8 {plain:?}\nw4a8-g32 {g32:?}");
    assert_eq!(g32.precision, "w4a8-g32");
    assert!(g32.shadow.is_none());
    // Over all of GPL-3 at context 512 (second halves scored): KL 1.06 (per-tensor)
    // against 0.295 (per group of 32), docs/real-execution.md. On these 126 tokens, every
    // position scored: KL 1.82 against 0.62, perplexity 154 against 37.9 (f32 36.1; most
    // of what is left is the 4-bit weights' error).
    assert!(g32.kl_divergence < plain.kl_divergence / 2.5, "{g32:?}");
    assert!(g32.perplexity < 1.15 * g32.perplexity_f32, "{g32:?}");
    assert!(g32.top1_agreement > plain.top1_agreement);
}
