//! Model import: GGUF files (memory-mapped) and their tokenizer.
//!
//! * [`gguf`]: the GGUF v2/v3 container, parsed over a memory map with
//!   zero-copy tensor data, and dequantization of F32/F16/BF16/Q8_0/Q4_0/Q4_1
//!   tensors to f32. Never panics on malformed input: every problem is an
//!   [`ImportError`].
//! * [`llama`]: llama-architecture metadata as a [`LlamaConfig`] and the
//!   model's tensors as shape-checked [`LlamaWeights`].
//! * [`tokenizer`]: a `tokenizers` byte-level BPE tokenizer built from the
//!   GGUF vocabulary ([`GgufTokenizer`]).
//! * [`forward`]: an unchunked f32 reference prefill of the llama model
//!   ([`LlamaModel`]) built from the `hetsched-kernels` operations.
//!
//! See `docs/model-import.md` for the layouts and `scripts/fetch-model.sh`
//! for the test model (SmolLM2-135M-Instruct, Q4_1).
//!
//! # Example
//! ```no_run
//! use hetsched_import::{GgufFile, GgufTokenizer, LlamaModel, top_k};
//!
//! let file = GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = GgufTokenizer::from_gguf(&file)?;
//! let model = LlamaModel::from_gguf(&file)?;
//! let ids = tokenizer.encode("The capital of France is")?;
//! let logits = model.forward_last(&ids)?;
//! let (best, _prob) = top_k(&logits, 1)[0];
//! assert_eq!(tokenizer.decode(&[best])?, " Paris");
//! # Ok::<(), hetsched_import::ImportError>(())
//! ```

pub mod error;
pub mod family;
pub mod forward;
pub mod gguf;
pub mod hf;
pub use hetsched_limits as limits;
pub mod llama;
pub mod source;
pub mod spm;
pub mod tokenizer;

pub use error::ImportError;
pub use family::{Activation, EmbeddingScale, Family, NormStyle};
pub use forward::{LlamaModel, log_sum_exp, token_nll, top_k};
pub use gguf::{GgmlType, GgufFile, GgufHeader, Metadata, MetadataValue, TensorInfo, TensorView};
pub use hf::HfModel;
pub use llama::{LlamaConfig, LlamaLayerWeights, LlamaWeights};
pub use source::{ColumnSource, FamilyTensor, GgufSource, LayerTensor, LlamaSource};
pub use spm::SpmTokenizer;
pub use tokenizer::GgufTokenizer;

/// Where `scripts/fetch-model.sh` puts the test model, relative to the
/// repository root.
pub const TEST_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
