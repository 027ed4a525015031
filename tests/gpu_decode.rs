//! With the `gpu` feature: generation with every stage resident on the GPU
//! (`GpuUse::Resident`): the prefill and each decode step run on the GPU lane, continuing
//! the KV cache on the device, and give the CPU f32 path's logits and greedy tokens. The
//! model is the test model cut to its first blocks (`gpu_common::shallow_model`).
//!
//! `cargo test --features gpu --test gpu_decode`. Without a Vulkan device the tests say
//! they skipped, unless `HETSCHED_REQUIRE_GPU=1` (set by CI after installing lavapipe).
#![cfg(feature = "gpu")]

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use hetsched::exec::generate::{
    DecodePath, GenerateError, GenerateOptions, Generated, SamplesGenerated, Sampling, Session,
    argmax,
};
use hetsched::exec::{
    ExecError, ExecModel, GpuDecode, GpuModel, GpuUse, GpuWeights, PrefillOptions, StepRow,
};
use hetsched::import::GgufTokenizer;

mod common;
mod compare;
mod gpu_common;
use common::Loaded;
use gpu_common::{
    gpu_context, gpu_context_with, greedy_steps_agree, shallow_model, unless_no_device,
};

/// The test model cut to its first blocks ([`gpu_common::LAYERS`]), in every form the
/// tests compare, loaded once.
fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| common::load(shallow_model()))
}

/// GPU float kernels (f32, other summation orders) against the CPU path, relative to the
/// largest logit: the prefill test's tolerance (tests/gpu_prefill.rs).
const LOGIT_TOL: f32 = 1e-3;
/// f16 weights and product inputs against the CPU f32 path: the resident prefill's f16
/// tolerance (tests/gpu_prefill.rs).
const F16_LOGIT_TOL: f32 = 5e-3;
/// Decode steps compared one by one.
const STEPS: usize = 10;
/// Decode steps of the f16 comparison: fewer, each a few seconds on lavapipe, where the
/// f16 path's kernels are the f32 path's with another weight type.
const F16_STEPS: usize = 3;

/// Chunks of 5 tokens, so that the prefill has several chunks before the decode steps.
fn options(gpu: GpuUse) -> PrefillOptions {
    PrefillOptions {
        chunk_len: 5,
        threads: 2,
        gpu,
        ..PrefillOptions::default()
    }
}

/// A session with every stage on the GPU and one on the CPU f32 path (direct steps), or
/// `None` (after saying why) when there is no device and none was demanded.
fn sessions(model: &Arc<ExecModel>) -> Option<(Session, Session)> {
    let gpu = unless_no_device(Session::new(
        model.clone(),
        options(GpuUse::Resident),
        DecodePath::Scheduled,
    ))?;
    let cpu = Session::new(model.clone(), options(GpuUse::Off), DecodePath::Direct).unwrap();
    Some((gpu, cpu))
}

/// Each decode step's logits on the GPU match the CPU f32 path's, fed the same tokens
/// (the CPU's greedy choice), and pick the same token.
#[test]
fn gpu_decode_steps_match_the_cpu_f32_path() {
    let l = loaded();
    let Some((mut gpu, mut cpu)) = sessions(&l.f32) else {
        return;
    };
    let prompt = l.tokenizer.encode("The capital of France is").unwrap();
    for s in [&mut gpu, &mut cpu] {
        s.reserve(prompt.len() + STEPS).unwrap();
        s.prefill(&prompt).unwrap();
    }
    // Both start from the f32 reference forward's next token.
    let reference = l.reference.forward_last(&prompt).unwrap();
    assert_eq!(argmax(gpu.logits().unwrap()), argmax(&reference));
    let worst = greedy_steps_agree(&mut gpu, &mut cpu, STEPS, LOGIT_TOL);
    println!("largest relative logit difference over {STEPS} steps: {worst:e}");
}

