//! Run history: every real run can append its measured per-instance durations to a file
//! (`hetsched run --history FILE`), and `hetsched profile --from-history FILE` refits a
//! measured profile from it.
//!
//! Format: JSON Lines, one [`HistoryRecord`] per line (one subgraph instance of one run).
//! Each record is written with a single `write` on a file opened with `O_APPEND`, so two
//! runs appending at once interleave whole lines, and a crash loses at most the line being
//! written (a truncated last line is reported by [`read_history`] with its line number,
//! and nothing before it is lost).

use hetsched_systems::{attention_window, has_attention, precision_label, stage_kind};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::engine::RunOutcome;
use crate::overlap::overlaps;

mod check;
mod file;

pub use check::{check_records, known_precision, require_samples};
pub use file::{append_history, parse_history, read_history, read_recent_history};

/// One measured subgraph instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRecord {
    /// The model's name.
    pub model: String,
    /// The linears' precision (`w8a8`, `f32`, `w8a8-shadow`).
    pub precision: String,
    /// The stage kind (its operators' names joined by `+`).
    pub stage: String,
    /// The processor (lane) that ran it.
    pub processor: String,
    /// Tokens in its chunk.
    pub tokens: u64,
    /// Tokens before its chunk.
    pub past: u64,
    /// Measured compute time, ns (at least 1).
    pub ns: u64,
    /// Whether the stage holds attention.
    pub attention: bool,
    /// The sliding window of the stage's attention (a local layer's), if it has one.
    #[serde(default)]
    pub window: Option<u64>,
    /// The run's prompt length.
    pub prompt_len: u32,
    /// The run's chunk length.
    pub chunk_len: u32,
    /// Compute threads the run had (`null` when not recorded, as in files written before
    /// it): `profile --from-history` fits the profile's costs from the records of its
    /// thread count and the one-thread costs, which say how jobs share the pool, from
    /// those of one thread.
    #[serde(default)]
    pub threads: Option<u32>,
    /// Whether it ran with no other lane's job running (at most 5% of its time
    /// overlapped one): its time is then its own, as a profile's `inorder` samples are,
    /// not slowed by a job sharing the cores (`run --adapt` reads only these; `null` in
    /// files written before it).
    #[serde(default)]
    pub alone: Option<bool>,
    /// How long, in ns, jobs of other lanes ran during it (summed per lane, at most `ns`;
    /// `null` in files written before it): what `profile` takes out of a job that shared
    /// the pool to fit the cost it has alone (`profiling::fit_profile_alone`).
    #[serde(default)]
    pub overlapped_ns: Option<u64>,
    /// Whether its stage's weights were still in the last-level cache when it started
    /// ([`crate::weight_reuse::ReuseTracker`]; `null` where the cache size is unknown and
    /// in files written before it): such a job ran faster than the cold cost a profile
    /// fits, so `run --adapt` and `profile --from-history` leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<bool>,
}

/// Why a history file could not be written or read.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// The file could not be opened, written or read.
    #[error("history file {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// A line is not a record (corrupt, or truncated by a crash).
    #[error("history file {path}, line {line}: {message}")]
    Corrupt {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// A record is well formed but cannot be a measurement of this model on this
    /// device: an unknown stage kind, precision or processor, or a value outside its
    /// documented range ([`check_records`]).
    #[error("history file {path}, record {record}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// 1-based record (non-empty line) number.
        record: usize,
        /// What was wrong, with the range or the names allowed.
        message: String,
    },
    /// The history holds too few usable records to measure from.
    #[error("history file {path}: {message}")]
    TooFew {
        /// The file.
        path: String,
        /// Which records were missing, and how many were used and left out, and why.
        message: String,
    },
}

/// Fewer usable records than this for one (stage kind, precision, processor) and
/// `profile --from-history` refuses to fit its cost: a fit of up to four coefficients
/// from fewer samples than twice as many is noise, not a measurement.
pub const MIN_SAMPLES_PER_KIND: usize = 8;
/// The longest one measured subgraph instance may take, in ns (10 minutes: a whole
/// 1M-token prefill of a small model on one slow core); longer is a corrupt record.
pub const MAX_RECORD_NS: u64 = 600_000_000_000;
/// The most compute threads a record may name.
pub const MAX_THREADS: u32 = 4096;

