//! Architecture rules checked against the source tree: no import circle between files
//! of different modules in any crate (a parent module and its child may name each
//! other's items); every source file in docs/architecture.md's code map; no thread or
//! lock in the scheduler's crate; README.md and docs/ name no work session, issue or
//! device tool.

mod code_map;
mod docs_reference;
mod imports;

use std::path::{Path, PathBuf};

use imports::ImportGraph;

/// The workspace root (this package's directory).
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every crate's source folder: the root package's `src/`, and `src/` of each folder
/// beside it with a `Cargo.toml` (the workspace's member crates).
fn crate_sources() -> Vec<PathBuf> {
    let root = workspace();
    let mut sources = vec![root.join("src")];
    let mut members: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("the workspace folder is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .map(|p| p.join("src"))
        .collect();
    members.sort();
    sources.extend(members);
    sources
}

#[test]
fn no_import_circle_between_files_of_different_modules() {
    let mut found = Vec::new();
    for src in crate_sources() {
        for circle in ImportGraph::read(&src).circles() {
            let files: Vec<String> = circle
                .iter()
                .map(|p| {
                    p.strip_prefix(workspace())
                        .unwrap_or(p)
                        .display()
                        .to_string()
                })
                .collect();
            found.push(files.join(" ↔ "));
        }
    }
    assert!(
        found.is_empty(),
        "files of different modules import each other (a parent module and its child \
         excepted); move the shared item down a layer:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_source_file_is_in_the_code_map() {
    let map = std::fs::read_to_string(workspace().join("docs/architecture.md"))
        .expect("docs/architecture.md is readable");
    let sections = code_map::sections(&map);
    let mut missing = Vec::new();
    for src in crate_sources() {
        let crate_dir = src.parent().expect("src has a parent");
        let folder = match crate_dir == workspace() {
            true => "src".to_string(),
            false => crate_dir
                .strip_prefix(workspace())
                .expect("a member folder")
                .display()
                .to_string(),
        };
        let Some(names) = sections.get(&folder) else {
            missing.push(format!("{folder}/ (no section `### `{folder}/``)"));
            continue;
        };
        let prefix = if folder == "src" { "src" } else { &folder };
        missing.extend(
            code_map::unmapped(&src, names)
                .into_iter()
                .map(|f| format!("{prefix}/src/{f}").replace("src/src/", "src/")),
        );
    }
    assert!(
        missing.is_empty(),
        "source files missing from docs/architecture.md's code map (name each by its path \
         under src/ in its crate's section):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scheduler_crate_names_no_thread_or_lock() {
    // systems decides from the world on the caller's thread; the memory planner's threads
    // are hetsched-memplan's, sized by the caller.
    let forbidden = [
        "std::thread",
        "thread::scope",
        "thread::spawn",
        "Mutex",
        "Condvar",
        "RwLock",
    ];
    let mut found = Vec::new();
    for file in imports::source_files(&workspace().join("systems/src")) {
        let text = std::fs::read_to_string(&file.path).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden.iter().filter(|w| code.contains(*w)) {
                let path = file.path.strip_prefix(workspace()).unwrap_or(&file.path);
                found.push(format!("{}:{}: {word}", path.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "systems names threads or locks:\n{}",
        found.join("\n")
    );
}

/// Writes `files` (path under `src/`, contents) into a fresh folder and reads its graph.
fn graph_of(name: &str, files: &[(&str, &str)]) -> ImportGraph {
    let dir = std::env::temp_dir().join(format!("hetsched-arch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent folder")).expect("temp folder");
        std::fs::write(&path, text).expect("temp file");
    }
    let graph = ImportGraph::read(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    graph
}

#[test]
fn the_checker_finds_a_circle_through_re_exports_and_skips_parent_and_child() {
    let graph = graph_of(
        "circle",
        &[
            ("lib.rs", "mod a;\nmod b;\nmod c;\npub use b::Thing;\n"),
            // a → b through the root's re-export; b → a directly: a circle.
            ("a.rs", "use crate::Thing;\npub struct Other(Thing);\n"),
            (
                "b.rs",
                "pub struct Thing;\nfn f() -> super::a::Other { todo!() }\n",
            ),
            // c → c/child and back: a parent and its child, allowed.
            ("c/mod.rs", "mod child;\npub struct Top;\nuse child::Low;\n"),
            ("c/child.rs", "use super::Top;\npub struct Low;\n"),
        ],
    );
    let circles = graph.circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    let names: Vec<String> = circles[0]
        .iter()
        .map(|p| {
            p.file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names, ["a.rs", "b.rs"]);
}

#[test]
fn the_checker_ignores_comments_strings_and_test_modules() {
    let graph = graph_of(
        "ignored",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            (
                "a.rs",
                "pub struct A;\n// use crate::b::B;\nconst S: &str = \"crate::b::B\";\n\
                 #[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\n",
            ),
            ("b.rs", "use crate::a::A;\npub struct B(A);\n"),
        ],
    );
    assert!(graph.circles().is_empty());
    // b imports a; nothing else.
    assert_eq!(graph.edges.len(), 1);
}
