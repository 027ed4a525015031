//! The one error type of model import: every bad input is a variant, never a panic.

use std::path::PathBuf;

use thiserror::Error;

use super::gguf::GgmlType;

/// Everything that can go wrong while reading a GGUF file, interpreting its
/// metadata as a llama model, building its tokenizer or running the reference
/// forward pass.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File that failed.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A safetensors file or a Hugging Face `config.json` could not be read.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}: not a GGUF file (expected the bytes \"GGUF\")")]
    BadMagic {
        /// The first bytes of the file (fewer than 4 if it is that short).
        found: Vec<u8>,
    },
    /// A version other than 2 or 3 (version 1 used 32-bit counts; a big-endian
    /// file reads as a huge version).
    #[error("unsupported GGUF version {0} (supported: 2 and 3, little-endian)")]
    UnsupportedVersion(u32),
    /// A read went past the end of the file.
    #[error(
        "truncated file: reading {needed} bytes at offset {offset} overruns the {len}-byte file"
    )]
    Truncated {
        /// Byte offset of the read.
        offset: usize,
        /// Bytes the read needed.
        needed: u64,
        /// Length of the file.
        len: usize,
    },
    /// A count or length larger than the rest of the file could possibly hold.
    #[error(
        "absurd {what} {count} at offset {offset}: the {remaining} remaining bytes cannot hold it"
    )]
    AbsurdCount {
        /// What was counted (tensors, key/value pairs, array elements, string bytes).
        what: &'static str,
        /// The count read from the file.
        count: u64,
        /// Byte offset just after the count.
        offset: usize,
        /// Bytes left in the file after the count.
        remaining: usize,
    },
    /// A metadata value type id outside the GGUF specification.
    #[error("unknown metadata value type {ty} at offset {offset}")]
    UnknownValueType {
        /// The type id read.
        ty: u32,
        /// Byte offset of the type id.
        offset: usize,
    },
    /// Arrays nested deeper than [`super::gguf::MAX_ARRAY_NESTING`].
    #[error("metadata arrays nested too deeply at offset {offset}")]
    NestingTooDeep {
        /// Byte offset of the innermost array header.
        offset: usize,
    },
    /// A string that is not UTF-8.
    #[error("string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Byte offset of the string's bytes.
        offset: usize,
    },
    /// A boolean byte other than 0 or 1.
    #[error("invalid bool byte {value} at offset {offset}")]
    InvalidBool {
        /// The byte read.
        value: u8,
        /// Its offset.
        offset: usize,
    },
    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name appears twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// `general.alignment` is zero or not a power of two.
    #[error("invalid general.alignment {0} (must be a non-zero power of two)")]
    BadAlignment(u64),
    /// A tensor's dimensions are unusable: no dimension or more than four, an
    /// element count that overflows, or a row length that is not a multiple
    /// of the type's block size.
    #[error("tensor {name:?}: invalid dims {dims:?} (innermost first): {reason}")]
    BadTensorDims {
        /// Tensor name.
        name: String,
        /// Dims as stored (innermost first).
        dims: Vec<u64>,
        /// Why they are rejected.
        reason: &'static str,
    },
    /// A tensor type id that ggml does not define.
    #[error("tensor {name:?}: unknown ggml tensor type {ty}")]
    UnknownTensorType {
        /// Tensor name.
        name: String,
        /// Type id read.
        ty: u32,
    },
    /// A known ggml tensor type that this importer cannot dequantize.
    #[error(
        "tensor {name:?}: tensor type {ty:?} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
    )]
    UnsupportedTensorType {
        /// Tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A tensor's bytes extend past the end of the file.
    #[error(
        "tensor {name:?}: data [{start}, {start}+{size}) is out of bounds of the {len}-byte file"
    )]
    TensorOutOfBounds {
        /// Tensor name.
        name: String,
        /// Absolute byte offset of the data.
        start: u64,
        /// Byte size of the data.
        size: u64,
        /// Length of the file.
        len: usize,
    },
    /// Two tensors' data ranges share bytes.
    #[error(
        "tensors {first:?} and {second:?} overlap: the first ends at data offset {end}, the second starts at {start}; the file is corrupt"
    )]
    TensorsOverlap {
        /// The tensor that starts first.
        first: String,
        /// The tensor it runs into.
        second: String,
        /// End of the first's data (relative to the data section).
        end: u64,
        /// Start of the second's.
        start: u64,
    },
    /// A tensor's type and shape do not account for the bytes it owns.
    #[error(
        "tensor {name:?} of type {ty:?} needs {size} bytes but owns {space} up to the next tensor or the end of the file: its type or shape was changed; the file is corrupt"
    )]
    TensorSizeMismatch {
        /// Tensor name.
        name: String,
        /// Its declared type.
        ty: GgmlType,
        /// Bytes its type and shape need.
        size: u64,
        /// Bytes it owns.
        space: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// Tensor name.
        name: String,
        /// Offset relative to the data section.
        offset: u64,
        /// Required alignment.
        alignment: u64,
    },
    /// A required metadata key is absent.
    #[error("missing required metadata key {0:?}")]
    MissingKey(String),
    /// A metadata key holds a value of the wrong type or range.
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongKeyType {
        /// The key.
        key: String,
        /// What was expected.
        expected: &'static str,
        /// What was found (type name or value).
        found: String,
    },
    /// A required tensor is absent.
    #[error("missing required tensor {0:?}")]
    MissingTensor(String),
    /// A tensor's shape disagrees with the model configuration.
    #[error("tensor {name:?}: shape {found:?} (outermost first), expected {expected:?}")]
    ShapeMismatch {
        /// Tensor name.
        name: String,
        /// Expected outermost-first shape.
        expected: Vec<usize>,
        /// Shape in the file, outermost first.
        found: Vec<usize>,
    },
    /// `general.architecture` is not one this importer handles.
    #[error("unsupported model architecture {0:?} (supported: \"llama\", \"qwen2\", \"gemma3\")")]
    UnsupportedArchitecture(String),
    /// A RoPE scaling type the importer does not compute (YaRN, LongRoPE, ...): only
    /// `none`, `linear` and Llama-3's `rope_freqs.weight` factors are.
    #[error(
        "{key} = {kind:?}: this RoPE scaling is not supported (supported: none, linear, and Llama-3's per-frequency factors in rope_freqs.weight)"
    )]
    UnsupportedRopeScaling {
        /// The metadata key (`llama.rope.scaling.type`).
        key: String,
        /// Its value (`yarn`, `longrope`, ...).
        kind: String,
    },
    /// Inconsistent hyper-parameters.
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    /// A weight that is NaN or infinite: a corrupt file, or a bad conversion.
    #[error(
        "tensor {tensor} holds a non-finite weight ({value} at element {index}): the file is corrupt or badly converted; re-export the model"
    )]
    NonFiniteWeight {
        /// The tensor's name in the file.
        tensor: String,
        /// Index of the first bad element (row-major).
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A size past the limits (docs/robustness.md), refused before allocating.
    #[error(transparent)]
    Limit(#[from] crate::limits::LimitError),
    /// A tokenizer model or pre-tokenizer this importer does not build.
    #[error("unsupported tokenizer: {0}")]
    UnsupportedTokenizer(String),
    /// The `tokenizers` crate rejected the vocabulary or failed to run.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A forward pass over no tokens.
    #[error("empty prompt: a forward pass needs at least one token")]
    EmptyPrompt,
    /// A prompt longer than the model's context.
    #[error("prompt of {len} tokens exceeds the context length {context}")]
    PromptTooLong {
        /// Prompt length.
        len: usize,
        /// `llama.context_length`.
        context: usize,
    },
}

/// Result alias of this module.
pub type Result<T, E = ImportError> = std::result::Result<T, E>;

/// Passes `values` through if every one is finite, else fails naming `tensor` (weights
/// are checked once, as they are decoded: a NaN would otherwise poison every logit, or be
/// silently zeroed by INT8 quantization).
pub(crate) fn finite_weights(tensor: &str, values: Vec<f32>) -> Result<Vec<f32>, ImportError> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(values),
        Some(index) => Err(ImportError::NonFiniteWeight {
            tensor: tensor.to_string(),
            index,
            value: values[index],
        }),
    }
}
