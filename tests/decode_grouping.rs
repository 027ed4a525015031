//! A scheduled decode step with its decoder layers grouped several to a subgraph instance
//! (`Session::set_decode_layers`, `hetsched_systems::decode_plan`) computes exactly what
//! a step of one instance per layer computes: the same per-layer stages run in the same
//! order on the same kernels, only the scheduler sees fewer instances.
//!
//! Needs the model: run `scripts/fetch-model.sh` first (these tests fail, not skip,
//! without it), as tests/generation.rs.

mod common;

use common::loaded;
use std::sync::Arc;

use hetsched::exec::generate::{DecodePath, GenerateError, Session, argmax};
use hetsched::exec::{ExecError, ExecModel, PrefillOptions};

const PROMPT: &str = "The capital of France is";
/// Greedy decode steps compared.
const STEPS: usize = 6;
/// SmolLM2-135M's decoder layers.
const LAYERS: usize = 30;

fn session(model: &Arc<ExecModel>, layers_per_instance: u32) -> Session {
    let options = PrefillOptions {
        threads: 2,
        chunk_len: 8,
        ..PrefillOptions::default()
    };
    let mut s = Session::new(model.clone(), options, DecodePath::Scheduled).unwrap();
    s.set_decode_layers(layers_per_instance).unwrap();
    s
}

/// What greedy scheduled steps after the prompt gave.
struct Steps {
    /// The token fed at each step.
    tokens: Vec<u32>,
    /// The logits each step left.
    logits: Vec<Vec<f32>>,
    /// Subgraph instances a step ran.
    instances: usize,
}

fn greedy_steps(model: &Arc<ExecModel>, layers_per_instance: u32) -> Steps {
    let prompt = loaded().tokenizer.encode(PROMPT).unwrap();
    let mut s = session(model, layers_per_instance);
    s.reserve(prompt.len() + STEPS).unwrap();
    s.prefill(&prompt).unwrap();
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let token = argmax(s.logits().unwrap());
        s.step(token).unwrap();
        tokens.push(token);
        logits.push(s.logits().unwrap().to_vec());
    }
    let instances = s.decode_instances().unwrap();
    Steps {
        tokens,
        logits,
        instances,
    }
}

/// The f32 reference forward's greedy continuation of the prompt (a full forward per
/// token).
fn reference_greedy(count: usize) -> Vec<u32> {
    let l = loaded();
    let mut tokens = l.tokenizer.encode(PROMPT).unwrap();
    let prompt = tokens.len();
    for _ in 0..count {
        let logits = l.reference.forward_last(&tokens).unwrap();
        tokens.push(argmax(&logits));
    }
    tokens[prompt..].to_vec()
}

#[test]
fn grouped_and_per_layer_decode_steps_give_bit_identical_logits() {
    let l = loaded();
    for (name, model) in [("f32", &l.f32), ("w8a8", &l.w8a8)] {
        let want = greedy_steps(model, 1);
        assert_eq!(
            want.instances,
            LAYERS + 1,
            "{name}: an instance a layer, then the head"
        );
        if name == "f32" {
            // tests/generation.rs compares 20 tokens, refusing near ties.
            assert_eq!(
                want.tokens,
                reference_greedy(STEPS),
                "{name}: the reference's"
            );
        }
        for layers in [2, 5, 7, 30, 64] {
            let got = greedy_steps(model, layers);
            let groups = LAYERS.div_ceil(layers as usize);
            assert_eq!(
                got.instances,
                groups + 1,
                "{name}, {layers} layers an instance"
            );
            assert_eq!(
                got.tokens, want.tokens,
                "{name}, {layers} layers an instance"
            );
            for (step, (got, want)) in got.logits.iter().zip(&want.logits).enumerate() {
                let same = got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name}, {layers} layers an instance, step {step}");
            }
        }
    }
}

#[test]
fn zero_layers_an_instance_is_refused() {
    let options = PrefillOptions::default();
    let mut s = Session::new(loaded().f32.clone(), options, DecodePath::Scheduled).unwrap();
    let err = s.set_decode_layers(0).unwrap_err();
    assert!(
        matches!(
            err,
            GenerateError::Exec(ExecError::InvalidOption {
                option: "decode layers",
                ..
            })
        ),
        "{err}"
    );
}
