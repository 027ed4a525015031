//! Checks of history records before a profile is fitted from them: known labels, values in
//! range, enough samples of each kind.

use std::path::Path;

use super::{
    HistoryError, HistoryRecord, HistoryScope, HistoryTally, MAX_RECORD_NS, MAX_THREADS,
    MIN_SAMPLES_PER_KIND,
};

/// Whether `label` is a precision this build writes
/// ([`precision_label`](hetsched_systems::precision_label)): `f32`, or
/// `w{4,8,16,32}a{4,8,16,32}`, either with `-shadow`.
pub fn known_precision(label: &str) -> bool {
    let base = label.strip_suffix("-shadow").unwrap_or(label);
    if base == "f32" {
        return true;
    }
    let bits = ["4", "8", "16", "32"];
    base.strip_prefix('w')
        .and_then(|rest| rest.split_once('a'))
        .is_some_and(|(w, a)| bits.contains(&w) && bits.contains(&a))
}

/// Checks every record of `scope.model` in `records` (read from `path`): a stage kind of
/// the model, a known precision, a processor of the device, and values in range:
/// `ns` within 1..=[`MAX_RECORD_NS`], `tokens` at least 1 and `past + tokens`, the prompt
/// and chunk lengths within the context, `threads` within 1..=[`MAX_THREADS`],
/// `overlapped_ns` at most `ns`. Records of other models are not checked (readers leave
/// them out).
pub fn check_records(
    path: &Path,
    records: &[HistoryRecord],
    scope: &HistoryScope,
) -> Result<(), HistoryError> {
    let invalid = |record: usize, message: String| HistoryError::Invalid {
        path: path.display().to_string(),
        record: record + 1,
        message,
    };
    for (k, r) in records.iter().enumerate() {
        if r.model != scope.model {
            continue;
        }
        if let Some(message) = out_of_range(r, scope.context) {
            return Err(invalid(k, message));
        }
        if !known_precision(&r.precision) {
            return Err(invalid(
                k,
                format!(
                    "unknown precision `{}` (known: f32, w8a8, w4a8, ..., each with -shadow)",
                    r.precision
                ),
            ));
        }
        if !scope.stage_kinds.contains(&r.stage) {
            return Err(invalid(
                k,
                format!(
                    "stage kind `{}` is not one of {}'s ({})",
                    r.stage,
                    scope.model,
                    scope.stage_kinds.join(", ")
                ),
            ));
        }
        if !scope.processors.contains(&r.processor) {
            return Err(invalid(
                k,
                format!(
                    "processor `{}` is not one of the device's ({})",
                    r.processor,
                    scope.processors.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// What is out of range in `r` for a model of `context` tokens, if anything.
fn out_of_range(r: &HistoryRecord, context: u64) -> Option<String> {
    if !(1..=MAX_RECORD_NS).contains(&r.ns) {
        return Some(format!(
            "ns = {} is outside 1..={MAX_RECORD_NS} (10 minutes)",
            r.ns
        ));
    }
    let end = r.past.checked_add(r.tokens).filter(|&end| end <= context);
    if r.tokens == 0 || end.is_none() {
        return Some(format!(
            "past = {} + tokens = {} is outside 1..={context}, the model's context",
            r.past, r.tokens
        ));
    }
    if u64::from(r.prompt_len) > context || r.chunk_len == 0 || u64::from(r.chunk_len) > context {
        return Some(format!(
            "prompt_len = {} or chunk_len = {} is outside 1..={context}, the model's context",
            r.prompt_len, r.chunk_len
        ));
    }
    if let Some(threads) = r.threads.filter(|t| !(1..=MAX_THREADS).contains(t)) {
        return Some(format!("threads = {threads} is outside 1..={MAX_THREADS}"));
    }
    if let Some(overlapped) = r.overlapped_ns.filter(|&o| o > r.ns) {
        return Some(format!(
            "overlapped_ns = {overlapped} is more than its ns = {}",
            r.ns
        ));
    }
    None
}

/// Refuses to fit from `records` (those a profile is fitted from: of the model, alone,
/// on its threads) when a (stage kind, precision, processor) among them has fewer than
/// [`MIN_SAMPLES_PER_KIND`] records with cold weights, or when none is left; `tally`
/// says what was used and left out.
pub fn require_samples(
    path: &Path,
    records: &[HistoryRecord],
    tally: &HistoryTally,
) -> Result<(), HistoryError> {
    let mut groups: std::collections::BTreeMap<(&str, &str, &str), usize> = Default::default();
    for r in records.iter().filter(|r| r.warm != Some(true)) {
        *groups
            .entry((&r.stage, &r.precision, &r.processor))
            .or_default() += 1;
    }
    let too_few = |message: String| HistoryError::TooFew {
        path: path.display().to_string(),
        message: format!("{message} ({tally})"),
    };
    if groups.is_empty() && tally.other_model > 0 && tally.used == 0 {
        return Err(too_few(
            "no record of this model: the history is of another model".into(),
        ));
    }
    if groups.is_empty() {
        return Err(too_few("no usable record to measure from".into()));
    }
    if let Some(((stage, precision, processor), n)) =
        groups.iter().find(|(_, n)| **n < MIN_SAMPLES_PER_KIND)
    {
        return Err(too_few(format!(
            "{n} usable records of stage kind `{stage}` ({precision} on {processor}), fewer than the {MIN_SAMPLES_PER_KIND} a fit needs; run more prefills with --history"
        )));
    }
    Ok(())
}
