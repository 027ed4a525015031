//! The command line: `--json`, `--kernels`, `--shapes` and `--quick`.

use super::{DEFAULT_KERNELS, Kernel};

/// `m x k x n` from "MxKxN".
fn parse_shape(text: &str) -> Option<(usize, usize, usize)> {
    let dims: Vec<usize> = text
        .split('x')
        .map(|d| d.parse().ok())
        .collect::<Option<_>>()?;
    match dims[..] {
        [m, k, n] if m > 0 && k > 0 && n > 0 => Some((m, k, n)),
        _ => None,
    }
}

/// `--json FILE`: the file the tables are also written to, as JSON lines.
pub(super) fn json_arg(args: &[String]) -> Result<Option<std::fs::File>, String> {
    match args
        .iter()
        .position(|a| a == "--json")
        .map(|i| args.get(i + 1))
    {
        None => Ok(None),
        Some(None) => Err("--json needs a file name".into()),
        Some(Some(path)) => std::fs::File::create(path)
            .map(Some)
            .map_err(|e| format!("cannot create {path}: {e}")),
    }
}

/// `--kernels a,b`: only these GEMM kernels (by their table names), and no ops table.
/// Returns the names asked for, if any, and the kernels to run.
pub(super) fn kernels_arg(args: &[String]) -> Result<(Option<Vec<String>>, Vec<Kernel>), String> {
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--kernels")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_string).collect());
    let kernels: Vec<Kernel> = match &only {
        None => DEFAULT_KERNELS.to_vec(),
        Some(names) => {
            let picked: Vec<Kernel> = Kernel::all()
                .filter(|k| names.iter().any(|n| n == k.name()))
                .collect();
            if picked.len() != names.len() {
                let known: Vec<&str> = Kernel::all().map(Kernel::name).collect();
                return Err(format!("--kernels takes names among {}", known.join(", ")));
            }
            picked
        }
    };
    Ok((only, kernels))
}

/// `--shapes 4096x4096x4096,...` (m x k x n): only these; else a quick pair with
/// `--quick`, else large square GEMMs and SmolLM2's.
pub(super) fn shapes_arg(
    args: &[String],
    quick: bool,
) -> Result<Vec<(usize, usize, usize)>, String> {
    let chosen: Option<Vec<(usize, usize, usize)>> = match args
        .iter()
        .position(|a| a == "--shapes")
        .and_then(|i| args.get(i + 1))
    {
        None => None,
        Some(list) => match list.split(',').map(parse_shape).collect() {
            Some(shapes) => Some(shapes),
            None => {
                return Err(
                    "--shapes takes m x k x n triples like 4096x4096x4096,512x576x1536".into(),
                );
            }
        },
    };
    Ok(if let Some(shapes) = chosen {
        shapes
    } else if quick {
        vec![(256, 256, 256), (512, 576, 1536)]
    } else {
        vec![
            (4096, 4096, 4096),
            (8192, 8192, 8192),
            (2048, 2048, 8192),
            (512, 576, 1536), // SmolLM2 gate / up, one 512-token chunk
            (512, 1536, 576), // SmolLM2 down
            (512, 576, 576),  // SmolLM2 q / o
        ]
    })
}
