//! Compiles every `shaders/*.comp` (GLSL 450) to SPIR-V with the `glslc` binary.
//!
//! Not the shaderc crate: Debian's shaderc static library cannot be linked, and the glslc
//! binary is one `apt-get install glslc` away.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = PathBuf::from("shaders");
    println!("cargo:rerun-if-changed=shaders");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("gpu/shaders exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    sources.sort();
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        if src.extension().and_then(|e| e.to_str()) != Some("comp") {
            continue;
        }
        let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("shader");
        let spv = out.join(format!("{stem}.spv"));
        let status = Command::new("glslc")
            .args(["--target-env=vulkan1.1", "-O", "-I"])
            .arg(&dir)
            .arg(&src)
            .arg("-o")
            .arg(&spv)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("glslc failed on {} ({s})", src.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("glslc not found: install Debian package `glslc` (apt-get install glslc)")
            }
            Err(e) => panic!("could not run glslc: {e}"),
        }
    }
}
