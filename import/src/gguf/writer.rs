//! A minimal GGUF writer, for building small files in tests and tools.

use super::{
    DEFAULT_ALIGNMENT, GgmlType, GgufFile, MAGIC, MetadataArray, MetadataValue, ValueType,
};
use crate::error::{ImportError, Result};

/// A Hugging Face `rope_scaling` of `rope_type = "llama3"` (Llama 3.1, 3.2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// `factor` (8 for Llama 3.1).
    pub factor: f32,
    /// `low_freq_factor` (1).
    pub low_freq_factor: f32,
    /// `high_freq_factor` (4).
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings` (8192).
    pub original_context: f32,
}

/// The per-frequency factors llama.cpp's converter derives from a `llama3` scaling
/// (`conversion/llama.py`, `generate_extra_tensors`): pair `i` of frequency
/// `base^(−2i/d)` and wavelength `2π / freq` gets 1 below `original / high_freq_factor`,
/// `factor` above `original / low_freq_factor`, and `1 / ((1 − s) / factor + s)` between,
/// `s = (original / wavelength − low) / (high − low)`. RoPE divides each frequency by it.
pub fn llama3_rope_factors(head_dim: usize, base: f32, s: &Llama3Scaling) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (
        s.original_context / s.low_freq_factor,
        s.original_context / s.high_freq_factor,
    );
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                s.factor
            } else {
                let smooth = (s.original_context / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            }
        })
        .collect()
}

/// The sizes of a small synthetic llama-like model, for [`GgufWriter::tiny_model`]
/// (tests, fuzz seeds and tools build their one- or two-layer files from it).
#[derive(Clone, Copy, Debug)]
pub struct TinyModel<'a> {
    /// `general.architecture`, also the metadata keys' prefix (e.g. `llama`).
    pub arch: &'a str,
    /// Blocks.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// Query heads (the head dim is `hidden / heads`).
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// FFN inner width.
    pub ffn: usize,
    /// Vocabulary size (`ARCH.vocab_size`; no tokenizer is written).
    pub vocab: usize,
    /// `ARCH.context_length`.
    pub context: u64,
    /// Whether `output.weight` is left out (tied to `token_embd.weight`).
    pub tied: bool,
}

impl TinyModel<'_> {
    /// Every tensor of the model in file order, with its shape (outermost first):
    /// `token_embd`, `output_norm`, `output` unless tied, then each block's nine.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, ffn) = (self.hidden, self.ffn);
        let kv = self.kv_heads * (h / self.heads.max(1));
        let mut out = vec![
            ("token_embd.weight".to_owned(), vec![self.vocab, h]),
            ("output_norm.weight".to_owned(), vec![h]),
        ];
        if !self.tied {
            out.push(("output.weight".to_owned(), vec![self.vocab, h]));
        }
        for i in 0..self.layers {
            for (name, shape) in [
                ("attn_norm", vec![h]),
                ("attn_q", vec![h, h]),
                ("attn_k", vec![kv, h]),
                ("attn_v", vec![kv, h]),
                ("attn_output", vec![h, h]),
                ("ffn_norm", vec![h]),
                ("ffn_gate", vec![ffn, h]),
                ("ffn_up", vec![ffn, h]),
                ("ffn_down", vec![h, ffn]),
            ] {
                out.push((format!("blk.{i}.{name}.weight"), shape));
            }
        }
        out
    }
}

/// Builds a GGUF file in memory: metadata in insertion order, tensors laid
/// out in insertion order at aligned offsets.
///
/// The writer does not validate: it writes what it is given (so tests can
/// also build malformed files), except that tensor data is padded to the
/// alignment (`general.alignment` if set as an integer, else 32).
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    kv: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file.
    pub fn new() -> Self {
        Self {
            version: 3,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A model of `m`'s sizes: its metadata (RMS eps 1e-5) and every tensor of
    /// [`TinyModel::tensors`] in F32, filled by `values(name, len)` in file order.
    pub fn tiny_model(m: &TinyModel<'_>, mut values: impl FnMut(&str, usize) -> Vec<f32>) -> Self {
        let mut w = Self::new();
        let key = |suffix: &str| format!("{}.{suffix}", m.arch);
        let u32_of = |v: usize| MetadataValue::U32(v as u32);
        w.kv("general.architecture", MetadataValue::String(m.arch.into()))
            .kv(&key("block_count"), u32_of(m.layers))
            .kv(&key("embedding_length"), u32_of(m.hidden))
            .kv(&key("attention.head_count"), u32_of(m.heads))
            .kv(&key("attention.head_count_kv"), u32_of(m.kv_heads))
            .kv(&key("feed_forward_length"), u32_of(m.ffn))
            .kv(&key("context_length"), MetadataValue::U64(m.context))
            .kv(&key("vocab_size"), u32_of(m.vocab))
            .kv(
                &key("attention.layer_norm_rms_epsilon"),
                MetadataValue::F32(1e-5),
            );
        for (name, shape) in m.tensors() {
            let data = values(&name, shape.iter().product());
            w.tensor_f32(&name, &shape, &data);
        }
        w
    }

    /// `file` cut to its first `layers` blocks: every metadata entry (in key order), with
    /// `ARCH.block_count` set to `layers`, and every tensor but those of later blocks
    /// (`blk.N.*`, `N >= layers`), their bytes and types as stored. The real weights at the
    /// real widths, heads and vocabulary, at a fraction of the depth: for tests whose
    /// kernels and shapes are every layer's, and which the whole depth only slows.
    ///
    /// [`ImportError::InvalidConfig`] for `layers` of 0 or past the file's blocks;
    /// [`ImportError::MissingKey`] without `general.architecture` or its `block_count`.
    pub fn truncated(file: &GgufFile, layers: usize) -> Result<Self> {
        let md = file.metadata();
        let arch = md.require_str("general.architecture")?;
        let count_key = format!("{arch}.block_count");
        let blocks = md.require_u64(&count_key)?;
        if layers == 0 || layers as u64 > blocks {
            return Err(ImportError::InvalidConfig(format!(
                "cannot keep {layers} of the file's {blocks} blocks"
            )));
        }
        let mut w = Self::new();
        w.version(file.header().version);
        for (key, value) in md.iter() {
            let value = match value {
                MetadataValue::U64(_) if key == count_key => MetadataValue::U64(layers as u64),
                _ if key == count_key => MetadataValue::U32(layers as u32),
                _ => value.clone(),
            };
            w.kv(key, value);
        }
        let block_of = |name: &str| {
            name.strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(index, _)| index.parse::<usize>().ok())
        };
        for t in file.tensors() {
            if block_of(t.name()).is_none_or(|block| block < layers) {
                w.tensor_raw(t.name(), &t.info.dims, t.info.ty.id(), t.data.to_vec());
            }
        }
        Ok(w)
    }

    /// Sets the version field written (2 and 3 share one layout).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Appends a metadata entry.
    pub fn kv(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        self.kv.push((key.to_owned(), value));
        self
    }

    /// Appends a tensor with raw `data`; `dims` innermost first (as stored),
    /// `ty` a ggml type id (any `u32`, so unknown types can be written).
    pub fn tensor_raw(&mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ty, data));
        self
    }

    /// Appends a tensor of type `ty` with raw `data`; `shape` outermost first
    /// (row-major), stored reversed as GGUF dims.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensor_raw(name, &dims, ty.id(), data)
    }

    /// Appends Llama-3's RoPE frequency factors as llama.cpp's converter writes them
    /// (`rope_freqs.weight`, `[head_dim / 2]`, for a checkpoint whose `rope_scaling` is
    /// `llama3`): see [`llama3_rope_factors`].
    pub fn llama3_rope_freqs(
        &mut self,
        head_dim: usize,
        base: f32,
        s: &Llama3Scaling,
    ) -> &mut Self {
        let factors = llama3_rope_factors(head_dim, base, s);
        self.tensor_f32("rope_freqs.weight", &[head_dim / 2], &factors)
    }

    /// Writes a SentencePiece (`tokenizer.ggml.model = llama`) vocabulary of `pieces`
    /// (`(text, score, token_type)`, id = index), BOS id 0, no space prefix: the small
    /// vocabularies of tokenizer tests.
    pub fn spm_vocabulary(&mut self, pieces: &[(&str, f32, i32)]) -> &mut Self {
        let array = |elem_type, f: &dyn Fn(&(&str, f32, i32)) -> MetadataValue| {
            MetadataValue::Array(MetadataArray {
                elem_type,
                values: pieces.iter().map(f).collect(),
            })
        };
        self.kv(
            "tokenizer.ggml.model",
            MetadataValue::String("llama".into()),
        )
        .kv(
            "tokenizer.ggml.tokens",
            array(ValueType::String, &|p| MetadataValue::String(p.0.into())),
        )
        .kv(
            "tokenizer.ggml.scores",
            array(ValueType::F32, &|p| MetadataValue::F32(p.1)),
        )
        .kv(
            "tokenizer.ggml.token_type",
            array(ValueType::I32, &|p| MetadataValue::I32(p.2)),
        )
        .kv("tokenizer.ggml.bos_token_id", MetadataValue::U32(0))
        .kv(
            "tokenizer.ggml.add_space_prefix",
            MetadataValue::Bool(false),
        )
    }

    /// Appends an F32 tensor; `shape` outermost first, `values` row-major.
    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, data)
    }

    fn alignment(&self) -> u64 {
        self.kv
            .iter()
            .rev()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend(MAGIC);
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (key, value) in &self.kv {
            write_str(&mut out, key);
            out.extend(value.value_type().id().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dims, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).next_multiple_of(align);
        }
        if !self.tensors.is_empty() {
            out.resize(out.len().next_multiple_of(align), 0);
        }
        let data_start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend(data);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &MetadataValue) {
    use MetadataValue as V;
    match value {
        V::U8(v) => out.push(*v),
        V::I8(v) => out.extend(v.to_le_bytes()),
        V::U16(v) => out.extend(v.to_le_bytes()),
        V::I16(v) => out.extend(v.to_le_bytes()),
        V::U32(v) => out.extend(v.to_le_bytes()),
        V::I32(v) => out.extend(v.to_le_bytes()),
        V::F32(v) => out.extend(v.to_le_bytes()),
        V::Bool(v) => out.push(u8::from(*v)),
        V::String(s) => write_str(out, s),
        V::Array(a) => {
            out.extend(a.elem_type.id().to_le_bytes());
            out.extend((a.values.len() as u64).to_le_bytes());
            for v in &a.values {
                write_value(out, v);
            }
        }
        V::U64(v) => out.extend(v.to_le_bytes()),
        V::I64(v) => out.extend(v.to_le_bytes()),
        V::F64(v) => out.extend(v.to_le_bytes()),
    }
}

/// Deterministic values for the tensor `name` of a synthetic model, in [-0.3, 0.3) and
/// seeded by the name (so two files share the tensors they both have); norm weights
/// around 1. The `values` the integration tests pass to [`GgufWriter::tiny_model`].
pub fn seeded_values(name: &str, len: usize) -> Vec<f32> {
    let seed = name
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let one = if name.contains("norm") { 1.0 } else { 0.0 };
    hetsched_kernels::seeded::SeededRng::new(seed)
        .f32s(len)
        .into_iter()
        .map(|x| 0.3 * x + one)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{GgufFile, MetadataArray, ValueType};
    use super::*;

    #[test]
    fn round_trips_every_value_type_and_tensors() {
        use MetadataValue as V;
        let values = vec![
            ("a.u8", V::U8(7)),
            ("a.i8", V::I8(-7)),
            ("a.u16", V::U16(700)),
            ("a.i16", V::I16(-700)),
            ("a.u32", V::U32(70_000)),
            ("a.i32", V::I32(-70_000)),
            ("a.f32", V::F32(1.5)),
            ("a.bool", V::Bool(true)),
            ("a.str", V::String("héllo".into())),
            ("a.u64", V::U64(1 << 40)),
            ("a.i64", V::I64(-(1 << 40))),
            ("a.f64", V::F64(-2.25)),
            (
                "a.nested",
                V::Array(MetadataArray {
                    elem_type: ValueType::Array,
                    values: vec![V::Array(MetadataArray {
                        elem_type: ValueType::String,
                        values: vec![V::String("x".into()), V::String(String::new())],
                    })],
                }),
            ),
        ];
        for version in [2, 3] {
            let mut w = GgufWriter::new();
            w.version(version);
            for (k, v) in &values {
                w.kv(k, v.clone());
            }
            w.tensor_f32("t.a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            w.tensor_f32("t.b", &[1], &[-1.0]);
            let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
            assert_eq!(f.header().version, version);
            for (k, v) in &values {
                assert_eq!(f.metadata().get(k), Some(v), "{k}");
            }
            let a = f.tensor("t.a").unwrap();
            assert_eq!(a.info.dims, [3, 2]);
            assert_eq!(a.shape(), [2, 3]);
            assert_eq!(a.to_f32().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            assert_eq!(a.rows_f32(1..2).unwrap(), [4.0, 5.0, 6.0]);
            assert_eq!(f.tensor("t.b").unwrap().to_f32().unwrap(), [-1.0]);
            assert_eq!(f.tensor("t.b").unwrap().info.offset, 32);
        }
    }
}
