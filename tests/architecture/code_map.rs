//! The code map of docs/architecture.md: one section per crate (`### \`folder/\` ...`),
//! in which every source file of the crate is named by its path under `src/`
//! (`` `memory/schedule.rs` ``).

use std::collections::BTreeMap;
use std::path::Path;

/// Each crate section's folder (`exec/`, `src/` for the root package) and the names in
/// backticks in its text.
pub fn sections(map: &str) -> BTreeMap<String, Vec<String>> {
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in map.lines() {
        if let Some(heading) = line.strip_prefix("### `") {
            current = heading
                .split('`')
                .next()
                .map(|folder| folder.trim_end_matches('/').to_string());
            continue;
        }
        if line.starts_with("## ") {
            current = None;
            continue;
        }
        let Some(folder) = &current else { continue };
        let names = sections.entry(folder.clone()).or_default();
        names.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
    }
    sections
}

/// The source files under `src` that `names` does not mention by their path under `src/`.
pub fn unmapped(src: &Path, names: &[String]) -> Vec<String> {
    let mut files: Vec<String> = crate::imports::source_files(src)
        .into_iter()
        .map(|f| {
            let relative = f.path.strip_prefix(src).expect("under src");
            relative.to_string_lossy().replace('\\', "/")
        })
        .collect();
    files.retain(|f| !names.iter().any(|n| n == f));
    files.sort();
    files
}
