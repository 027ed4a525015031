//! SentencePiece-style tokenization as llama.cpp does it for `tokenizer.ggml.model =
//! "llama"` vocabularies (Gemma, Llama-2): [`SpmTokenizer`].
//!
//! llama.cpp's algorithm (`llm_tokenizer_spm_session`), which this follows step for step:
//! 1. **User-defined tokens** (`token_type` 4; Gemma's runs of newlines and of spaces)
//!    are cut out of the raw text first, longest token first, each occurrence left to
//!    right; control tokens are not (llama-perplexity does not parse special tokens),
//!    except by [`SpmTokenizer::encode_special`], which cuts them out too (llama.cpp's
//!    `parse_special`, for a rendered chat template's `<start_of_turn>`).
//! 2. Each remaining piece has its spaces replaced by `▁` (U+2581) (a leading space only
//!    with `add_space_prefix`, false for Gemma) and is split into UTF-8 characters.
//! 3. Adjacent symbols whose concatenation is a token are merged, highest vocabulary
//!    score first, the leftmost pair on ties, until no pair is a token.
//! 4. A final symbol that is a token is emitted; one that is not becomes its bytes'
//!    `<0xXX>` tokens.
//!
//! BOS is prepended when `tokenizer.ggml.add_bos_token` is true.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::error::{ImportError, Result};
use super::gguf::Metadata;

/// A llama.cpp-compatible SentencePiece (`llama` model) tokenizer from GGUF metadata.
#[derive(Clone, Debug)]
pub struct SpmTokenizer {
    tokens: Vec<String>,
    scores: Vec<f32>,
    ids: HashMap<String, u32>,
    /// User-defined tokens, longest first.
    user_defined: Vec<u32>,
    /// User-defined and control tokens, longest first (parsed by
    /// [`SpmTokenizer::encode_special`]).
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_space_prefix: bool,
}

