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
//!   - `qwen2` (and llama.cpp's other names for it: `deepseek-r1-qwen`, `megrez`):
//!     Qwen2's regex, `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|`
//!     ` ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, then the byte mapping;
//!   - `llama-bpe`, `llama3`, `llama-v3`: Llama-3's regex (Qwen2's with `\p{N}{1,3}`),
//!     and a piece that is a whole token is that token (`ignore_merges`);
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
/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` names.
const QWEN2: &[&str] = &["qwen2", "deepseek-r1-qwen", "megrez"];
/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` names (the ones that are Llama-3's own).
const LLAMA3: &[&str] = &["llama3", "llama-v3", "llama-bpe"];

/// Qwen2's split regex (its `tokenizer.json`; llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2`):
/// contractions of either case, a letter run with one optional non-letter, non-digit in
/// front, single digits, punctuation runs with the line breaks after them, line-break
/// runs, then spaces.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama-3's: Qwen2's with digit runs of up to three.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is split before BPE, from `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PreSplit {
    /// The GPT-2 regex (`ByteLevel` with `use_regex`).
    Gpt2,
    /// Every digit isolated, then the GPT-2 regex.
    DigitsFirst,
    /// A split regex of its own, then the byte mapping alone; `llama3`: as Llama-3's
    /// vocabulary, a piece that is a whole token is that token (llama.cpp's
    /// `ignore_merges`) and BOS is added unless the file says otherwise.
    Regex { pattern: &'static str, llama3: bool },
}

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
        let split = pre_split(md)?;
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

        let llama3 = matches!(split, PreSplit::Regex { llama3: true, .. });
        let bpe = bpe(&tokens, &merges, llama3)?;
        let pre_tokenizer = pre_tokenizer(md, split)?;
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
                .unwrap_or(llama3),
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

    /// [`Self::encode`] for text with control tokens written in it, such as a rendered
    /// chat template (`<start_of_turn>`, `<|im_start|>`): they become their ids. The BPE
    /// tokenizer matches them in any text; the SentencePiece one only here, as
    /// llama.cpp's `parse_special` (plain `encode` spells them out, as llama-perplexity
    /// does).
    pub fn encode_special(&self, text: &str) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Spm(spm) => Ok(spm.encode_special(text)),
            Backend::Bpe(_) => self.encode(text),
        }
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
/// `tokenizer.ggml.pre` how text is split before BPE; a pre-tokenizer it does not know is
/// [`ImportError::UnsupportedTokenizer`] naming it (never a silent GPT-2 split).
fn pre_split(md: &Metadata) -> Result<PreSplit> {
    let model = md.require_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(ImportError::UnsupportedTokenizer(format!(
            "tokenizer.ggml.model = {model:?} (supported: \"gpt2\", byte-level BPE)"
        )));
    }
    let pre = md.get_str("tokenizer.ggml.pre")?;
    Ok(match pre {
        None | Some("default") => PreSplit::Gpt2,
        Some(p) if GPT2_ONLY.contains(&p) => PreSplit::Gpt2,
        Some(p) if DIGITS_FIRST.contains(&p) => PreSplit::DigitsFirst,
        Some(p) if QWEN2.contains(&p) => PreSplit::Regex {
            pattern: QWEN2_REGEX,
            llama3: false,
        },
        Some(p) if LLAMA3.contains(&p) => PreSplit::Regex {
            pattern: LLAMA3_REGEX,
            llama3: true,
        },
        Some(p) => {
            return Err(ImportError::UnsupportedTokenizer(format!(
                "tokenizer.ggml.pre = {p:?} (supported: {}, default)",
                [GPT2_ONLY, DIGITS_FIRST, QWEN2, LLAMA3].concat().join(", ")
            )));
        }
    })
}

/// The BPE model from the token list and the `left right` merge strings.
fn bpe(tokens: &[&str], merges: &[&str], ignore_merges: bool) -> Result<BPE> {
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
        .ignore_merges(ignore_merges)
        .build()
        .map_err(tok_err)
}

