//! Request-trace files: the requests a simulation replays, one `[[request]]` table each,
//! in arrival order (TOML, the format of scenes):
//!
//! ```toml
//! [[request]]
//! arrival_ms = 0          # ms from the start, >= 0, not before the request above
//! prompt_tokens = 4096    # prompt length, >= 1 (and within the scene's context)
//! max_tokens = 64         # new tokens at most (per sample), >= 1
//! priority = "background" # "interactive", "background" or a number 0..=255
//! n = 1                   # optional: samples of the prompt, 1..=64 (default 1)
//!
//! [[request]]
//! arrival_ms = 100
//! prompt_tokens = 64
//! max_tokens = 32
//! priority = "interactive"
//! ttft_ms = 250           # optional target: time to first token, ms
//! tpot_ms = 50            # optional target: time per output token, ms
//! ```
//!
//! The file is read through [`limits::read_text`] (at most
//! [`limits::MAX_TEXT_FILE_BYTES`]) and holds at most [`MAX_REQUESTS`] requests; every
//! other mistake (an unknown key, a priority name that does not exist, arrivals out of
//! order or negative, a zero count, samples beyond [`MAX_SAMPLES`], a target that is not
//! a positive number) is a
//! [`TraceError`] naming the request, checked before anything is simulated.

use std::path::{Path, PathBuf};

use hetsched_limits as limits;
use hetsched_systems::{Priority, RequestId, SloTargets};
use serde::Deserialize;
use thiserror::Error;

use crate::requests::{MAX_REQUESTS, MAX_SAMPLES, RequestSpec};

/// One request of a trace, as checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// What the simulation arms: id (its position in the file, from 0), priority,
    /// targets, arrival, prompt length, new tokens and samples.
    pub spec: RequestSpec,
}

/// A request trace that could not be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be read (missing, too large, not UTF-8).
    #[error("request trace {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No such file, nor a shipped trace of that name.
    #[error(
        "request trace {path}: no such file, nor a shipped trace of that name ({})",
        shipped_traces().join(", ")
    )]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// Not TOML of the trace's shape (an unknown key, a wrong type, a missing field).
    #[error("request trace {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line.
        message: String,
    },
    /// No `[[request]]` table.
    #[error("request trace {0}: no [[request]] in it")]
    Empty(PathBuf),
    /// More requests than [`MAX_REQUESTS`].
    #[error("request trace {path}: {count} requests; at most {MAX_REQUESTS} are simulated")]
    TooMany {
        /// The file.
        path: PathBuf,
        /// How many it holds.
        count: usize,
    },
    /// One request's field is wrong.
    #[error("request trace {path}, request {index} (from 1): {message}")]
    Request {
        /// The file.
        path: PathBuf,
        /// The request's position, from 1.
        index: usize,
        /// What is wrong and what to give instead.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceFile {
    #[serde(default)]
    request: Vec<RawRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    arrival_ms: f64,
    prompt_tokens: u32,
    max_tokens: u32,
    priority: RawPriority,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    n: Option<u32>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawPriority {
    Number(i64),
    Name(String),
}

/// The shipped traces (`scenes/traces/`), embedded: (name, contents).
const SHIPPED: &[(&str, &str)] = &[
    (
        "agent-burst",
        include_str!("../../scenes/traces/agent-burst.toml"),
    ),
    ("chat", include_str!("../../scenes/traces/chat.toml")),
    (
        "best-of-8",
        include_str!("../../scenes/traces/best-of-8.toml"),
    ),
];

/// Names of the shipped request traces.
pub fn shipped_traces() -> Vec<&'static str> {
    SHIPPED.iter().map(|(name, _)| *name).collect()
}

/// Reads and checks the request trace at `path`; a path that is no file but the name of
/// a shipped trace ([`shipped_traces`]) reads that one.
///
/// # Errors
/// [`TraceError`]: an unreadable or oversized file, TOML not of the trace's shape, or a
/// request with a wrong field.
pub fn load_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    if !path.exists() {
        return match SHIPPED.iter().find(|(name, _)| Path::new(name) == path) {
            Some((_, text)) => parse_trace(text, path),
            None => Err(TraceError::NotFound {
                path: path.to_owned(),
            }),
        };
    }
    let text = limits::read_text(path, limits::MAX_TEXT_FILE_BYTES).map_err(|source| {
        TraceError::Read {
            path: path.to_owned(),
            source,
        }
    })?;
    parse_trace(&text, path)
}

