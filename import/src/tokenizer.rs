//! A `tokenizers` tokenizer built from GGUF tokenizer metadata.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE, as llama.cpp
//! calls it). The pieces:
//!
//! * **Model**: BPE with vocabulary `tokenizer.ggml.tokens` (token `i` has id
//!   `i`) and merges `tokenizer.ggml.merges` (`"left right"`, split at the
//!   first space after the first character, as llama.cpp does), in rank order.
//! * **Added tokens**: `tokenizer.ggml.token_type` 3 (control) tokens become
//!   special added tokens, type 4 (user-defined) plain added tokens; both are
//!   matched in the input text before pre-tokenization (so
//!   `"<|im_start|>"` encodes to its one id).
//! * **Pre-tokenizer**, chosen by `tokenizer.ggml.pre` like llama.cpp's
//!   `llm_tokenizer_bpe`:
//!   - `gpt2`, `mpt`, `olmo`, `jais`: the GPT-2 split regex
//!     `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//!     then the byte-to-unicode mapping (`ByteLevel` with `use_regex`);
//!   - `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`:
//!     first every digit `\p{N}` is isolated, then the GPT-2 regex (so
//!     `"2024"` is four tokens);
//!   - absent or `default`: the GPT-2 regex, a documented fallback
//!     (llama.cpp's own default splits punctuation and digit runs
//!     differently; files written by current converters always carry a
//!     specific value);
//!   - anything else: [`ImportError::UnsupportedTokenizer`].
//!
//!   `tokenizer.ggml.add_space_prefix = true` sets `ByteLevel`'s
//!   `add_prefix_space`.
//! * **Decoder**: byte-level (the inverse byte mapping). [`GgufTokenizer::token_bytes`]
//!   gives one token's raw bytes, for incremental detokenization (a UTF-8 character may
//!   be split across byte tokens).
//! * **BOS**: [`GgufTokenizer::encode`] prepends `tokenizer.ggml.bos_token_id`
//!   when `tokenizer.ggml.add_bos_token` is true (SmolLM2: false).
//!
//! `tokenizer.ggml.model = "llama"` (SentencePiece: Gemma, Llama-2) is tokenized by
//! [`SpmTokenizer`] behind the same interface, so every command takes either vocabulary.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::error::{ImportError, Result};
use super::gguf::{GgufFile, Metadata};
use super::spm::SpmTokenizer;