/// What a history's records must match to measure `model` on a device: what
/// [`check_records`] checks them against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryScope {
    /// The model's name; records of other models are left out (counted).
    pub model: String,
    /// The model's context length: a record's `past + tokens`, prompt and chunk lengths
    /// are within it.
    pub context: u64,
    /// The model's stage kinds ([`stage_kind`] of each of its stages).
    pub stage_kinds: Vec<String>,
    /// The device's processors (lanes) by name.
    pub processors: Vec<String>,
}

impl HistoryScope {
    /// The scope of `model` on `device`: its name, context and stage kinds (from its
    /// stage graph: no weights needed).
    pub fn of(
        model: &hetsched_systems::ModelConfig,
        device: &hetsched_systems::DeviceProfile,
    ) -> Result<Self, hetsched_systems::PlanError> {
        let mut stage_kinds: Vec<String> = hetsched_systems::graph::build_stages(model)?
            .iter()
            .map(|s| stage_kind(&s.ops))
            .collect();
        stage_kinds.sort();
        stage_kinds.dedup();
        Ok(Self {
            model: model.name.clone(),
            context: u64::from(model.context),
            stage_kinds,
            processors: device.processors.iter().map(|p| p.name.clone()).collect(),
        })
    }
}

/// How many records a reader used and left out, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HistoryTally {
    /// Records used.
    pub used: usize,
    /// Records of other models.
    pub other_model: usize,
    /// Records that shared the cores with another lane's job.
    pub shared: usize,
    /// Records whose weights were still cached (faster than a cold cost).
    pub warm: usize,
    /// Records of runs on another thread count.
    pub other_threads: usize,
}

impl std::fmt::Display for HistoryTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} records used; left out: {} of other models, {} that shared the cores, {} with cached weights, {} of other thread counts",
            self.used, self.other_model, self.shared, self.warm, self.other_threads
        )
    }
}

/// Every instance of a finished run as records.
pub fn records_of(run: &RunOutcome) -> Vec<HistoryRecord> {
    let plan = &run.plan;
    let (prompt, chunk_len) = (plan.workload.prompt_len, plan.workload.chunk_len);
    let precision = precision_label(&plan.model);
    run.timeline
        .slices
        .iter()
        .zip(overlaps(&run.timeline.slices))
        .map(|(s, overlapped)| {
            let ns = s.end_ns.saturating_sub(s.start_ns).max(1);
            let ops = &plan.stages[s.key.stage as usize].ops;
            let shape = plan.executed_shape(s.key);
            HistoryRecord {
                model: plan.model.name.clone(),
                precision: precision.clone(),
                stage: stage_kind(ops),
                processor: plan.device.processors[s.processor].name.clone(),
                tokens: shape.tokens,
                past: shape.past,
                ns,
                attention: has_attention(ops),
                window: attention_window(ops),
                prompt_len: prompt,
                chunk_len,
                threads: None,
                alone: Some(overlapped * 20 <= ns),
                overlapped_ns: Some(overlapped),
                warm: None,
            }
        })
        .collect()
}

