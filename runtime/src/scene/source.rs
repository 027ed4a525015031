//! Where scene files come from (a directory on disk, or the scenes embedded in the binary)
//! and how their TOML is parsed, errors placed at file:line:column.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::SceneError;
use hetsched_limits as limits;

/// Files under `scenes/`, embedded: (path relative to `scenes/`, contents).
const EMBEDDED: &[(&str, &str)] = &[
    (
        "qwen1.5-1.8b-xiaomi14.toml",
        include_str!("../../../scenes/qwen1.5-1.8b-xiaomi14.toml"),
    ),
    (
        "gemma-2b-xiaomi14.toml",
        include_str!("../../../scenes/gemma-2b-xiaomi14.toml"),
    ),
    (
        "llama-2-7b-xiaomi14.toml",
        include_str!("../../../scenes/llama-2-7b-xiaomi14.toml"),
    ),
    (
        "qwen1.5-1.8b-k60pro.toml",
        include_str!("../../../scenes/qwen1.5-1.8b-k60pro.toml"),
    ),
    (
        "gemma-2b-k60pro.toml",
        include_str!("../../../scenes/gemma-2b-k60pro.toml"),
    ),
    (
        "llama-2-7b-k60pro.toml",
        include_str!("../../../scenes/llama-2-7b-k60pro.toml"),
    ),
    (
        "qwen1.5-1.8b-xiaomi14-gpu.toml",
        include_str!("../../../scenes/qwen1.5-1.8b-xiaomi14-gpu.toml"),
    ),
    (
        "llama-2-7b-xiaomi14-gpu.toml",
        include_str!("../../../scenes/llama-2-7b-xiaomi14-gpu.toml"),
    ),
    (
        "smollm2-135m-desktop.toml",
        include_str!("../../../scenes/smollm2-135m-desktop.toml"),
    ),
    (
        "devices/xiaomi14.toml",
        include_str!("../../../scenes/devices/xiaomi14.toml"),
    ),
    (
        "devices/xiaomi14-gpu.toml",
        include_str!("../../../scenes/devices/xiaomi14-gpu.toml"),
    ),
    (
        "devices/k60pro.toml",
        include_str!("../../../scenes/devices/k60pro.toml"),
    ),
    (
        "devices/desktop.toml",
        include_str!("../../../scenes/devices/desktop.toml"),
    ),
    (
        "models/qwen1.5-1.8b.toml",
        include_str!("../../../scenes/models/qwen1.5-1.8b.toml"),
    ),
    (
        "models/gemma-2b.toml",
        include_str!("../../../scenes/models/gemma-2b.toml"),
    ),
    (
        "models/llama-2-7b.toml",
        include_str!("../../../scenes/models/llama-2-7b.toml"),
    ),
    (
        "models/smollm2-135m.toml",
        include_str!("../../../scenes/models/smollm2-135m.toml"),
    ),
];

/// Where scene files come from.
pub(super) enum Source {
    Disk(PathBuf),
    Embedded,
}

impl Source {
    /// Reads the file `path` on its own (a device profile, a model description).
    pub(super) fn read_alone(path: &Path) -> Result<(String, String), SceneError> {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Source::Disk(dir).read(&name)
    }

    pub(super) fn read(&self, relative: &str) -> Result<(String, String), SceneError> {
        match self {
            Source::Disk(dir) => {
                let path = dir.join(relative);
                let shown = path.display().to_string();
                limits::read_text(&path, limits::MAX_TEXT_FILE_BYTES)
                    .map(|text| (shown.clone(), text))
                    .map_err(|e| SceneError::Io {
                        path: shown,
                        message: e.to_string(),
                    })
            }
            Source::Embedded => embedded(relative)
                .map(|text| (format!("<shipped>/{relative}"), text.to_string()))
                .ok_or_else(|| SceneError::Io {
                    path: format!("<shipped>/{relative}"),
                    message: "not a shipped scene file".into(),
                }),
        }
    }
}

fn embedded(relative: &str) -> Option<&'static str> {
    EMBEDDED
        .iter()
        .find(|(path, _)| *path == relative)
        .map(|(_, text)| *text)
}

/// Names of the shipped scenes (without `.toml`).
pub fn shipped_scenes() -> Vec<&'static str> {
    EMBEDDED
        .iter()
        .filter(|(path, _)| !path.contains('/'))
        .map(|(path, _)| path.trim_end_matches(".toml"))
        .collect()
}

pub(super) fn parse<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, SceneError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e
            .span()
            .map_or((1, 1), |span| line_column(text, span.start));
        SceneError::Parse {
            path: path.to_string(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
