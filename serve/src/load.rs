//! The model behind `hetsched serve`: tokenizer, chat template and context from the file,
//! the weights at one precision, and the engine over them: a [`ConcurrentEngine`] (many
//! requests at once) on the CPU queues, a [`SessionEngine`] (one request at a time) when
//! a GPU lane is asked for, since the many-requests engine decodes on the CPU only.
//!
//! What a GPU lane needs is checked by [`check_backends`] before anything loads: a build
//! with the `gpu` feature, f32 linears for the resident GPU, a Vulkan device that opens.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched_exec::generate::ChatTemplate;
use hetsched_exec::generate::requests::RequestEngine;
use hetsched_exec::{Calibration, GpuUse, LinearPrecision, PrefillOptions, load_models};
use hetsched_import::GgufFile;
use hetsched_runtime::progress::Silent;
use thiserror::Error;

use crate::concurrent_engine::{ConcurrentEngine, server_limits};
use crate::engine::Engine;
use crate::session_engine::SessionEngine;
use crate::{Loader, Served};

/// What a GPU lane needs and this build, these settings or this machine lack.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BackendError {
    /// Built without the `gpu` feature.
    #[error(
        "--backends {backends} needs a GPU lane and this build has no GPU support: rebuild \
         with `cargo build --release --features gpu` (and glslc installed)"
    )]
    NoGpuSupport {
        /// The lanes asked for.
        backends: &'static str,
    },
    /// The resident GPU runs f32 linears only.
    #[error(
        "--backends gpu runs every stage resident on the GPU in f32: serve it with \
         --precision f32 (not {precision})"
    )]
    ResidentNeedsF32 {
        /// The precision asked for.
        precision: String,
    },
    /// No Vulkan device opens.
    #[error("--backends {backends} needs a Vulkan device, and none opens: {reason}")]
    NoDevice {
        /// The lanes asked for.
        backends: &'static str,
        /// The Vulkan loader's or driver's words.
        reason: String,
    },
}

/// Checks, before the model loads, that the lanes `gpu` asks for can run at `precision`:
/// nothing for the CPU queues; for a GPU lane, a build with GPU support, f32 linears when
/// every stage is resident, and a Vulkan device that opens. Returns the device's name.
///
/// # Errors
/// [`BackendError`]: what is missing.
pub fn check_backends(
    gpu: GpuUse,
    precision: LinearPrecision,
) -> Result<Option<String>, BackendError> {
    let backends = match gpu {
        GpuUse::Off => return Ok(None),
        GpuUse::FloatLane => "cpu,gpu,npu",
        GpuUse::Resident => "gpu",
    };
    if !cfg!(feature = "gpu") {
        return Err(BackendError::NoGpuSupport { backends });
    }
    if gpu == GpuUse::Resident && precision != LinearPrecision::F32 {
        let precision = serde_json::to_value(precision)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{precision:?}"));
        return Err(BackendError::ResidentNeedsF32 { precision });
    }
    open_device(backends).map(Some)
}

/// The name of the Vulkan device a GPU lane would open.
#[cfg(feature = "gpu")]
fn open_device(backends: &'static str) -> Result<String, BackendError> {
    hetsched_gpu::GpuContext::new(hetsched_gpu::GpuOptions::default())
        .map(|context| context.info().name.clone())
        .map_err(|e| BackendError::NoDevice {
            backends,
            reason: e.to_string(),
        })
}

#[cfg(not(feature = "gpu"))]
fn open_device(backends: &'static str) -> Result<String, BackendError> {
    Err(BackendError::NoGpuSupport { backends })
}

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
/// GPU lane (check that first: [`check_backends`]).
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
            GpuUse::FloatLane | GpuUse::Resident => Arc::new(
                SessionEngine::start(model, tokenizer.clone(), options, bounds.max_requests)
                    .map_err(|e| e.to_string())?,
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_queues_need_nothing_and_a_gpu_lane_says_what_it_lacks() {
        assert_eq!(check_backends(GpuUse::Off, LinearPrecision::W8a8), Ok(None));
        let resident = check_backends(GpuUse::Resident, LinearPrecision::W8a8).unwrap_err();
        if cfg!(feature = "gpu") {
            let precision = "w8a8".to_string();
            assert_eq!(resident, BackendError::ResidentNeedsF32 { precision });
            assert!(
                resident.to_string().contains("--precision f32"),
                "{resident}"
            );
        } else {
            assert_eq!(resident, BackendError::NoGpuSupport { backends: "gpu" });
            let float_lane = check_backends(GpuUse::FloatLane, LinearPrecision::W8a8);
            let backends = "cpu,gpu,npu";
            assert_eq!(float_lane, Err(BackendError::NoGpuSupport { backends }));
            assert!(
                resident.to_string().contains("--features gpu"),
                "{resident}"
            );
        }
    }
}