/// `tokenizer.ggml.token_type` of control tokens (llama.cpp `LLAMA_TOKEN_TYPE_CONTROL`).
pub const TOKEN_TYPE_CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type` of user-defined tokens.
pub const TOKEN_TYPE_USER_DEFINED: i64 = 4;

const DIGITS_FIRST: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
];
const GPT2_ONLY: &[&str] = &["gpt2", "mpt", "olmo", "jais"];

/// A model's tokenizer reconstructed from a GGUF file (or a `tokenizer.json`):
/// byte-level BPE, or SentencePiece for `tokenizer.ggml.model = "llama"`.
#[derive(Clone, Debug)]
pub struct GgufTokenizer {
    backend: Backend,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

/// Which algorithm tokenizes.
#[derive(Clone, Debug)]
enum Backend {
    /// Byte-level BPE through `tokenizers`.
    Bpe(Box<Tokenizer>),
    /// llama.cpp's SentencePiece algorithm.
    Spm(Box<SpmTokenizer>),
}

fn tok_err(e: impl std::fmt::Display) -> ImportError {
    ImportError::Tokenizer(e.to_string())
}

fn token_id(md: &Metadata, key: &str, vocab: usize) -> Result<Option<u32>> {
    match md.get_u64(key)? {
        None => Ok(None),
        Some(id) if id < vocab as u64 => Ok(Some(id as u32)),
        Some(id) => Err(ImportError::WrongKeyType {
            key: key.to_owned(),
            expected: "a token id inside the vocabulary",
            found: id.to_string(),
        }),
    }
}

impl GgufTokenizer {
    /// Loads a Hugging Face `tokenizer.json` (the tokenizer of a safetensors checkpoint).
    /// BOS is added when the file names a `bos_token` in `added_tokens` as `<s>` or
    /// `<|begin_of_text|>` and `add_bos` is asked for; SmolLM2-style checkpoints add none.
    pub fn from_tokenizer_json(path: &std::path::Path, add_bos: bool) -> Result<Self> {
        let tokenizer =
            Tokenizer::from_file(path).map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let vocab_size = tokenizer.get_vocab_size(true);
        let bos = ["<s>", "<|begin_of_text|>"]
            .iter()
            .find_map(|t| tokenizer.token_to_id(t));
        let eos = ["</s>", "<|endoftext|>", "<|end_of_text|>"]
            .iter()
            .find_map(|t| tokenizer.token_to_id(t));
        Ok(Self {
            backend: Backend::Bpe(Box::new(tokenizer)),
            vocab_size,
            bos,
            eos,
            add_bos: add_bos && bos.is_some(),
        })
    }

    /// Builds the tokenizer of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_metadata(file.metadata())
    }

    /// Builds the tokenizer from `tokenizer.ggml.*` metadata (see the module
    /// docs for what is read and supported).
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        if md.get_str("tokenizer.ggml.model")? == Some("llama") {
            let spm = SpmTokenizer::from_metadata(md)?;
            return Ok(Self {
                vocab_size: spm.vocab_size(),
                bos: spm.bos_token(),
                eos: spm.eos_id(),
                add_bos: spm.add_bos(),
                backend: Backend::Spm(Box::new(spm)),
            });
        }
        let digits_first = splits_digits(md)?;
        let tokens = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| ImportError::MissingKey("tokenizer.ggml.tokens".into()))?;
        let merges = md
            .get_str_array("tokenizer.ggml.merges")?
            .ok_or_else(|| ImportError::MissingKey("tokenizer.ggml.merges".into()))?;
        let types = md.get_i64_array("tokenizer.ggml.token_type")?;
        if let Some(t) = &types
            && t.len() != tokens.len()
        {
            return Err(ImportError::InvalidConfig(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                t.len(),
                tokens.len()
            )));
        }
        let vocab_size = tokens.len();
        if vocab_size > u32::MAX as usize {
            return Err(ImportError::InvalidConfig("more than 2^32 tokens".into()));
        }

        let bpe = bpe(&tokens, &merges)?;
        let pre_tokenizer = pre_tokenizer(md, digits_first)?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        if let Some(types) = &types {
            let pick = |ty: i64, special: bool| -> Vec<AddedToken> {
                tokens
                    .iter()
                    .zip(types)
                    .filter(|&(t, &tt)| tt == ty && !t.is_empty())
                    .map(|(t, _)| AddedToken::from(*t, special))
                    .collect()
            };
            tokenizer.add_special_tokens(&pick(TOKEN_TYPE_CONTROL, true));
            tokenizer.add_tokens(&pick(TOKEN_TYPE_USER_DEFINED, false));
        }

        Ok(Self {
            backend: Backend::Bpe(Box::new(tokenizer)),
            vocab_size,
            bos: token_id(md, "tokenizer.ggml.bos_token_id", vocab_size)?,
            eos: token_id(md, "tokenizer.ggml.eos_token_id", vocab_size)?,
            add_bos: md
                .get_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(false),
        })
    }

    /// Token ids of `text`, with BOS first when `add_bos_token` is set.
    /// Special tokens written in the text (e.g. `<|im_start|>`) are matched.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let tokenizer = match &self.backend {
            Backend::Bpe(t) => t,
            Backend::Spm(spm) => return Ok(spm.encode(text)),
        };
        let enc = tokenizer.encode(text, false).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids`, special tokens included (`decode(encode(s)) == s`
    /// without BOS).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(ImportError::TokenOutOfRange {
                id,
                vocab: self.vocab_size,
            });
        }
        match &self.backend {
            Backend::Bpe(t) => t.decode(ids, false).map_err(tok_err),
            Backend::Spm(spm) => Ok(spm.decode(ids)),
        }
    }

    /// The raw bytes token `id` stands for: an added (special or user-defined) token's
    /// own text, any other token's byte-level spelling mapped back to bytes (GPT-2's
    /// byte-to-unicode table inverted). A character outside that table (a tokenizer
    /// that is not byte-level) stands for its own UTF-8 bytes.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>> {
        let out_of_range = ImportError::TokenOutOfRange {
            id,
            vocab: self.vocab_size,
        };
        let tokenizer = match &self.backend {
            Backend::Bpe(t) => t,
            Backend::Spm(spm) => return spm.token_bytes(id).ok_or(out_of_range),
        };
        if let Some(text) = tokenizer.get_added_vocabulary().simple_id_to_token(id) {
            return Ok(text.into_bytes());
        }
        let spelling = tokenizer.id_to_token(id).ok_or(out_of_range)?;
        let mut bytes = Vec::with_capacity(spelling.len());
        for c in spelling.chars() {
            match unicode_to_byte(c) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        Ok(bytes)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// `tokenizer.ggml.bos_token_id`.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.add_bos_token` (default false).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The id of the vocabulary entry `token` (as the vocabulary spells it: byte-level
    /// BPE `"Ġworld"`, SentencePiece `"▁world"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match &self.backend {
            Backend::Bpe(t) => t.token_to_id(token),
            Backend::Spm(spm) => spm.token_to_id(token),
        }
    }

    /// The vocabulary entry of `id`, as the vocabulary spells it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Bpe(t) => t.id_to_token(id),
            Backend::Spm(spm) => spm.id_to_token(id),
        }
    }

    /// The underlying `tokenizers` tokenizer of a byte-level BPE vocabulary (`None` for
    /// SentencePiece).
    pub fn inner(&self) -> Option<&Tokenizer> {
        match &self.backend {
            Backend::Bpe(t) => Some(t),
            Backend::Spm(_) => None,
        }
    }
}