/// [`records_of`] a run on `threads` compute threads, each record saying so, and, with
/// the host's last-level cache size, whether its weights were still cached
/// ([`crate::weight_reuse::warm_slices`]).
pub fn records_on(
    run: &RunOutcome,
    threads: usize,
    cache_bytes: Option<u64>,
) -> Vec<HistoryRecord> {
    let threads = u32::try_from(threads).ok();
    let mut records = records_of(run);
    let warm = cache_bytes.map(|cache| crate::weight_reuse::warm_slices(run, cache));
    for (k, r) in records.iter_mut().enumerate() {
        r.threads = threads;
        r.warm = warm.as_ref().map(|w| w[k]);
    }
    records
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hetsched_systems::PolicyRegistry;
    use hetsched_systems::resources::SliceRecord;
    use hetsched_systems::testing::tiny_plan;

    use super::*;
    use crate::engine::simulate;
    use std::fs::OpenOptions;
    use std::io::Write as _;
    use std::path::Path;

    use crate::limits;

    fn run() -> RunOutcome {
        let plan = Arc::new(tiny_plan(2, 256, 64));
        simulate(plan, PolicyRegistry::builtin().create("stall").unwrap()).unwrap()
    }

    #[test]
    fn two_concurrent_writers_lose_nothing() {
        let dir = std::env::temp_dir().join(format!("hetsched-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let _ = std::fs::remove_file(&path);
        let records = records_of(&run());
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (path, records) = (path.clone(), records.clone());
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        append_history(&path, &records).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let read = read_history(&path).unwrap();
        assert_eq!(read.len(), 2 * 20 * records.len());
        assert!(read.iter().all(|r| records.contains(r)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A history of many runs reads whole: past the 4 MiB of a scene file, line by line.
    #[test]
    fn a_history_larger_than_a_text_file_reads_whole() {
        let dir = std::env::temp_dir().join(format!("hetsched-history-l-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let _ = std::fs::remove_file(&path);
        let records = records_of(&run());
        let mut runs = 0;
        while std::fs::metadata(&path).map_or(0, |m| m.len()) <= limits::MAX_TEXT_FILE_BYTES {
            append_history(&path, &records).unwrap();
            runs += 1;
        }
        assert_eq!(read_history(&path).unwrap().len(), runs * records.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_truncated_or_corrupt_line_is_an_error_with_its_number() {
        let dir = std::env::temp_dir().join(format!("hetsched-history-c-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let _ = std::fs::remove_file(&path);
        append_history(&path, &records_of(&run())[..3]).unwrap();
        // A crash mid-line.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"model\":\"tiny\",\"precis");
        std::fs::write(&path, &text).unwrap();
        let err = read_history(&path).unwrap_err().to_string();
        assert!(err.contains("line 4"), "{err}");
        // A zero duration.
        let zero = text
            .lines()
            .next()
            .unwrap()
            .replace("\"ns\":", "\"ns\":0,\"x\":");
        std::fs::write(&path, format!("{zero}\n")).unwrap();
        assert!(
            read_history(&path)
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_recent_records_are_the_whole_lines_at_the_end() {
        let dir = std::env::temp_dir().join(format!("hetsched-history-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let _ = std::fs::remove_file(&path);
        assert!(read_recent_history(&path, 1 << 20).unwrap().is_empty());
        let records = records_of(&run());
        append_history(&path, &records).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(read_recent_history(&path, len).unwrap(), records);
        assert_eq!(read_recent_history(&path, 10 * len).unwrap(), records);
        // A window that cuts the first line in two keeps the rest.
        assert_eq!(read_recent_history(&path, len - 1).unwrap(), records[1..]);
        // One that starts on the last line's first byte keeps just it.
        let last = serde_json::to_string(records.last().unwrap())
            .unwrap()
            .len() as u64
            + 1;
        assert_eq!(
            read_recent_history(&path, last).unwrap(),
            records[records.len() - 1..]
        );
        // A tail longer than the window with no line break is corrupt, not skipped.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[b'x'; 4096]).unwrap();
        let error = read_recent_history(&path, 1024).unwrap_err();
        assert!(error.to_string().contains("no line break"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_is_alone_when_no_other_lane_ran_during_it_and_says_how_long_one_did() {
        let mut outcome = run();
        let slices = &mut outcome.timeline.slices;
        slices.truncate(2);
        slices[0].processor = 0;
        slices[1].processor = 1;
        let span = |s: &mut SliceRecord, start, end| (s.start_ns, s.end_ns) = (start, end);
        // 1000 ns against 50 ns of overlap (5%): alone; 51 ns: not.
        span(&mut slices[0], 0, 1000);
        span(&mut slices[1], 950, 2000);
        let alone: Vec<_> = records_of(&outcome).iter().map(|r| r.alone).collect();
        assert_eq!(alone, [Some(true), Some(true)]);
        span(&mut outcome.timeline.slices[1], 949, 2000);
        let alone: Vec<_> = records_of(&outcome).iter().map(|r| r.alone).collect();
        assert_eq!(alone, [Some(false), Some(true)]);
        let overlapped: Vec<_> = records_of(&outcome)
            .iter()
            .map(|r| r.overlapped_ns)
            .collect();
        assert_eq!(overlapped, [Some(51), Some(51)]);
        // A job inside another: its whole span overlapped, the other's only that much.
        span(&mut outcome.timeline.slices[1], 200, 400);
        let overlapped: Vec<_> = records_of(&outcome)
            .iter()
            .map(|r| r.overlapped_ns)
            .collect();
        assert_eq!(overlapped, [Some(200), Some(200)]);
    }

    /// A run's records and the scope they were recorded in.
    fn recorded() -> (Vec<HistoryRecord>, HistoryScope) {
        let outcome = run();
        let scope = HistoryScope::of(&outcome.plan.model, &outcome.plan.device).unwrap();
        (records_on(&outcome, 2, None), scope)
    }

    #[test]
    fn a_run_s_own_records_pass_the_checks() {
        let (records, scope) = recorded();
        assert!(!records.is_empty());
        check_records(Path::new("h"), &records, &scope).unwrap();
    }

    #[test]
    fn junk_records_are_refused_with_their_cause() {
        let (records, scope) = recorded();
        type Spoil = fn(&mut HistoryRecord);
        let cases: [(Spoil, &str); 9] = [
            (|r| r.ns = u64::MAX, "ns = 18446744073709551615 is outside"),
            (|r| r.tokens = 1 << 40, "the model's context"),
            (|r| r.past = 1 << 62, "the model's context"),
            (|r| r.chunk_len = 0, "chunk_len = 0"),
            (|r| r.threads = Some(0), "threads = 0"),
            (|r| r.overlapped_ns = Some(r.ns + 1), "overlapped_ns"),
            (|r| r.stage = "warp_drive".into(), "stage kind `warp_drive`"),
            (|r| r.precision = "int3".into(), "unknown precision `int3`"),
            (|r| r.processor = "tpu".into(), "processor `tpu`"),
        ];
        for (spoil, expected) in cases {
            let mut records = records.clone();
            spoil(&mut records[3]);
            let error = check_records(Path::new("h"), &records, &scope)
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("record 4") && error.contains(expected),
                "{error}"
            );
            // Another model's records are not this model's to check.
            records[3].model = "other".into();
            check_records(Path::new("h"), &records, &scope).unwrap();
        }
    }

    #[test]
    fn a_fit_needs_enough_samples_of_each_kind() {
        let (records, _) = recorded();
        let tally = HistoryTally {
            used: records.len(),
            ..HistoryTally::default()
        };
        let path = Path::new("h");
        let error = require_samples(path, &[], &HistoryTally::default()).unwrap_err();
        assert!(error.to_string().contains("no usable record"), "{error}");
        let other = HistoryTally {
            other_model: 5,
            ..HistoryTally::default()
        };
        let error = require_samples(path, &[], &other).unwrap_err();
        assert!(error.to_string().contains("another model"), "{error}");
        let few: Vec<_> = records.iter().take(3).cloned().collect();
        let error = require_samples(path, &few, &tally).unwrap_err();
        assert!(error.to_string().contains("fewer than the 8"), "{error}");
        let many: Vec<_> = (0..MIN_SAMPLES_PER_KIND)
            .flat_map(|_| records.clone())
            .collect();
        require_samples(path, &many, &tally).unwrap();
        // Records with cached weights do not count.
        let warm: Vec<_> = many
            .iter()
            .cloned()
            .map(|mut r| {
                r.warm = Some(true);
                r
            })
            .collect();
        assert!(require_samples(path, &warm, &tally).is_err());
    }

    #[test]
    fn precisions_this_build_writes_are_known() {
        for label in ["f32", "w8a8", "w8a8-shadow", "w4a8", "w16a16"] {
            assert!(known_precision(label), "{label}");
        }
        for label in ["int3", "w3a8", "", "w8", "f32-shadowy", "wa8"] {
            assert!(!known_precision(label), "{label}");
        }
    }
}
