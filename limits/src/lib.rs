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
/// A prompt file (`run`, `generate`, `profile --prompt-file`): the largest context
/// (`MAX_CONTEXT` tokens) at a generous 16 bytes a token.
pub const MAX_PROMPT_BYTES: u64 = 16 << 20;
/// An evaluation text (`eval --text`): WikiText-2's test split is 1.3 MB, the whole of
/// WikiText-103 about 540 MB; its tokens are held beside it.
pub const MAX_EVAL_TEXT_BYTES: u64 = 64 << 20;
/// One calibration corpus file (`calibrate --corpus`): calibration uses a few hundred
/// thousand tokens.
pub const MAX_CORPUS_BYTES: u64 = 64 << 20;
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

/// Reads a UTF-8 text file of at most `max` bytes, checking the size before reading:
/// a regular file larger than `max` fails from its size alone (nothing read); any other
/// file (a FIFO, `/dev/zero`) is read through a bound of `max + 1` bytes and fails once
/// it passes `max`, never buffering more. A larger file fails with
/// [`std::io::ErrorKind::FileTooLarge`], text that is not UTF-8 with
/// [`std::io::ErrorKind::InvalidData`] naming the offset of the first bad byte.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(Error::new(
            ErrorKind::IsADirectory,
            "is a directory; give a text file",
        ));
    }
    let too_large = |size: &str| {
        Error::new(
            ErrorKind::FileTooLarge,
            format!(
                "{size} bytes, above the limit of {} for this kind of file (limits in docs/robustness.md)",
                bytes_as_limit(max)
            ),
        )
    };
    if meta.is_file() && meta.len() > max {
        return Err(too_large(&meta.len().to_string()));
    }
    let expected = if meta.is_file() { meta.len() } else { 0 };
    let mut bytes = Vec::with_capacity(expected.min(max) as usize);
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(&format!("more than {max}")));
    }
    String::from_utf8(bytes).map_err(|e| {
        Error::new(
            ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {}); convert it first",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// A byte count as a limit is written in the limits table: `4 MiB`, `2^40 bytes`, or
/// the plain number when it is neither.
pub fn bytes_as_limit(bytes: u64) -> String {
    const UNITS: [(u32, &str); 3] = [(30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in UNITS {
        let unit_bytes = 1u64 << shift;
        if bytes >= unit_bytes && bytes.is_multiple_of(unit_bytes) && bytes >> shift < 1024 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    if bytes.is_power_of_two() && bytes >= 1 << 40 {
        return format!("2^{} bytes", bytes.trailing_zeros());
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_text_refuses_by_size_and_bounds_endless_files() {
        let dir = std::env::temp_dir().join(format!("hetsched-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.txt");
        std::fs::write(&path, "x".repeat(100)).unwrap();
        assert_eq!(read_text(&path, 100).unwrap().len(), 100);
        let error = read_text(&path, 99).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(
            error
                .to_string()
                .starts_with("100 bytes, above the limit of 99 bytes"),
            "{error}"
        );
        std::fs::write(&path, b"ab\xffcd").unwrap();
        let error = read_text(&path, 100).unwrap_err();
        assert!(error.to_string().contains("offset 2"), "{error}");
        assert!(read_text(&dir, 100).is_err(), "a directory is no text file");
        #[cfg(target_os = "linux")]
        {
            let error = read_text(Path::new("/dev/zero"), 1 << 20).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
            assert!(error.to_string().contains("more than 1048576"), "{error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn byte_limits_print_as_written_in_the_table() {
        assert_eq!(bytes_as_limit(4 << 20), "4 MiB");
        assert_eq!(bytes_as_limit(256 << 20), "256 MiB");
        assert_eq!(bytes_as_limit(1 << 62), "2^62 bytes");
        assert_eq!(bytes_as_limit(99), "99 bytes");
        assert_eq!(bytes_as_limit(3 << 10), "3 KiB");
    }
}
