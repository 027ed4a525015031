//! The history file: records appended one line and one `write` each, read whole or from
//! the end, every line parsed and checked with its number.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::path::Path;

use super::{HistoryError, HistoryRecord};
use crate::limits;

/// Appends `records` to `path` (created if missing), one line and one `write` each.
pub fn append_history(path: &Path, records: &[HistoryRecord]) -> Result<(), HistoryError> {
    let io = |error| HistoryError::Io {
        path: path.display().to_string(),
        error,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    for r in records {
        let mut line = serde_json::to_string(r).expect("records always serialise");
        line.push('\n');
        file.write_all(line.as_bytes()).map_err(io)?;
    }
    Ok(())
}

/// Reads every record of `path`, line by line (at most [`limits::MAX_HISTORY_BYTES`]);
/// a line that is not a record (or has a zero duration) is an error naming its line.
pub fn read_history(path: &Path) -> Result<Vec<HistoryRecord>, HistoryError> {
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let reader = BufReader::new(file.take(limits::MAX_HISTORY_BYTES + 1));
    parse_records(path, reader, Some(limits::MAX_HISTORY_BYTES))
}

/// The records of a history's text `bytes`, as [`read_history`] reads a file (`path`
/// names it in errors): for readers of a history that is not a file, and fuzzing.
pub fn parse_history(path: &Path, bytes: &[u8]) -> Result<Vec<HistoryRecord>, HistoryError> {
    parse_records(path, bytes, Some(limits::MAX_HISTORY_BYTES))
}

/// The records in the last `bytes` of `path` (the most recent runs': a history grows
/// with every run, and `run --adapt` needs only its end), from the first whole line
/// there to the file's end when it was opened (at most `bytes`: a run appending meanwhile
/// neither grows the read nor leaves half a line in it); a missing file has none. A
/// corrupt line is an error naming its line, counted from where the read starts.
pub fn read_recent_history(path: &Path, bytes: u64) -> Result<Vec<HistoryRecord>, HistoryError> {
    use std::io::{Seek as _, SeekFrom};
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(path, e)),
    };
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let start = len.saturating_sub(bytes);
    let mut reader = BufReader::new(file);
    if start > 0 {
        // Start at the first line that begins inside the window: the line the window
        // cuts is skipped whole (one byte earlier, so a window starting on a line's
        // first byte keeps that line).
        reader
            .seek(SeekFrom::Start(start - 1))
            .map_err(|e| io_error(path, e))?;
        // Bounded by the window: a cut line longer than it is held only up to its size.
        let mut cut = Vec::new();
        (&mut reader)
            .take(bytes)
            .read_until(b'\n', &mut cut)
            .map_err(|e| io_error(path, e))?;
        // No line ends in the whole window: the end of the file is one line longer than
        // the window, which no record is: corrupt, not a history without recent runs.
        if cut.last() != Some(&b'\n') && cut.len() as u64 >= bytes.min(len - (start - 1)) {
            return Err(HistoryError::Corrupt {
                path: path.display().to_string(),
                line: 1,
                message: format!(
                    "the last {} hold no line break: a corrupt tail, not records (lines counted from byte {start})",
                    limits::bytes_as_limit(bytes)
                ),
            });
        }
    }
    let at = reader.stream_position().map_err(|e| io_error(path, e))?;
    parse_records(path, reader.take(len.saturating_sub(at)), None).map_err(|e| match e {
        HistoryError::Corrupt {
            path,
            line,
            message,
        } => HistoryError::Corrupt {
            path,
            line,
            message: format!("{message} (lines counted from byte {start})"),
        },
        e => e,
    })
}

fn io_error(path: &Path, error: std::io::Error) -> HistoryError {
    HistoryError::Io {
        path: path.display().to_string(),
        error,
    }
}

/// The records of `reader`'s lines, numbered from 1; more than `limit` bytes is an error.
fn parse_records(
    path: &Path,
    mut reader: impl BufRead,
    limit: Option<u64>,
) -> Result<Vec<HistoryRecord>, HistoryError> {
    let corrupt = |line: usize, message: String| HistoryError::Corrupt {
        path: path.display().to_string(),
        line,
        message,
    };
    let (mut records, mut line, mut read) = (Vec::new(), String::new(), 0u64);
    for number in 1.. {
        line.clear();
        let n = match reader.read_line(&mut line) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(corrupt(number, "not UTF-8 text".into()));
            }
            Err(e) => return Err(io_error(path, e)),
        };
        if n == 0 {
            break;
        }
        read += n as u64;
        if let Some(limit) = limit.filter(|&limit| read > limit) {
            let too_large = std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!("larger than the limit of {limit} bytes for a history file (limits.rs)"),
            );
            return Err(io_error(path, too_large));
        }
        if line.trim().is_empty() {
            continue;
        }
        let record: HistoryRecord =
            serde_json::from_str(&line).map_err(|e| corrupt(number, e.to_string()))?;
        if record.ns == 0 || record.tokens == 0 {
            return Err(corrupt(number, "a zero duration or token count".into()));
        }
        records.push(record);
    }
    Ok(records)
}