/// With f16 weights asked for by name (`generate --gpu-weights f16`; the one-dispatch
/// layers' f16 variant where the device runs them), each decode step's logits stay within
/// the f16 tolerance of the CPU f32 path's, fed the same tokens, and pick the same token.
#[test]
fn gpu_decode_steps_with_f16_weights_stay_near_the_cpu_f32_path() {
    let l = loaded();
    let f16 = PrefillOptions {
        gpu_weights: GpuWeights::F16,
        ..options(GpuUse::Resident)
    };
    let Some(mut gpu) = unless_no_device(Session::new(l.f32.clone(), f16, DecodePath::Scheduled))
    else {
        return;
    };
    let mut cpu = Session::new(l.f32.clone(), options(GpuUse::Off), DecodePath::Direct).unwrap();
    let prompt = l.tokenizer.encode("The capital of France is").unwrap();
    for s in [&mut gpu, &mut cpu] {
        s.reserve(prompt.len() + F16_STEPS).unwrap();
        s.prefill(&prompt).unwrap();
    }
    let worst = greedy_steps_agree(&mut gpu, &mut cpu, F16_STEPS, F16_LOGIT_TOL);
    println!("f16 weights: largest relative logit difference over {F16_STEPS} steps: {worst:e}");
}

fn generate(s: &mut Session, tokenizer: &GgufTokenizer, prompt: &str) -> Generated {
    let options = GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let prompt = tokenizer.encode(prompt).unwrap();
    let never = AtomicBool::new(false);
    s.generate(&prompt, tokenizer, &options, &never, |_| {})
        .unwrap()
}

/// Two greedy turns through the streaming API (the second grows the device cache and
/// continues it) give the CPU f32 path's tokens.
#[test]
fn gpu_greedy_turns_equal_the_cpu_f32_path() {
    let l = loaded();
    let Some((mut gpu, mut cpu)) = sessions(&l.f32) else {
        return;
    };
    for prompt in ["The capital of France is", " And the capital of Italy"] {
        let want = generate(&mut cpu, &l.tokenizer, prompt);
        let got = generate(&mut gpu, &l.tokenizer, prompt);
        assert_eq!(got.tokens, want.tokens, "{:?} vs {:?}", got.text, want.text);
        assert!(got.tokens.len() >= 8);
    }
    assert_eq!(gpu.tokens(), cpu.tokens());
    assert!(gpu.decode_time().steps >= 22);
}

/// Direct decode steps run on the CPU: with the KV cache on the GPU they are refused, and
/// INT8 weights are refused by the resident path, each with a clear error.
#[test]
fn gpu_sessions_refuse_direct_steps_and_int8_weights() {
    let l = loaded();
    let direct = Session::new(l.f32.clone(), options(GpuUse::Resident), DecodePath::Direct);
    match direct {
        Err(GenerateError::Exec(ExecError::InvalidOption { option, .. })) => {
            assert_eq!(option, "decode")
        }
        other => panic!("expected the decode path refused, got {other:?}"),
    }
    match Session::new(
        l.w8a8.clone(),
        options(GpuUse::Resident),
        DecodePath::Scheduled,
    ) {
        Err(GenerateError::Exec(ExecError::Gpu(reason))) if reason.contains("f32") => {}
        Err(GenerateError::Exec(ExecError::Gpu(reason)))
            if std::env::var("HETSCHED_REQUIRE_GPU").as_deref() != Ok("1") =>
        {
            println!("skipped: no Vulkan device ({reason})");
        }
        other => panic!("expected a clear GPU error, got {other:?}"),
    }
}

/// Parallel samples of one prompt decoded together on the GPU (one batched step for all
/// of them, each sample's positions in its own region of the device caches after the
/// prompt's rows) give the CPU f32 path's samples: seeded temperature sampling from the
/// logits each step reads back (the samples differ, so a sample that read another's rows
/// would drift), and greedy samples, which take the token the device chose, equal to a
/// single greedy turn. A sample count past the GPU's batch is refused before any work.
#[test]
fn gpu_samples_equal_the_cpu_f32_samples() {
    let l = loaded();
    let Some((mut gpu, _)) = sessions(&l.f32) else {
        return;
    };
    let prompt = l.tokenizer.encode("Once upon a time").unwrap();
    let never = AtomicBool::new(false);
    let sampled = GenerateOptions {
        max_tokens: 8,
        ignore_eos: true,
        sampling: Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: 0.95,
            seed: 7,
        },
        ..GenerateOptions::default()
    };
    let greedy = GenerateOptions {
        sampling: Sampling::default(),
        ..sampled.clone()
    };
    for (turn, n) in [(&sampled, 3), (&greedy, 2)] {
        let mut cpu =
            Session::new(l.f32.clone(), options(GpuUse::Off), DecodePath::Direct).unwrap();
        let mut gpu_turn = Session::new(
            l.f32.clone(),
            options(GpuUse::Resident),
            DecodePath::Scheduled,
        )
        .unwrap();
        let run = |s: &mut Session| {
            s.generate_samples(&prompt, &l.tokenizer, turn, n, &never, |_, _| {})
                .unwrap()
        };
        let (want, got) = (run(&mut cpu), run(&mut gpu_turn));
        let texts = |g: &SamplesGenerated| -> Vec<Vec<u32>> {
            g.samples.iter().map(|s| s.tokens.clone()).collect()
        };
        assert_eq!(texts(&got), texts(&want), "{n} samples");
        assert_eq!(got.decode_tokens, want.decode_tokens);
        if turn.sampling.is_greedy() {
            let alone = gpu.generate(&prompt, &l.tokenizer, turn, &never, |_| {});
            assert_eq!(got.samples[0].tokens, alone.unwrap().tokens);
        } else {
            assert_ne!(got.samples[0].tokens, got.samples[1].tokens, "seeds differ");
        }
    }
    let history = gpu.tokens().len();
    let refused = gpu.generate_samples(&prompt, &l.tokenizer, &greedy, 9, &never, |_, _| {});
    assert!(
        matches!(refused, Err(GenerateError::Samples { n: 9, max: 8 })),
        "{refused:?}"
    );
    assert_eq!(
        gpu.tokens().len(),
        history,
        "the refused samples did no work"
    );
}

