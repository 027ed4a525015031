//! A Hugging Face llama checkpoint: a directory with `config.json`, `tokenizer.json` and
//! `model.safetensors` (or shards listed in `model.safetensors.index.json`), memory-mapped.
//!
//! Hugging Face stores the query and key rows unpermuted, so RoPE rotates the two halves
//! of each head ([`RopeStyle::HalfSplit`]); GGUF files hold the same weights permuted for
//! adjacent pairs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use hetsched_kernels::RopeStyle;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::error::{ImportError, Result, finite_weights};
use super::gguf::map_read_only;
use super::llama::LlamaConfig;
use super::source::{ColumnSource, LayerTensor, LlamaSource};

/// The `config.json` fields a llama model needs (others are ignored).
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_attention_heads: usize,
    num_hidden_layers: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    rms_norm_eps: f32,
    #[serde(default)]
    rope_theta: Option<f32>,
    max_position_embeddings: usize,
    vocab_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
}

/// A memory-mapped Hugging Face llama checkpoint.
#[derive(Debug)]
pub struct HfModel {
    dir: PathBuf,
    config: LlamaConfig,
    name: String,
    /// Mapped safetensors files.
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: BTreeMap<String, usize>,
}

fn bad(path: &Path, message: impl Into<String>) -> ImportError {
    ImportError::BadFile {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<String> {
    crate::limits::read_text(path, crate::limits::MAX_TEXT_FILE_BYTES).map_err(|source| {
        ImportError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

impl HfModel {
    /// Opens the checkpoint in `dir` and checks every tensor the config implies.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_owned();
        let config_path = dir.join("config.json");
        let hf: HfConfig = serde_json::from_str(&read(&config_path)?)
            .map_err(|e| bad(&config_path, e.to_string()))?;
        if hf.model_type.as_deref() != Some("llama") {
            return Err(ImportError::UnsupportedArchitecture(
                hf.model_type.unwrap_or_else(|| "<no model_type>".into()),
            ));
        }
        if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ImportError::InvalidConfig(
                "rope_scaling is not supported; use a checkpoint without it".into(),
            ));
        }
        let n_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let head_dim = hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        let config = LlamaConfig {
            family: crate::family::LLAMA,
            n_layers: hf.num_hidden_layers,
            hidden: hf.hidden_size,
            n_heads: hf.num_attention_heads,
            n_kv_heads,
            head_dim,
            ffn: hf.intermediate_size,
            rope_base: hf.rope_theta.unwrap_or(10_000.0),
            rope_dims: head_dim,
            rope_style: RopeStyle::HalfSplit,
            rope_freq_scale: 1.0,
            sliding_window: 0,
            norm_eps: hf.rms_norm_eps,
            context_length: hf.max_position_embeddings,
            vocab_size: hf.vocab_size,
            tied_output: hf.tie_word_embeddings,
        };
        config.validate()?;
        let (files, index) = map_shards(&dir)?;
        let name = dir
            .file_name()
            .map_or_else(|| "llama".into(), |n| n.to_string_lossy().into_owned());
        let model = Self {
            dir,
            config,
            name,
            files,
            index,
        };
        model.check_tensors()?;
        Ok(model)
    }

    /// `tokenizer.json` of the checkpoint.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }

    fn check_tensors(&self) -> Result<()> {
        let c = &self.config;
        let mut wanted = vec![
            (
                "model.embed_tokens.weight".to_string(),
                vec![c.vocab_size, c.hidden],
            ),
            ("model.norm.weight".to_string(), vec![c.hidden]),
        ];
        if !c.tied_output {
            wanted.push(("lm_head.weight".into(), vec![c.vocab_size, c.hidden]));
        }
        for l in 0..c.n_layers {
            for t in LayerTensor::ALL {
                wanted.push((layer_name(l, t), t.shape(c)));
            }
        }
        for (name, shape) in wanted {
            let (path, st) = self.open_tensor(&name)?;
            let found = st.shape().to_vec();
            if found != shape {
                return Err(ImportError::ShapeMismatch {
                    name: format!("{name} in {}", path.display()),
                    expected: shape,
                    found,
                });
            }
        }
        Ok(())
    }

    fn open_tensor(&self, name: &str) -> Result<(&Path, safetensors::tensor::TensorView<'_>)> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| ImportError::MissingTensor(name.to_owned()))?;
        let (path, map) = &self.files[i];
        let st = SafeTensors::deserialize(map).map_err(|e| bad(path, e.to_string()))?;
        let view = st.tensor(name).map_err(|e| bad(path, e.to_string()))?;
        Ok((path, view))
    }

    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (path, view) = self.open_tensor(name)?;
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(bad(
                    path,
                    format!("tensor {name} has dtype {other:?}; supported: F32, F16, BF16"),
                ));
            }
        };
        finite_weights(name, values)
    }
}