/// A candidate merge of symbols `left` and `right` into a token of `score`.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score, then the leftmost pair (llama.cpp's order).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// One symbol of the merge: bytes `start..start + len` of the piece, linked to its
/// neighbours (`None` at the ends); `len` 0 once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl SpmTokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata; fails unless
    /// `tokenizer.ggml.model` is `llama`.
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let model = md.require_str("tokenizer.ggml.model")?;
        if model != "llama" {
            return Err(ImportError::UnsupportedTokenizer(format!(
                "tokenizer.ggml.model = {model:?} is not a SentencePiece (llama) vocabulary"
            )));
        }
        let tokens: Vec<String> = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| ImportError::MissingKey("tokenizer.ggml.tokens".into()))?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let scores = match md.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
            Some(a) => a
                .values
                .iter()
                .map(|v| v.as_f64().unwrap_or(0.0) as f32)
                .collect(),
            None => return Err(ImportError::MissingKey("tokenizer.ggml.scores".into())),
        };
        let types = md
            .get_i64_array("tokenizer.ggml.token_type")?
            .unwrap_or_default();
        let lengths_agree = |n: usize| n == tokens.len();
        if !lengths_agree(Vec::<f32>::len(&scores))
            || !(types.is_empty() || lengths_agree(types.len()))
        {
            return Err(ImportError::InvalidConfig(format!(
                "{} tokens with {} scores and {} types",
                tokens.len(),
                scores.len(),
                types.len()
            )));
        }
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        // Longest first; stable, so equal lengths keep id order as llama.cpp's sort does
        // in practice.
        let of_types = |wanted: &[i64]| {
            let mut ids: Vec<u32> = (0..types.len())
                .filter(|&i| wanted.contains(&types[i]) && !tokens[i].is_empty())
                .map(|i| i as u32)
                .collect();
            ids.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));
            ids
        };
        let user_defined = of_types(&[4]);
        let specials = of_types(&[3, 4]);
        let vocab = tokens.len();
        let id_of = |key: &str| -> Result<Option<u32>> {
            Ok(md
                .get_u64(key)?
                .filter(|&b| b < vocab as u64)
                .map(|b| b as u32))
        };
        let (bos, eos) = (
            id_of("tokenizer.ggml.bos_token_id")?,
            id_of("tokenizer.ggml.eos_token_id")?,
        );
        let flag =
            |key: &str, default: bool| md.get(key).and_then(|v| v.as_bool()).unwrap_or(default);
        Ok(Self {
            add_bos: flag("tokenizer.ggml.add_bos_token", true) && bos.is_some(),
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", true),
            tokens,
            scores,
            ids,
            user_defined,
            specials,
            bos,
            eos,
        })
    }

    /// The BOS id prepended by [`Self::encode`], if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos.filter(|_| self.add_bos)
    }

    /// Token ids of `text`, BOS first when the vocabulary adds it.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_cutting(text, &self.user_defined)
    }

    /// [`Self::encode`], with control tokens written in `text` (Gemma's
    /// `<start_of_turn>`, `<end_of_turn>`) cut out as their ids too: a rendered chat
    /// template's text (llama.cpp's `parse_special`).
    pub fn encode_special(&self, text: &str) -> Vec<u32> {
        self.encode_cutting(text, &self.specials)
    }

    /// Token ids of `text` with the tokens `cut` (longest first) cut out first.
    fn encode_cutting(&self, text: &str, cut: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = self.bos_id().into_iter().collect();
        let mut prev_special = true;
        for (piece, token) in self.partition(text, cut) {
            match token {
                Some(id) => {
                    out.push(id);
                    prev_special = true;
                }
                None => {
                    let prefix = if self.add_space_prefix && prev_special {
                        " "
                    } else {
                        ""
                    };
                    let escaped = format!("{prefix}{piece}").replace(' ', "\u{2581}");
                    self.encode_piece(&escaped, &mut out);
                    prev_special = false;
                }
            }
        }
        out
    }

    /// `text` cut at every token of `cut`: `(raw piece, None)` and `(token text,
    /// Some(id))` in order (step 1 of the module docs).
    fn partition<'t>(&self, text: &'t str, cut: &[u32]) -> Vec<(&'t str, Option<u32>)> {
        let mut parts = vec![(text, None)];
        for &id in cut {
            let needle = self.tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(parts.len());
            for (piece, token) in parts {
                if token.is_some() || !piece.contains(needle) {
                    next.push((piece, token));
                    continue;
                }
                let mut rest = piece;
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push((&rest[..at], None));
                    }
                    next.push((&rest[at..at + needle.len()], Some(id)));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push((rest, None));
                }
            }
            parts = next;
        }
        parts
    }

    fn score_of(&self, text: &str) -> Option<f32> {
        self.ids.get(text).map(|&id| self.scores[id as usize])
    }

    /// Steps 2 to 4 of the module docs on one escaped piece.
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in piece.char_indices().enumerate() {
            let last = start + c.len_utf8() == piece.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (!last).then_some(i + 1),
            });
        }
        let mut heap = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
            let (l, r) = (left?, right?);
            let (a, b) = (symbols[l], symbols[r]);
            let text = &piece[a.start..b.start + b.len];
            self.score_of(text).map(|score| Bigram {
                left: l,
                right: r,
                score,
                size: text.len(),
            })
        };
        for i in 1..symbols.len() {
            heap.extend(bigram(&symbols, Some(i - 1), Some(i)));
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue; // a stale pair: one side merged since
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            heap.extend(bigram(&symbols, l.prev, Some(b.left)));
            heap.extend(bigram(&symbols, Some(b.left), r.next));
        }
        let mut at = (!symbols.is_empty()).then_some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let text = &piece[s.start..s.start + s.len];
            match self.ids.get(text) {
                Some(&id) => out.push(id),
                None => out.extend(
                    text.bytes()
                        .filter_map(|b| self.ids.get(&format!("<0x{b:02X}>")).copied()),
                ),
            }
            at = s.next;
        }
    }

    /// The text of `ids` (`▁` back to spaces, `<0xXX>` tokens to their bytes); ids
    /// outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| self.token_bytes(id))
            .flatten()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes token `id` stands for (a `<0xXX>` byte token's byte, any other
    /// token's text with `▁` as a space), or `None` outside the vocabulary. A UTF-8
    /// character may be split across byte tokens: decode incrementally from these.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let t = self.tokens.get(id as usize)?;
        Some(
            match t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                Some(hex) if hex.len() == 2 => {
                    u8::from_str_radix(hex, 16).ok().into_iter().collect()
                }
                _ => t.replace('\u{2581}', " ").into_bytes(),
            },
        )
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// `tokenizer.ggml.bos_token_id`, whether or not encoding adds it.
    pub fn bos_token(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether [`Self::encode`] prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The id of the vocabulary entry `token` (as stored, e.g. `"▁Paris"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The vocabulary entry of `id`, as stored.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokens.get(id as usize).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::gguf::writer::GgufWriter;

    /// A vocabulary of pieces with scores and types; byte tokens for `\n` and `!`.
    fn tokenizer(pieces: &[(&str, f32, i32)]) -> SpmTokenizer {
        let mut w = GgufWriter::new();
        w.spm_vocabulary(pieces);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        SpmTokenizer::from_metadata(file.metadata()).unwrap()
    }

    #[test]
    fn merges_by_score_cuts_user_defined_and_falls_back_to_bytes() {
        let t = tokenizer(&[
            ("<bos>", 0.0, 3),
            ("a", -1.0, 1),
            ("b", -1.0, 1),
            ("ab", -5.0, 1),
            ("bc", -2.0, 1),
            ("c", -1.0, 1),
            ("\u{2581}", -1.0, 1),
            ("\u{2581}a", -3.0, 1),
            ("  ", 0.0, 4),
            ("<0x21>", 0.0, 6),
        ]);
        // "abc": bc (−2) outscores ab (−5), so a + bc.
        assert_eq!(t.encode("abc"), [0, 1, 4]);
        // "ab a": ab, then ▁a; "!" is not a token: its byte.
        assert_eq!(t.encode("ab a!"), [0, 3, 7, 9]);
        // Two spaces are a user-defined token, cut before the merge.
        assert_eq!(t.encode("a  b"), [0, 1, 8, 2]);
        assert_eq!(t.decode(&t.encode("ab a!")[1..]), "ab a!");
        // A control token in the text: spelled out by `encode`, its id by
        // `encode_special` (and user-defined tokens are still cut).
        assert_ne!(t.encode("<bos>a")[..2], [0, 0]);
        assert_eq!(t.encode_special("<bos>a  b"), [0, 0, 1, 8, 2]);
    }
}
