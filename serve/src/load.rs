//! The model behind `hetsched serve`: tokenizer, chat template and context from the file,
//! the weights at one precision, and the engine over them: a [`ConcurrentEngine`] (many
//! requests at once) on the CPU queues, a [`SessionEngine`] (one request at a time) when
//! a GPU lane is asked for, since the many-requests engine decodes on the CPU only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched_exec::generate::ChatTemplate;
use hetsched_exec::generate::requests::RequestEngine;
use hetsched_exec::{Calibration, GpuUse, LinearPrecision, PrefillOptions, load_models};
use hetsched_import::GgufFile;
use hetsched_runtime::progress::Silent;

use crate::concurrent_engine::{ConcurrentEngine, server_limits};
use crate::engine::Engine;
use crate::session_engine::SessionEngine;
use crate::{Loader, Served};

/// What the engine may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineBounds {
    /// Requests queued and running at most.
    pub max_requests: usize,
    /// KV cache bytes of running requests together at most (the many-requests engine;
    /// the one-at-a-time engine holds one request's cache).
    pub kv_budget_bytes: usize,
}

/// Loads `path` (a GGUF file or a Hugging Face directory) at `precision` (a w8a8-shadow
/// model follows the calibration file beside it when there is one) and serves it within
/// `bounds`: with a [`ConcurrentEngine`], or a [`SessionEngine`] when `options` ask for a
/// GPU lane.
pub fn loader(
    path: PathBuf,
    precision: LinearPrecision,
    options: PrefillOptions,
    bounds: EngineBounds,
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
        let engine: Arc<dyn Engine> = match options.gpu {
            GpuUse::Off => {
                let limits = server_limits(bounds.kv_budget_bytes, bounds.max_requests);
                let engine = RequestEngine::start(model, tokenizer.clone(), options, limits)
                    .map_err(|e| e.to_string())?;
                Arc::new(ConcurrentEngine::new(engine).map_err(|e| e.to_string())?)
            }
            _ => Arc::new(SessionEngine::start(
                model,
                tokenizer.clone(),
                options,
                bounds.max_requests,
            )),
        };
        Ok(Served {
            tokenizer,
            chat,
            context,
            engine,
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