/// Checks the request trace `text` (read from `path`, named in errors).
///
/// # Errors
/// As [`load_trace`], without the reading.
pub fn parse_trace(text: &str, path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let file: TraceFile = toml::from_str(text).map_err(|e| TraceError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_string(),
    })?;
    if file.request.is_empty() {
        return Err(TraceError::Empty(path.to_owned()));
    }
    if file.request.len() > MAX_REQUESTS {
        return Err(TraceError::TooMany {
            path: path.to_owned(),
            count: file.request.len(),
        });
    }
    let mut last_arrival_ns = 0;
    file.request
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let wrong = |message: String| TraceError::Request {
                path: path.to_owned(),
                index: i + 1,
                message,
            };
            let arrival_ns = positive_ns("arrival_ms", raw.arrival_ms, true).map_err(wrong)?;
            if arrival_ns < last_arrival_ns {
                return Err(wrong(format!(
                    "arrival_ms = {} is before the request above it: list requests in \
                     arrival order",
                    raw.arrival_ms
                )));
            }
            last_arrival_ns = arrival_ns;
            if raw.prompt_tokens == 0 {
                return Err(wrong("prompt_tokens = 0: give at least one token".into()));
            }
            if raw.max_tokens == 0 {
                return Err(wrong("max_tokens = 0: give at least one token".into()));
            }
            let samples = raw.n.unwrap_or(1);
            if samples == 0 || samples > MAX_SAMPLES {
                return Err(wrong(format!(
                    "n = {samples}: give 1 to {MAX_SAMPLES} samples of the prompt"
                )));
            }
            let priority = priority(&raw.priority).map_err(wrong)?;
            let target =
                |name, ms: Option<f64>| ms.map(|ms| positive_ns(name, ms, false)).transpose();
            let targets = SloTargets {
                ttft_ns: target("ttft_ms", raw.ttft_ms).map_err(wrong)?,
                tpot_ns: target("tpot_ms", raw.tpot_ms).map_err(wrong)?,
            };
            Ok(TraceRequest {
                spec: RequestSpec {
                    id: RequestId(i as u64),
                    priority,
                    targets,
                    arrival_ns,
                    prompt_len: raw.prompt_tokens,
                    max_tokens: raw.max_tokens,
                    samples,
                },
            })
        })
        .collect()
}

/// `ms` as ns: finite, not negative (and above zero unless `zero_ok`), within the
/// modeled-time limit.
fn positive_ns(name: &str, ms: f64, zero_ok: bool) -> Result<u64, String> {
    let ns = ms * 1e6;
    let below = if zero_ok { ms < 0.0 } else { ms <= 0.0 };
    if !ms.is_finite() || below || ns > limits::MAX_MODELED_NS {
        let want = if zero_ok { "0 or more" } else { "above 0" };
        return Err(format!(
            "{name} = {ms} must be a finite number of ms, {want}, below {:.0}",
            limits::MAX_MODELED_NS / 1e6
        ));
    }
    Ok(ns.round() as u64)
}