/// The byte GPT-2's byte-level table maps to `c`: the printable bytes `!`..=`~`,
/// `¡`..=`¬` and `®`..=`ÿ` stand for themselves, the other 68 bytes, in order, for
/// U+0100 onwards.
fn unicode_to_byte(c: char) -> Option<u8> {
    let printable = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let code = u32::from(c);
    if printable(code) {
        return u8::try_from(code).ok();
    }
    let shifted = code.checked_sub(0x100)?;
    (0u32..=255)
        .filter(|&b| !printable(b))
        .nth(shifted as usize)
        .and_then(|b| u8::try_from(b).ok())
}

/// Refuses a tokenizer model other than byte-level BPE, and tells from
/// `tokenizer.ggml.pre` whether digits are split off one by one before BPE.
fn splits_digits(md: &Metadata) -> Result<bool> {
    let model = md.require_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(ImportError::UnsupportedTokenizer(format!(
            "tokenizer.ggml.model = {model:?} (supported: \"gpt2\", byte-level BPE)"
        )));
    }
    let pre = md.get_str("tokenizer.ggml.pre")?;
    Ok(match pre {
        None | Some("default") => false,
        Some(p) if GPT2_ONLY.contains(&p) => false,
        Some(p) if DIGITS_FIRST.contains(&p) => true,
        Some(p) => {
            return Err(ImportError::UnsupportedTokenizer(format!(
                "tokenizer.ggml.pre = {p:?} (supported: {}, default)",
                [GPT2_ONLY, DIGITS_FIRST].concat().join(", ")
            )));
        }
    })
}

/// The BPE model from the token list and the `left right` merge strings.
fn bpe(tokens: &[&str], merges: &[&str]) -> Result<BPE> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), i as u32))
        .collect();
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for m in merges {
        // Split at the first space after the first character (a merge's
        // left part is never empty, but may itself be a space).
        let first_len = m.chars().next().map_or(0, char::len_utf8);
        let Some(pos) = m[first_len..].find(' ').map(|p| p + first_len) else {
            return Err(ImportError::Tokenizer(format!(
                "merge {m:?} has no space separating its two parts"
            )));
        };
        merge_pairs.push((m[..pos].to_owned(), m[pos + 1..].to_owned()));
    }
    BPE::builder()
        .vocab_and_merges(vocab, merge_pairs)
        .build()
        .map_err(tok_err)
}

/// Byte-level pre-tokenization, behind a one-digit split where `digits_first`.
fn pre_tokenizer(md: &Metadata, digits_first: bool) -> Result<PreTokenizerWrapper> {
    let add_prefix_space = md
        .get_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(false);
    let byte_level = ByteLevel::new(add_prefix_space, false, true);
    Ok(if digits_first {
        let digits = Split::new(
            SplitPattern::Regex(r"\p{N}".into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)?;
        Sequence::new(vec![digits.into(), byte_level.into()]).into()
    } else {
        byte_level.into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's `bytes_to_unicode`, written as the original does it.
    fn byte_to_unicode() -> Vec<char> {
        let mut printable: Vec<u32> = (0x21..=0x7E)
            .chain(0xA1..=0xAC)
            .chain(0xAE..=0xFF)
            .collect();
        let mut chars: Vec<u32> = printable.clone();
        let mut n = 0;
        for b in 0..=255u32 {
            if !printable.contains(&b) {
                printable.push(b);
                chars.push(256 + n);
                n += 1;
            }
        }
        let mut table = vec!['\0'; 256];
        for (b, c) in printable.into_iter().zip(chars) {
            table[b as usize] = char::from_u32(c).unwrap();
        }
        table
    }

    #[test]
    fn the_byte_table_inverts_gpt2s() {
        for (b, c) in byte_to_unicode().into_iter().enumerate() {
            assert_eq!(unicode_to_byte(c), Some(b as u8), "byte {b} as {c:?}");
        }
        assert_eq!(unicode_to_byte('\u{0144}'), None);
    }
}
