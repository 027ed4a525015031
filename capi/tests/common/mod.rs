//! What the capi tests share.

use std::path::{Path, PathBuf};

/// The test model, or `None` with a note where it was not fetched
/// (`scripts/fetch-model.sh` fetches it into `models/`).
pub fn test_model() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipped: no test model at {} (scripts/fetch-model.sh fetches it)",
            path.display()
        );
        None
    }
}