/// A batched step is refused before anything runs: more rows than its decoder takes, a
/// position at or past the key bound, a key bound past the caches' rows, or a row whose
/// shifted position lands past them. Each is a typed error; a step within bounds then
/// runs.
#[test]
fn gpu_batched_steps_refuse_rows_outside_the_caches() {
    let l = loaded();
    let Some(ctx) = gpu_context() else {
        return;
    };
    let model = Arc::new(GpuModel::upload(ctx, l.f32.clone()).unwrap());
    let single = GpuDecode::new(model.clone()).unwrap();
    if single.batched_rows() < 3 {
        println!("skipped: this device steps one sequence at a time");
        return;
    }
    let mut decode = single.with_rows(3).unwrap();
    let caches = model.alloc_caches(40).unwrap();
    let row = |position, shift| StepRow {
        token: 1,
        position,
        shift,
    };
    let refused = [
        (vec![row(0, (0, 0)); 4], 20), // 4 rows on a decoder of 3
        (vec![row(5, (4, 10)), row(20, (4, 20))], 20), // position 20 of keys below 20
        (vec![row(5, (0, 0))], 41),    // keys past the 40 rows
        (vec![row(5, (4, 10)), row(12, (4, 30))], 20), // row 12 + 30 past the 40
    ];
    for (rows, keys) in refused {
        let err = decode.prepare(&caches, (&rows, keys), false);
        assert!(
            matches!(err, Err(ExecError::Kernel(_))),
            "{rows:?} below {keys}: {err:?}"
        );
    }
    let token = l.f32.config.vocab_size as u32;
    let err = decode.prepare(&caches, (&[StepRow::alone(token, 0)], 20), false);
    assert!(
        matches!(err, Err(ExecError::TokenOutOfRange { .. })),
        "{err:?}"
    );
    let rows = [row(5, (4, 10)), row(6, (4, 20)), row(3, (4, 30))];
    decode.prepare(&caches, (&rows, 20), false).unwrap();
    assert_eq!(decode.run_now().unwrap().next.len(), 3);
}

/// A step of five dispatches a layer keeps every position at its own cache row, so a row
/// shifted into its own region is refused there (it would read and write the wrong rows),
/// while a shift that starts past the position changes nothing and runs.
#[test]
fn five_dispatch_steps_refuse_shifted_rows() {
    let l = loaded();
    let options = hetsched_gpu::GpuOptions {
        five_dispatch_decode: true,
        ..hetsched_gpu::GpuOptions::default()
    };
    let Some(ctx) = gpu_context_with(options) else {
        return;
    };
    let model = Arc::new(GpuModel::upload(ctx, l.f32.clone()).unwrap());
    let mut decode = GpuDecode::new(model.clone()).unwrap();
    assert_eq!(decode.batched_rows(), 1);
    let caches = model.alloc_caches(40).unwrap();
    let row = |shift| StepRow {
        token: 1,
        position: 5,
        shift,
    };
    let err = decode.prepare(&caches, (&[row((4, 10))], 20), false);
    assert!(matches!(err, Err(ExecError::Kernel(_))), "{err:?}");
    decode
        .prepare(&caches, (&[row((6, 10))], 20), false)
        .unwrap();
    assert_eq!(decode.run_now().unwrap().next.len(), 1);
}