impl ColumnSource for HfModel {
    fn layer_column(&self, layer: usize, which: LayerTensor, column: usize) -> Result<Vec<f32>> {
        let name = layer_name(layer, which);
        let (path, view) = self.open_tensor(&name)?;
        let &[rows, cols] = view.shape() else {
            return Err(bad(path, format!("tensor {name} is not a matrix")));
        };
        if column >= cols {
            return Err(ImportError::InvalidConfig(format!(
                "column {column} out of range for tensor {name} with {cols} columns"
            )));
        }
        let data = view.data();
        let size = view.dtype().bitsize() / 8;
        let at = |row: usize| &data[(row * cols + column) * size..][..size];
        let decode: fn(&[u8]) -> f32 = match view.dtype() {
            Dtype::F32 => |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Dtype::F16 => |b| f16::from_le_bytes([b[0], b[1]]).to_f32(),
            Dtype::BF16 => |b| bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            other => {
                return Err(bad(
                    path,
                    format!("tensor {name} has dtype {other:?}; supported: F32, F16, BF16"),
                ));
            }
        };
        finite_weights(&name, (0..rows).map(|row| decode(at(row))).collect())
    }
}

fn layer_name(layer: usize, t: LayerTensor) -> String {
    let part = match t {
        LayerTensor::AttnNorm => "input_layernorm",
        LayerTensor::Q => "self_attn.q_proj",
        LayerTensor::K => "self_attn.k_proj",
        LayerTensor::V => "self_attn.v_proj",
        LayerTensor::O => "self_attn.o_proj",
        LayerTensor::FfnNorm => "post_attention_layernorm",
        LayerTensor::Gate => "mlp.gate_proj",
        LayerTensor::Up => "mlp.up_proj",
        LayerTensor::Down => "mlp.down_proj",
    };
    format!("model.layers.{layer}.{part}.weight")
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// Parses the header of a safetensors file held in `bytes` (length prefix, JSON, data
/// offsets checked against the bytes) and names its tensors, as opening a checkpoint
/// does for each shard. (The fuzzer `examples/fuzz_parsers.rs` drives this.)
pub fn safetensors_tensor_names(bytes: &[u8]) -> std::result::Result<Vec<String>, String> {
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    Ok(meta.tensors().into_keys().collect())
}

/// Maps `model.safetensors`, or every shard named by `model.safetensors.index.json`.
#[allow(clippy::type_complexity)]
fn map_shards(dir: &Path) -> Result<(Vec<(PathBuf, Mmap)>, BTreeMap<String, usize>)> {
    let index_path = dir.join("model.safetensors.index.json");
    let shard_of: BTreeMap<String, String> = if index_path.is_file() {
        let idx: ShardIndex = serde_json::from_str(&read(&index_path)?)
            .map_err(|e| bad(&index_path, e.to_string()))?;
        idx.weight_map
    } else {
        BTreeMap::new()
    };
    let mut shards: Vec<String> = shard_of.values().cloned().collect();
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        shards.push("model.safetensors".into());
    }
    let mut files = Vec::new();
    let mut index = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        if shard.contains('/') || shard.contains("..") {
            return Err(bad(
                &index_path,
                format!("shard name {shard:?} leaves the directory"),
            ));
        }
        let path = dir.join(shard);
        let file = std::fs::File::open(&path).map_err(|source| ImportError::Io {
            path: path.clone(),
            source,
        })?;
        let map = map_read_only(&file).map_err(|source| ImportError::Io {
            path: path.clone(),
            source,
        })?;
        for name in safetensors_tensor_names(&map).map_err(|e| bad(&path, e))? {
            index.insert(name, i);
        }
        files.push((path, map));
    }
    Ok((files, index))
}

impl LlamaSource for HfModel {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn token_embd(&self) -> Result<Vec<f32>> {
        self.tensor_f32("model.embed_tokens.weight")
    }

    fn output_norm(&self) -> Result<Vec<f32>> {
        self.tensor_f32("model.norm.weight")
    }

    fn output(&self) -> Result<Option<Vec<f32>>> {
        if self.config.tied_output {
            return Ok(None);
        }
        self.tensor_f32("lm_head.weight").map(Some)
    }

    fn layer(&self, layer: usize, which: LayerTensor) -> Result<Vec<f32>> {
        self.tensor_f32(&layer_name(layer, which))
    }
}
