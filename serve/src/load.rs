//! The model behind `hetsched serve`: tokenizer, chat template and context from the file,
//! the weights at one precision, and a [`SessionEngine`] over them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched_exec::generate::ChatTemplate;
use hetsched_exec::{Calibration, LinearPrecision, PrefillOptions, load_models};
use hetsched_import::GgufFile;
use hetsched_runtime::progress::Silent;

use crate::session_engine::SessionEngine;
use crate::{Loader, Served};

/// Loads `path` (a GGUF file or a Hugging Face directory) at `precision` (a w8a8-shadow
/// model follows the calibration file beside it when there is one) and serves it with a
/// [`SessionEngine`] holding at most `max_requests`.
pub fn session_loader(
    path: PathBuf,
    precision: LinearPrecision,
    options: PrefillOptions,
    max_requests: usize,
) -> Loader {
    Box::new(move || {
        let chat = chat_template(&path);
        let calibration = match precision {
            LinearPrecision::W8a8Shadow => {
                let file = hetsched_exec::default_calibration_path(&path);
                match file.exists() {
                    true => Some((
                        file.clone(),
                        Calibration::load(&file).map_err(|e| e.to_string())?,
                    )),
                    false => None,
                }
            }
            _ => None,
        };
        let loaded = load_models(
            &path,
            &[precision],
            calibration.as_ref().map(|(p, c)| (p.as_path(), c)),
            32 << 20,
            &mut Silent,
        )
        .map_err(|e| e.to_string())?;
        let model = Arc::new(loaded.models.into_iter().next().ok_or("no model built")?);
        let tokenizer = Arc::new(loaded.tokenizer);
        let context = model.config.context_length;
        let engine = SessionEngine::start(model, tokenizer.clone(), options, max_requests);
        Ok(Served {
            tokenizer,
            chat,
            context,
            engine: Arc::new(engine),
        })
    })
}

/// The GGUF file's chat template, when it has one of the forms [`ChatTemplate`] renders.
fn chat_template(path: &Path) -> Option<ChatTemplate> {
    let file = GgufFile::open(path).ok()?;
    let text = file
        .metadata()
        .get_str("tokenizer.chat_template")
        .ok()
        .flatten()?;
    ChatTemplate::parse(text).ok()
}
