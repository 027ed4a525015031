//! README.md and the Markdown under docs/ are a reference: what the project does, how to use it, why it is
//! built so, and figures each named by its command, date and commit. They do not name the
//! work that produced them: no numbered work session ("session 8", "end of session 12"),
//! no issue number ("issue 19", "#42") and no remote-machine tool ("device tool"). The
//! `Session` type and a decode session are words of the project, not of its history.

use std::path::Path;

/// Phrases that only a work diary uses, lowercase.
const DIARY_PHRASES: &[&str] = &[
    "end of session",
    "last session",
    "previous session",
    "device tool",
    "device call",
    "the device machine",
];

/// Words that, followed by a number, name a work session or an issue.
const NUMBERED_WORDS: &[&str] = &["session", "sessions", "session-", "issue", "issues"];

/// What in `line` names a work session, an issue or the device tool, if anything.
pub fn diary_reference(line: &str) -> Option<String> {
    let lower = line.to_lowercase();
    if let Some(phrase) = DIARY_PHRASES.iter().find(|p| lower.contains(*p)) {
        return Some(format!("\"{phrase}\""));
    }
    if let Some(found) = numbered_word(&lower) {
        return Some(found);
    }
    issue_hash(&lower)
}

/// A word of [`NUMBERED_WORDS`] standing alone and followed by a number ("session 8",
/// "session-8", "issues 14"): not `Session::step`, not "sessions of" or "a session".
fn numbered_word(lower: &str) -> Option<String> {
    for word in NUMBERED_WORDS {
        for (at, _) in lower.match_indices(word) {
            let starts_word = lower[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_' && c != ':');
            // "session-" carries its separator; the others are followed by one space.
            let number_at = at + word.len() + usize::from(!word.ends_with('-'));
            let separated = word.ends_with('-') || lower[at + word.len()..].starts_with(' ');
            let digits = lower.get(number_at..).map_or(0, |rest| {
                rest.chars().take_while(char::is_ascii_digit).count()
            });
            if starts_word && separated && digits > 0 {
                return Some(format!("\"{}\"", &lower[at..number_at + digits]));
            }
        }
    }
    None
}

/// `#` and two or more digits as a word of its own ("#42"): an issue or pull request
/// number. Not an HTML character reference (`&#8212;`), not inside a word or a hex colour.
fn issue_hash(lower: &str) -> Option<String> {
    for (at, _) in lower.match_indices('#') {
        let before = lower[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '&' || c == '_') {
            continue;
        }
        let digits: String = lower[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let after = lower[at + 1 + digits.len()..].chars().next();
        if digits.len() >= 2 && after.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
            return Some(format!("\"#{digits}\""));
        }
    }
    None
}

/// README.md and every Markdown file under `root`/docs, the raw data's READMEs included.
fn reference_docs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut docs = Vec::new();
    markdown_under(&root.join("docs"), &mut docs);
    docs.sort();
    files.extend(docs);
    files
}

/// Every `.md` file below `dir`, into `found`.
fn markdown_under(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            markdown_under(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

#[test]
fn the_docs_name_no_work_session_issue_or_device_tool() {
    let root = super::workspace();
    let mut found = Vec::new();
    for file in reference_docs(root) {
        let text = std::fs::read_to_string(&file).expect("a readable doc");
        let name = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = diary_reference(line) {
                found.push(format!("{name}:{}: {what}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the docs are a reference, not a diary: name a figure by its command, date and \
         commit, and a design by its reason, not by the session, issue or tool that \
         produced it:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_diary_check_flags_sessions_issues_and_the_device_tool() {
    for line in [
        "medians, 2026-11-24, end of session 8):",
        "(session 7; until then the median",
        "Session 12: five runs a setting",
        "The session-8 grid above ran before this fix.",
        "across sessions 9-12",
        "Simulation cost (issue 19):",
        "Issue 20 reported a different second token",
        "see #42 for the discussion",
        "(#123)",
        "the device tool's H100",
        "1.43x, as measured last session",
    ] {
        assert!(diary_reference(line).is_some(), "not flagged: {line}");
    }
}

#[test]
fn the_diary_check_leaves_the_session_type_and_plain_words_alone() {
    for line in [
        "everything in `Session::step` outside the jobs",
        "one long-lived scheduler world per session with the request as an entity",
        "a decode session keeps its KV cache",
        "the session's KV cache on the device",
        "`session.rs` | `Session`: one request's tokens",
        "an em dash &#8212; here",
        "colour #1f77b4 and heading ## 2",
        "the 9 to 72 workgroups that hold final tiles issue them",
        "2026-11-24, commit 510d011",
    ] {
        assert_eq!(diary_reference(line), None, "flagged: {line}");
    }
}