/// Byte-level pre-tokenization: the GPT-2 regex (behind a one-digit split for
/// [`PreSplit::DigitsFirst`]), or a family's own regex followed by the byte mapping alone
/// (as Qwen2's and Llama-3's `tokenizer.json` do).
fn pre_tokenizer(md: &Metadata, split: PreSplit) -> Result<PreTokenizerWrapper> {
    let add_prefix_space = md
        .get_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(false);
    let isolate = |pattern: &str| {
        Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tok_err)
    };
    Ok(match split {
        PreSplit::Gpt2 => ByteLevel::new(add_prefix_space, false, true).into(),
        PreSplit::DigitsFirst => {
            let byte_level = ByteLevel::new(add_prefix_space, false, true);
            Sequence::new(vec![isolate(r"\p{N}")?.into(), byte_level.into()]).into()
        }
        PreSplit::Regex { pattern, .. } => {
            let byte_level = ByteLevel::new(add_prefix_space, false, false);
            Sequence::new(vec![isolate(pattern)?.into(), byte_level.into()]).into()
        }
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

    /// A byte-level vocabulary (the 256 byte characters) plus `words` (byte-level text),
    /// each built by merges left to right, and `whole` tokens no merge reaches, as
    /// metadata with pre-tokenizer `pre`.
    fn vocabulary(pre: &str, words: &[&str], whole: &[&str]) -> (GgufFile, Vec<String>) {
        use crate::gguf::writer::GgufWriter;
        use crate::gguf::{MetadataArray, MetadataValue as V, ValueType};
        let mut tokens: Vec<String> = byte_to_unicode().iter().map(char::to_string).collect();
        let mut merges = Vec::new();
        for word in words {
            let chars: Vec<char> = word.chars().collect();
            let mut left = chars[0].to_string();
            for c in &chars[1..] {
                let merged = format!("{left}{c}");
                if !tokens.contains(&merged) {
                    merges.push(format!("{left} {c}"));
                    tokens.push(merged.clone());
                }
                left = merged;
            }
        }
        tokens.extend(whole.iter().map(|w| (*w).to_owned()));
        let strings = |items: &[String]| {
            V::Array(MetadataArray {
                elem_type: ValueType::String,
                values: items.iter().map(|s| V::String(s.clone())).collect(),
            })
        };
        let mut w = GgufWriter::new();
        w.kv("tokenizer.ggml.model", V::String("gpt2".into()))
            .kv("tokenizer.ggml.pre", V::String(pre.into()))
            .kv("tokenizer.ggml.tokens", strings(&tokens))
            .kv("tokenizer.ggml.merges", strings(&merges));
        (GgufFile::from_bytes(w.to_bytes()).unwrap(), tokens)
    }

    /// The text of the split tests and its pieces under each regex, worked out by hand
    /// from the patterns (byte-level: `Ġ` is a space, `Ċ` a line feed).
    const TEXT: &str = "Hello world's 2024!!\n\n.Hi it'S";
    const QWEN2_PIECES: [&str; 12] = [
        "Hello", "Ġworld", "'s", "Ġ", "2", "0", "2", "4", "!!ĊĊ", ".Hi", "Ġit", "'S",
    ];
    const LLAMA3_PIECES: [&str; 10] = [
        "Hello", "Ġworld", "'s", "Ġ", "202", "4", "!!ĊĊ", ".Hi", "Ġit", "'S",
    ];
    /// Tokens that only a wrong split could produce: GPT-2's pieces (` 2024`, `!!`,
    /// `\n\n`) and merges across Qwen2's boundaries (` 2`, `20`).
    const TRAPS: [&str; 5] = ["Ġ2024", "!!", "ĊĊ", "Ġ2", "20"];

    fn ids(tokens: &[String], pieces: &[&str]) -> Vec<u32> {
        pieces
            .iter()
            .map(|p| tokens.iter().position(|t| t == p).unwrap() as u32)
            .collect()
    }

    #[test]
    fn qwen2_and_llama3_split_as_their_regexes() {
        let words: Vec<&str> = QWEN2_PIECES
            .iter()
            .chain(&LLAMA3_PIECES)
            .chain(&TRAPS)
            .copied()
            .collect();
        for (pre, pieces) in [("qwen2", &QWEN2_PIECES[..]), ("llama-bpe", &LLAMA3_PIECES)] {
            let (file, tokens) = vocabulary(pre, &words, &[]);
            let tok = GgufTokenizer::from_gguf(&file).unwrap();
            let want = ids(&tokens, pieces);
            // Llama-3 adds BOS unless the file says otherwise (this file has no BOS id).
            assert_eq!(tok.add_bos(), pre == "llama-bpe");
            assert_eq!(tok.encode(TEXT).unwrap(), want, "{pre}");
            assert_eq!(tok.decode(&want).unwrap(), TEXT);
            // The GPT-2 split of the same vocabulary reaches the trap tokens.
            let (gpt2, _) = vocabulary("gpt2", &words, &[]);
            let gpt2 = GgufTokenizer::from_gguf(&gpt2)
                .unwrap()
                .encode(TEXT)
                .unwrap();
            assert_ne!(gpt2, want);
        }
    }

    #[test]
    fn llama3_takes_whole_tokens_before_merges() {
        // `ignore_merges`: "abc" is a token no merge reaches ("a b" leaves "ab" + "c"):
        // Llama-3's BPE takes the whole piece, Qwen2's merges.
        for (pre, want) in [("llama-bpe", &["abc"][..]), ("qwen2", &["ab", "c"])] {
            let (file, tokens) = vocabulary(pre, &["ab"], &["abc"]);
            let tok = GgufTokenizer::from_gguf(&file).unwrap();
            assert_eq!(tok.encode("abc").unwrap(), ids(&tokens, want), "{pre}");
        }
    }

    #[test]
    fn the_byte_table_inverts_gpt2s() {
        for (b, c) in byte_to_unicode().into_iter().enumerate() {
            assert_eq!(unicode_to_byte(c), Some(b as u8), "byte {b} as {c:?}");
        }
        assert_eq!(unicode_to_byte('\u{0144}'), None);
    }
}
