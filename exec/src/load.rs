//! Loading a model for real prefill from a GGUF file or a Hugging Face directory: the
//! tokenizer and one [`ExecModel`] per precision asked for, from one open of the source.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use super::calibration::Calibration;
use super::error::ExecError;
use super::weights::{ExecModel, LinearPrecision};
use hetsched_import::{
    ColumnSource, FamilyTensor, GgufFile, GgufSource, GgufTokenizer, HfModel, ImportError,
    LayerTensor, LlamaConfig, LlamaSource,
};
use hetsched_runtime::progress::Progress;

/// Why a model could not be loaded; each names the file at fault.
#[derive(Debug, Error)]
pub enum LoadError {
    /// The model file or directory could not be read as a llama model.
    #[error("{}: {error}", path.display())]
    Model {
        /// The GGUF file or Hugging Face directory.
        path: PathBuf,
        /// What was wrong with it.
        error: ImportError,
    },
    /// The calibration does not fit the model (or the model could not be loaded with it).
    #[error("{}: {error}", path.display())]
    Calibrated {
        /// The calibration file.
        path: PathBuf,
        /// What was wrong.
        error: Box<ExecError>,
    },
    /// The tokenizer's vocabulary does not fit the model's embedding rows: it names ids
    /// past them, or covers less than 7/8 of them (`MIN_VOCAB_COVER`: another model's).
    #[error(
        "{}: the tokenizer has {tokens} tokens but the model {rows} embedding rows; a tokenizer of another model?",
        path.display()
    )]
    TokenizerMismatch {
        /// The GGUF file or Hugging Face directory.
        path: PathBuf,
        /// Tokens in the tokenizer's vocabulary.
        tokens: usize,
        /// Rows of the token embedding (the config's vocabulary size).
        rows: usize,
    },
}

/// The least share of a model's embedding rows its tokenizer must name: checkpoints pad
/// the embedding past the vocabulary (to a multiple of 64 or 128: Qwen's 151 936 rows hold
/// 151 646 tokens), never by much.
pub const MIN_VOCAB_COVER: f64 = 0.875;

/// Refuses a tokenizer of `tokens` entries beside an embedding of `rows` rows (see
/// [`LoadError::TokenizerMismatch`]).
fn check_vocab(path: &Path, tokens: usize, rows: usize) -> Result<(), LoadError> {
    if tokens > rows || (tokens as f64) < MIN_VOCAB_COVER * rows as f64 {
        return Err(LoadError::TokenizerMismatch {
            path: path.to_owned(),
            tokens,
            rows,
        });
    }
    Ok(())
}

/// A tokenizer and the models [`load_models`] built.
pub struct LoadedModels {
    /// The model's tokenizer.
    pub tokenizer: GgufTokenizer,
    /// One model per precision asked for, in that order.
    pub models: Vec<ExecModel>,
}

/// Loads the tokenizer and the model at each of `precisions` from `path` (a GGUF file or
/// a Hugging Face directory). A w8a8-shadow model follows `calibration` (its file and
/// contents) when given, keeping cold shadow rows within `cold_cache_bytes`. `progress`
/// counts the models built.
pub fn load_models(
    path: &Path,
    precisions: &[LinearPrecision],
    calibration: Option<(&Path, &Calibration)>,
    cold_cache_bytes: u64,
    progress: &mut dyn Progress,
) -> Result<LoadedModels, LoadError> {
    let shown = |error| LoadError::Model {
        path: path.to_owned(),
        error,
    };
    progress.set_len(precisions.len() as u64);
    // Declared first: `source` may borrow it.
    let file;
    let (tokenizer, source, columns): (_, Box<dyn LlamaSource + '_>, Arc<dyn ColumnSource>);
    if path.is_dir() {
        let hf = Arc::new(HfModel::open(path).map_err(shown)?);
        tokenizer =
            GgufTokenizer::from_tokenizer_json(&hf.tokenizer_path(), false).map_err(shown)?;
        source = Box::new(SharedSource(hf.clone()));
        columns = hf;
    } else {
        file = Arc::new(GgufFile::open(path).map_err(shown)?);
        tokenizer = GgufTokenizer::from_gguf(&file).map_err(shown)?;
        source = Box::new(GgufSource::new(&file).map_err(shown)?);
        columns = file.clone();
    }
    check_vocab(path, tokenizer.vocab_size(), source.config().vocab_size)?;
    let mut models = Vec::with_capacity(precisions.len());
    for &precision in precisions {
        let model = match (precision, calibration) {
            (LinearPrecision::W8a8Shadow, Some((cal_path, cal))) => {
                let mut model = ExecModel::from_source_calibrated(
                    &*source,
                    cal,
                    columns.clone(),
                    cold_cache_bytes,
                )
                .map_err(|error| LoadError::Calibrated {
                    path: cal_path.to_owned(),
                    error: Box::new(error),
                })?;
                model.calibration_file = Some(cal_path.display().to_string());
                model
            }
            _ => ExecModel::from_source(&*source, precision).map_err(shown)?,
        };
        models.push(model);
        progress.inc(1);
    }
    progress.finish();
    Ok(LoadedModels { tokenizer, models })
}

/// A Hugging Face checkpoint shared between the loader and the shadow's cold-row reads.
struct SharedSource(Arc<HfModel>);

impl LlamaSource for SharedSource {
    fn config(&self) -> &LlamaConfig {
        self.0.config()
    }
    fn name(&self) -> String {
        self.0.name()
    }
    fn token_embd(&self) -> Result<Vec<f32>, ImportError> {
        self.0.token_embd()
    }
    fn output_norm(&self) -> Result<Vec<f32>, ImportError> {
        self.0.output_norm()
    }
    fn output(&self) -> Result<Option<Vec<f32>>, ImportError> {
        self.0.output()
    }
    fn layer(&self, layer: usize, which: LayerTensor) -> Result<Vec<f32>, ImportError> {
        self.0.layer(layer, which)
    }
    fn family_tensor(&self, layer: usize, which: FamilyTensor) -> Result<Vec<f32>, ImportError> {
        self.0.family_tensor(layer, which)
    }
}
