//! Generation: a prefill through the scheduler, then decode steps, streamed as text.
//!
//! A [`Session`] holds one request: its tokens and their KV cache. A turn
//! ([`Session::generate`]) prefills the prompt through the same scheduled path as
//! [`crate::prefill`] (plan, engine, queues, stage runner), writing the session's cache in
//! place, then samples ([`Sampler`]: greedy, temperature, top-k, top-p, seeded) and feeds
//! one token per decode step until the model's EOS, a stop string, `max_tokens` or a
//! cancel flag. Text streams through [`TextStream`] (UTF-8 split across byte tokens,
//! stop strings held back). A later turn continues the same cache: the history is never
//! recomputed. [`ChatTemplate`] renders a user message in the model's chat template
//! (ChatML or Gemma's turns).
//!
//! A decode step runs on [`DecodePath::Direct`] (one chain of the prefill's kernels) or
//! [`DecodePath::Scheduled`] (a one-token plan of subgraph instances through the engine);
//! both compute the same operators with the same arithmetic.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::sync::atomic::AtomicBool;
//! use hetsched_exec::generate::{DecodePath, GenerateOptions, Session};
//! use hetsched_exec::{ExecModel, LinearPrecision, PrefillOptions};
//! use hetsched_import::{GgufFile, GgufTokenizer};
//!
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = GgufTokenizer::from_gguf(&file)?;
//! let model = Arc::new(ExecModel::load(&file, LinearPrecision::W8a8)?);
//! let mut session = Session::new(model, PrefillOptions::default(), DecodePath::Direct)?;
//! let options = GenerateOptions { max_tokens: 32, ..GenerateOptions::default() };
//! let never = AtomicBool::new(false);
//! let prompt = tokenizer.encode("The capital of France is")?;
//! let first = session.generate(&prompt, &tokenizer, &options, &never, |t| print!("{t}"))?;
//! // A second turn continues the first one's KV cache.
//! let more = tokenizer.encode(" And of Italy?")?;
//! let second = session.generate(&more, &tokenizer, &options, &never, |t| print!("{t}"))?;
//! println!("\n{:?} then {:?}", first.finish_reason, second.finish_reason);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod attend;
pub mod bandwidth;
mod chat;
pub mod decode_eval;
mod decode_path;
mod decode_run;
mod direct;
mod error;
mod gated_linears;
mod gpu;
mod head;
mod inline;
mod linears;
pub mod requests;
mod samples;
mod sampling;
mod sequence_kv;
mod session;
mod text;
mod turn;

pub use chat::{ChatForm, ChatTemplate};
pub use direct::{DecodeBuffers, decode_batch, decode_step};
pub use error::GenerateError;
pub use head::{HeadRescore, QuantizedHead, RESCORED_CANDIDATES};
pub use samples::{GPU_MAX_SAMPLES, MAX_SAMPLES, Sample, SamplesGenerated};
pub use sampling::{Sampler, Sampling, argmax};
pub use sequence_kv::{KvRows, SequenceKv, SequenceStep};
pub use session::{DecodePath, DecodeTime, Session, WeightBytes};
pub use text::{Pushed, TextStream};
pub use turn::{FinishReason, GenerateOptions, Generated};
