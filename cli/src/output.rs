//! Output files and printing. Nothing finished is lost: every output path is checked
//! before the work starts ([`check_outputs`]); after it, results are printed first and
//! files written then ([`write_file`], whole or not at all), so a failing write still
//! leaves the results on stdout. Reports go to stdout through [`print_text`] alone, which
//! turns a closed stdout (a pipe to `head`) into a quiet exit with [`BROKEN_PIPE_STATUS`]
//! after the command's files are written, never a panic.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use hetsched::engine::RunOutcome;
use hetsched::fsutil::{check_writable, write_atomic};
use hetsched::timeline::{Trace, chrome::to_chrome_json, svg::to_svg};

use crate::CliError;

/// Checks that each given output path can be written, before any work.
pub fn check_outputs<'a>(
    paths: impl IntoIterator<Item = Option<&'a Path>>,
) -> Result<(), CliError> {
    for path in paths.into_iter().flatten() {
        check_writable(path).map_err(|error| CliError::Unwritable {
            path: path.to_owned(),
            error,
        })?;
    }
    Ok(())
}

/// Writes `text` to `path` through a temporary file renamed over it.
pub fn write_file(path: &Path, text: &str) -> Result<(), CliError> {
    write_atomic(path, text.as_bytes()).map_err(|error| CliError::Write {
        path: path.to_owned(),
        error,
    })
}

/// The timeline files a run asked for: a Chrome trace and an SVG picture.
pub struct Timelines {
    /// Chrome trace JSON.
    pub trace: Option<PathBuf>,
    /// SVG picture.
    pub svg: Option<PathBuf>,
}

impl Timelines {
    /// Checks both paths before the run.
    pub fn check(&self) -> Result<(), CliError> {
        check_outputs([self.trace.as_deref(), self.svg.as_deref()])
    }

    /// Whether any timeline is asked for.
    pub fn any(&self) -> bool {
        self.trace.is_some() || self.svg.is_some()
    }

    /// Writes the timelines of `run`, titled `title`.
    pub fn write(&self, title: &str, run: &RunOutcome) -> Result<(), CliError> {
        if !self.any() {
            return Ok(());
        }
        self.write_trace(&Trace::new(title, run))
    }

    /// Writes the timelines of `timeline`.
    pub fn write_trace(&self, timeline: &Trace) -> Result<(), CliError> {
        if let Some(path) = &self.trace {
            write_file(path, &to_chrome_json(timeline))?;
        }
        if let Some(path) = &self.svg {
            write_file(path, &to_svg(timeline))?;
        }
        Ok(())
    }
}

/// The exit status of a command whose stdout reader went away (a pipe to `head` that
/// closed): 128 + SIGPIPE's number, what a shell reports for a tool that SIGPIPE ended,
/// so `set -o pipefail` scripts see the same status as for any other such tool.
pub const BROKEN_PIPE_STATUS: u8 = 141;

/// The first error writing stdout, kept for `main` to report once the command is done.
static STDOUT_ERROR: Mutex<Option<io::Error>> = Mutex::new(None);

/// Writes `text` to stdout and flushes it: the one way the commands print their reports.
/// A write that fails (a pipe to `head` that closed) never panics and never stops the
/// command: its output files are still written; the error is kept for
/// [`take_stdout_error`], and later prints are skipped.
pub fn print_text(text: &str) {
    let mut failed = STDOUT_ERROR.lock().unwrap_or_else(PoisonError::into_inner);
    if failed.is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(error) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        *failed = Some(error);
    }
}

/// The first error writing stdout, if any, as the command's error: `main` exits quietly
/// with [`BROKEN_PIPE_STATUS`] for a closed pipe, with a message otherwise.
pub fn take_stdout_error() -> Result<(), CliError> {
    let failed = STDOUT_ERROR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    failed.map_or(Ok(()), |error| Err(CliError::Stdout { error }))
}

/// Prints `value` as pretty JSON with `json`, else the text `summary` gives.
pub fn print_json_or(json: bool, value: &impl serde::Serialize, summary: impl FnOnce() -> String) {
    if json {
        let mut text = serde_json::to_string_pretty(value).expect("our reports always serialise");
        text.push('\n');
        print_text(&text);
    } else {
        print_text(&summary());
    }
}
