//! Batched decode on SmolLM2-135M: a step of several sequences together gives each
//! sequence the logits of its step alone (within 1e-5 of the largest logit; INT8
//! products exactly), over caches of its own or over a shared prompt prefix; parallel
//! samples under greedy decoding are the single-sequence continuation; bad sample counts
//! are typed errors.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail, not skip,
//! without it), as tests/real_prefill.rs.

mod common;

use common::loaded;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hetsched::exec::generate::{
    DecodeBuffers, DecodePath, GenerateError, GenerateOptions, MAX_SAMPLES, QuantizedHead,
    Sampling, SequenceKv, SequenceStep, Session, decode_batch, decode_step,
};
use hetsched::exec::{ExecModel, KvCache, LinearPrecision, PrefillOptions};
use hetsched::import::GgufFile;

/// Batched against single-sequence logits, relative to the largest single logit.
const RELATIVE: f32 = 1e-5;
/// Positions each test cache holds.
const ROOM: usize = 16;

/// Empty caches of `ROOM` positions, one per layer.
fn caches(model: &ExecModel) -> Vec<KvCache> {
    let kv = ROOM * model.config.kv_dim();
    (0..model.layers.len())
        .map(|_| KvCache {
            k: vec![0.0; kv],
            v: vec![0.0; kv],
        })
        .collect()
}

/// A cache holding `tokens` (fed one step at a time) and the logits after them.
fn fed(model: &ExecModel, head: Option<&QuantizedHead>, tokens: &[u32]) -> Vec<KvCache> {
    let mut cache = caches(model);
    let mut buffers = DecodeBuffers::default();
    for (position, &token) in tokens.iter().enumerate() {
        decode_step(model, head, &mut cache, token, position, &mut buffers).unwrap();
    }
    cache
}

fn assert_close(batched: &[f32], alone: &[f32], what: &str) {
    let largest = alone.iter().fold(0f32, |m, v| m.max(v.abs()));
    let gap = batched
        .iter()
        .zip(alone)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        gap <= RELATIVE * largest,
        "{what}: gap {gap}, largest {largest}"
    );
}

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap()
}

/// Three sequences at different positions, each over its own cache: one batched step
/// equals each sequence's step alone, for every precision of the linears and both heads.
#[test]
fn a_batched_step_gives_each_sequence_its_logits_alone() {
    let l = loaded();
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(hetsched::import::TEST_MODEL_PATH);
    let file = GgufFile::open(&path).unwrap();
    let prompts: Vec<Vec<u32>> = ["The capital of France is", "One, two,", "Hello"]
        .iter()
        .map(|p| l.tokenizer.encode(p).unwrap())
        .collect();
    let next = [11u32, 2000, 42];
    let mut models = vec![l.f32.clone(), l.w8a8.clone()];
    for precision in [LinearPrecision::W4a8, LinearPrecision::W4a8G32] {
        models.push(Arc::new(ExecModel::load(&file, precision).unwrap()));
    }
    let pool = pool();
    for model in &models {
        let int8 = (model.precision != LinearPrecision::F32).then(|| QuantizedHead::int8(model));
        for head in [None, int8.as_ref()] {
            let what = format!("{:?}, int8 head {}", model.precision, head.is_some());
            pool.install(|| {
                let mut buffers = DecodeBuffers::default();
                let mut alone = Vec::new();
                for (p, &token) in prompts.iter().zip(&next) {
                    let mut cache = fed(model, head, p);
                    alone.push(
                        decode_step(model, head, &mut cache, token, p.len(), &mut buffers).unwrap(),
                    );
                }
                let mut own: Vec<Vec<KvCache>> =
                    prompts.iter().map(|p| fed(model, head, p)).collect();
                let mut steps: Vec<SequenceStep<'_>> = own
                    .iter_mut()
                    .zip(prompts.iter().zip(&next))
                    .map(|(cache, (p, &token))| SequenceStep {
                        token,
                        position: p.len(),
                        kv: SequenceKv::alone(cache),
                    })
                    .collect();
                let batched = decode_batch(model, head, &mut steps, &mut buffers).unwrap();
                assert_eq!(batched.len(), 3);
                for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
                    assert_close(b, a, &format!("{what}, sequence {i}"));
                    if model.precision == LinearPrecision::W8a8 && head.is_some() {
                        assert_eq!(b, a, "{what}: INT8 products are exact");
                    }
                }
            });
        }
    }
}

/// Two samples over one shared prompt prefix (read in place, never copied), two steps
/// each: the same logits as one sequence whose own cache holds the prompt.
#[test]
fn samples_over_a_shared_prefix_equal_a_sequence_alone() {
    let l = loaded();
    let model = &l.w8a8;
    let head = QuantizedHead::int8(model);
    let prompt = l.tokenizer.encode("The capital of France is").unwrap();
    let shared = fed(model, Some(&head), &prompt);
    let tokens = [[11u32, 7], [300, 9]];
    let pool = pool();
    pool.install(|| {
        let mut buffers = DecodeBuffers::default();
        let mut tails = [caches(model), caches(model)];
        for (step, position) in (prompt.len()..).take(2).enumerate() {
            let mut steps: Vec<_> = tails
                .iter_mut()
                .zip(&tokens)
                .map(|(tail, t)| SequenceStep {
                    token: t[step],
                    position,
                    kv: SequenceKv::after_prefix(&shared, prompt.len(), tail),
                })
                .collect();
            let batched = decode_batch(model, Some(&head), &mut steps, &mut buffers).unwrap();
            for (sample, t) in tokens.iter().enumerate() {
                let mut alone = fed(model, Some(&head), &prompt);
                let mut logits = Vec::new();
                for (p, &token) in (prompt.len()..).zip(&t[..=step]) {
                    logits = decode_step(model, Some(&head), &mut alone, token, p, &mut buffers)
                        .unwrap();
                }
                assert_eq!(batched[sample], logits, "sample {sample}, step {step}");
            }
        }
    });
}