/// A priority written as a class name or a number.
fn priority(raw: &RawPriority) -> Result<Priority, String> {
    match raw {
        RawPriority::Number(n) => u8::try_from(*n)
            .map(Priority)
            .map_err(|_| format!("priority = {n} is outside 0..=255")),
        RawPriority::Name(name) => match name.as_str() {
            "interactive" => Ok(Priority::INTERACTIVE),
            "background" => Ok(Priority::BACKGROUND),
            other => Err(format!(
                "priority `{other}` does not exist: write interactive, background or a \
                 number 0..=255"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
        parse_trace(text, Path::new("t.toml"))
    }

    const ONE: &str = "[[request]]\narrival_ms = 0\nprompt_tokens = 64\nmax_tokens = 8\n";

    #[test]
    fn a_trace_parses_into_specs_in_order() {
        let text = format!(
            "{ONE}priority = \"background\"\n\n[[request]]\narrival_ms = 100.5\n\
             prompt_tokens = 32\nmax_tokens = 4\npriority = 120\nttft_ms = 250\n"
        );
        let trace = parse(&text).unwrap();
        assert_eq!(trace.len(), 2);
        assert_eq!(trace[0].spec.priority, Priority::BACKGROUND);
        assert_eq!(trace[1].spec.id, RequestId(1));
        assert_eq!(trace[1].spec.arrival_ns, 100_500_000);
        assert_eq!(trace[1].spec.priority, Priority(120));
        assert_eq!(trace[1].spec.targets.ttft_ns, Some(250_000_000));
        assert_eq!(
            (trace[1].spec.prompt_len, trace[1].spec.max_tokens),
            (32, 4)
        );
        assert_eq!(trace[1].spec.samples, 1, "n defaults to one sample");
    }

    #[test]
    fn bad_traces_are_typed_errors_naming_the_request() {
        let request = |i: usize, e: &TraceError| matches!(e, TraceError::Request { index, .. } if *index == i);
        let bad_priority = parse(&format!("{ONE}priority = \"urgent\"\n")).unwrap_err();
        assert!(request(1, &bad_priority), "{bad_priority}");
        assert!(bad_priority.to_string().contains("does not exist"));
        let too_high = parse(&format!("{ONE}priority = 256\n")).unwrap_err();
        assert!(request(1, &too_high), "{too_high}");
        let negative = parse(&format!("{ONE}priority = 1\n").replace("= 0\n", "= -1\n"));
        assert!(request(1, &negative.unwrap_err()));
        let backwards = format!(
            "{ONE}priority = 1\n[[request]]\narrival_ms = 0\nprompt_tokens = 1\nmax_tokens = 1\n\
             priority = 1\n"
        )
        .replacen("arrival_ms = 0", "arrival_ms = 5", 1);
        let e = parse(&backwards).unwrap_err();
        assert!(
            request(2, &e) && e.to_string().contains("arrival order"),
            "{e}"
        );
        let zero = parse(&format!("{ONE}priority = 1\n").replace("64", "0")).unwrap_err();
        assert!(request(1, &zero), "{zero}");
        let target = parse(&format!("{ONE}priority = 1\nttft_ms = 0\n")).unwrap_err();
        assert!(request(1, &target), "{target}");
        for n in [0, MAX_SAMPLES + 1] {
            let samples = parse(&format!("{ONE}priority = 1\nn = {n}\n")).unwrap_err();
            assert!(request(1, &samples), "{samples}");
        }
        assert_eq!(
            parse(&format!("{ONE}priority = 1\nn = 8\n")).unwrap()[0]
                .spec
                .samples,
            8
        );
        let unknown = parse(&format!("{ONE}priority = 1\nsamples = 8\n")).unwrap_err();
        assert!(matches!(unknown, TraceError::Parse { .. }), "{unknown}");
        assert!(matches!(parse(""), Err(TraceError::Empty(_))));
        let many = format!("{ONE}priority = 1\n").repeat(MAX_REQUESTS + 1);
        assert!(matches!(parse(&many), Err(TraceError::TooMany { .. })));
    }

    #[test]
    fn the_shipped_traces_load_by_name() {
        for name in shipped_traces() {
            let trace = load_trace(Path::new(name)).unwrap();
            assert!(trace.len() >= 2, "{name}");
        }
        let burst = load_trace(Path::new("agent-burst")).unwrap();
        assert_eq!(burst[0].spec.prompt_len, 4096);
        assert_eq!(burst[1].spec.priority, Priority::INTERACTIVE);
        let missing = load_trace(Path::new("no-such-trace")).unwrap_err();
        assert!(matches!(missing, TraceError::NotFound { .. }), "{missing}");
        assert!(missing.to_string().contains("agent-burst"), "{missing}");
    }

    #[test]
    fn an_oversized_file_is_refused_before_it_is_read() {
        let dir = std::env::temp_dir().join(format!("hetsched-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.toml");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(limits::MAX_TEXT_FILE_BYTES + 1).unwrap();
        let e = load_trace(&path).unwrap_err();
        assert!(matches!(e, TraceError::Read { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
