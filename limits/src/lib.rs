//! The limits untrusted input is checked against before anything is allocated from it:
//! one table for every reader (GGUF, `config.json`, scene/device/model TOML, calibration
//! JSON) and the cost arithmetic. docs/robustness.md lists them with their reasons.
//!
//! Each maximum is far above any released model (the largest have ~128 layers, hidden
//! 16384, vocab 256k, context 1M), and low enough that what the readers allocate from it
//! (a RoPE table of context × head dim, per-layer vectors, a channel mask) stays small.
//! A reader also checks a count against the bytes its file has left where it can.

use std::io::Read;
use std::path::Path;

use thiserror::Error;

/// Decoder layers.
pub const MAX_LAYERS: u64 = 1024;
/// Hidden (embedding) size, and so the channels of an attention-input site.
pub const MAX_HIDDEN: u64 = 65_536;
/// Attention heads (query or key/value).
pub const MAX_HEADS: u64 = 1024;
/// Feed-forward size, and so the channels of the down projection's site.
pub const MAX_FFN: u64 = 1 << 20;
/// Vocabulary entries.
pub const MAX_VOCAB: u64 = 1 << 22;
/// Context length in tokens (the RoPE table holds context × head dim floats).
pub const MAX_CONTEXT: u64 = 1 << 20;
/// Channels of one calibrated activation site: the larger of hidden and FFN.
pub const MAX_CHANNELS: u64 = MAX_FFN;
/// Tensors in a GGUF file (a 70B llama has 723; large mixtures of experts a few
/// thousand).
pub const MAX_TENSORS: u64 = 1 << 20;
/// Metadata key/value entries in a GGUF file.
pub const MAX_METADATA_ENTRIES: u64 = 1 << 20;
/// Elements of one GGUF metadata array (vocabularies and merge lists: a few 100k). Each
/// element is held as a `MetadataValue` of 32+ bytes, whatever its size in the file.
pub const MAX_METADATA_ARRAY: u64 = 1 << 24;
/// Subgraph instances of one plan (chunks × stages): the plan keeps a few words per
/// instance and lane, the world an entity of several components (a shipped scene has a
/// few hundred; a 1M-token prompt of a 32-layer model in 4k-token chunks, ~50k).
pub const MAX_INSTANCES: u64 = 1 << 20;
/// Scene, device and model TOML files, and `config.json`: a few KiB in practice.
pub const MAX_TEXT_FILE_BYTES: u64 = 4 << 20;
/// A calibration JSON file (a 7B model's is a few MiB).
pub const MAX_CALIBRATION_BYTES: u64 = 256 << 20;
/// A run-history file (`run --history`, JSON Lines): about 250 bytes per measured
/// instance, a few thousand instances per run, so some thousand runs; it is read line by
/// line, never whole.
pub const MAX_HISTORY_BYTES: u64 = 256 << 20;
/// Total modeled time of a plan on one processor, in ns (about 36 years): every sum the
/// plan and its bounds form stays below u64::MAX with room to spare.
pub const MAX_MODELED_NS: f64 = (1u64 << 60) as f64;

/// A value past its limit.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error(
    "{what} = {value} is above the limit of {max}: the file is corrupt or not a model this build supports (limits in docs/robustness.md)"
)]
pub struct LimitError {
    /// What was checked, e.g. `context_length`.
    pub what: String,
    /// Its value.
    pub value: u64,
    /// The limit.
    pub max: u64,
}

/// Fails if `value` exceeds `max`.
pub fn check(what: &str, value: u64, max: u64) -> Result<(), LimitError> {
    if value > max {
        return Err(LimitError {
            what: what.to_string(),
            value,
            max,
        });
    }
    Ok(())
}

/// Reads a UTF-8 text file of at most `max` bytes. A larger file (or an endless one,
/// like `/dev/zero`) fails with [`std::io::ErrorKind::FileTooLarge`] after reading
/// `max + 1` bytes, never more.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("larger than the limit of {max} bytes for this kind of file"),
        ));
    }
    Ok(text)
}