/// The test model, the prefill options of the samples' sessions (2 threads, chunks of 8)
/// and the prompt they continue.
fn samples_setup() -> (&'static common::Loaded, PrefillOptions, Vec<u32>) {
    let l = loaded();
    let options = PrefillOptions {
        threads: 2,
        chunk_len: 8,
        ..PrefillOptions::default()
    };
    let prompt = l.tokenizer.encode("The capital of France is").unwrap();
    (l, options, prompt)
}

/// Greedy parallel samples are each the single-sequence greedy continuation.
#[test]
fn greedy_samples_equal_the_single_continuation() {
    let (l, options, prompt) = samples_setup();
    let generate = GenerateOptions {
        max_tokens: 8,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let never = AtomicBool::new(false);
    let mut one = Session::new(l.w8a8.clone(), options.clone(), DecodePath::Direct).unwrap();
    let alone = one
        .generate(&prompt, &l.tokenizer, &generate, &never, |_| {})
        .unwrap();
    let mut many = Session::new(l.w8a8.clone(), options, DecodePath::Direct).unwrap();
    let mut streamed = vec![String::new(); 3];
    let samples = many
        .generate_samples(&prompt, &l.tokenizer, &generate, 3, &never, |i, t| {
            streamed[i].push_str(t)
        })
        .unwrap();
    assert_eq!(samples.samples.len(), 3);
    // Each batched step feeds every live sample: 7 steps of 3 tokens.
    assert_eq!(samples.decode_steps, 7);
    assert_eq!(samples.decode_tokens, 21);
    for (i, s) in samples.samples.iter().enumerate() {
        assert_eq!(s.tokens, alone.tokens, "sample {i}");
        assert_eq!(
            s.text, streamed[i],
            "sample {i}: streamed pieces make the text"
        );
    }
}

/// Samples at a temperature, their draws made side by side on the pool, are each the
/// single sequence's continuation under that sample's own seed (`seed + i`): a batched
/// INT8 step's logits equal the sequence's alone bit for bit, so the same draws pick the
/// same tokens.
#[test]
fn sampled_samples_equal_the_single_continuation_of_their_own_seed() {
    let (l, options, prompt) = samples_setup();
    let sampled = |seed| GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: Sampling {
            temperature: 1.2,
            top_k: None,
            top_p: 1.0,
            seed,
        },
        ..GenerateOptions::default()
    };
    let never = AtomicBool::new(false);
    let mut many = Session::new(l.w8a8.clone(), options.clone(), DecodePath::Direct).unwrap();
    let samples = many
        .generate_samples(&prompt, &l.tokenizer, &sampled(40), 4, &never, |_, _| {})
        .unwrap();
    let mut distinct = samples
        .samples
        .iter()
        .map(|s| &s.tokens)
        .collect::<Vec<_>>();
    for (i, s) in samples.samples.iter().enumerate() {
        let mut one = Session::new(l.w8a8.clone(), options.clone(), DecodePath::Direct).unwrap();
        let alone = one
            .generate(
                &prompt,
                &l.tokenizer,
                &sampled(40 + i as u64),
                &never,
                |_| {},
            )
            .unwrap();
        assert_eq!(s.tokens, alone.tokens, "sample {i}");
    }
    distinct.dedup();
    assert!(
        distinct.len() > 1,
        "four seeds at temperature 1.2 drew one text"
    );
}

#[test]
fn sample_counts_out_of_range_are_typed_errors() {
    let l = loaded();
    let prompt = l.tokenizer.encode("Hi").unwrap();
    let never = AtomicBool::new(false);
    let mut session = Session::new(
        l.w8a8.clone(),
        PrefillOptions::default(),
        DecodePath::Direct,
    )
    .unwrap();
    for n in [0, MAX_SAMPLES + 1] {
        let e = session
            .generate_samples(
                &prompt,
                &l.tokenizer,
                &GenerateOptions::default(),
                n,
                &never,
                |_, _| {},
            )
            .unwrap_err();
        assert!(
            matches!(e, GenerateError::Samples { n: got, .. } if got == n),
            "{e}"
        );
    }
    let mut scheduled = Session::new(
        l.w8a8.clone(),
        PrefillOptions::default(),
        DecodePath::Scheduled,
    )
    .unwrap();
    let options = GenerateOptions {
        max_tokens: 2,
        ..GenerateOptions::default()
    };
    let e = scheduled
        .generate_samples(&prompt, &l.tokenizer, &options, 2, &never, |_, _| {})
        .unwrap_err();
    assert!(e.to_string().contains("direct"), "{e}");
}
