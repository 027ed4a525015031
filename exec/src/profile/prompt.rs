//! A prompt of a chosen length: a text's tokens cut or repeated to exactly `n`, as the
//! profiled prefills and `run --prompt-len` use them.

use hetsched_import::GgufTokenizer;

use super::ProfileError;
use crate::ExecError;

/// `text`'s tokens cut or repeated to exactly `n` (a prompt of a chosen length).
pub fn prompt_tokens(
    tokenizer: &GgufTokenizer,
    text: &str,
    n: usize,
    context: usize,
) -> Result<Vec<u32>, ProfileError> {
    if n == 0 {
        return Err(ProfileError::EmptyPrompt);
    }
    // Checked before the text is repeated to that length: `--prompt-len 10^12` would
    // otherwise allocate terabytes before the prefill refuses it.
    if n > context {
        return Err(ExecError::PromptTooLong { tokens: n, context }.into());
    }
    let once = tokenizer.encode(text)?.len().max(1);
    let mut tokens = tokenizer.encode(&text.repeat(n.div_ceil(once) + 1))?;
    if tokens.is_empty() {
        return Err(ProfileError::EmptyPrompt);
    }
    while tokens.len() < n {
        tokens.extend_from_within(..tokens.len().min(n - tokens.len()));
    }
    tokens.truncate(n);
    Ok(tokens)
}
