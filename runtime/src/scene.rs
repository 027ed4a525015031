//! Scenes: a device profile, a model and a workload, read from TOML.
//!
//! A scene file names its device and model files by paths relative to itself, so several
//! scenes share them. Unknown keys are rejected. The scenes shipped in `scenes/` are also
//! embedded in the binary, so `hetsched simulate` runs without any file.

use std::path::{Path, PathBuf};

use hetsched_systems::graph::build_stages;
use hetsched_systems::memory::MemoryConfig;
use hetsched_systems::model::ChunkShape;
use hetsched_systems::policy::UnknownPolicy;
use hetsched_systems::{
    DEFAULT_POLICY, DeviceProfile, ModelConfig, PlacementConfig, PlanError, Policy, PolicyRegistry,
    PrefillPlan, Workload,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use hetsched_limits::{self as limits, LimitError};

/// The scene `hetsched simulate` runs when none is given.
pub const DEFAULT_SCENE: &str = "qwen1.5-1.8b-xiaomi14";

/// Files under `scenes/`, embedded: (path relative to `scenes/`, contents).
const EMBEDDED: &[(&str, &str)] = &[
    (
        "qwen1.5-1.8b-xiaomi14.toml",
        include_str!("../../scenes/qwen1.5-1.8b-xiaomi14.toml"),
    ),
    (
        "gemma-2b-xiaomi14.toml",
        include_str!("../../scenes/gemma-2b-xiaomi14.toml"),
    ),
    (
        "llama-2-7b-xiaomi14.toml",
        include_str!("../../scenes/llama-2-7b-xiaomi14.toml"),
    ),
    (
        "qwen1.5-1.8b-k60pro.toml",
        include_str!("../../scenes/qwen1.5-1.8b-k60pro.toml"),
    ),
    (
        "gemma-2b-k60pro.toml",
        include_str!("../../scenes/gemma-2b-k60pro.toml"),
    ),
    (
        "llama-2-7b-k60pro.toml",
        include_str!("../../scenes/llama-2-7b-k60pro.toml"),
    ),
    (
        "qwen1.5-1.8b-xiaomi14-gpu.toml",
        include_str!("../../scenes/qwen1.5-1.8b-xiaomi14-gpu.toml"),
    ),
    (
        "llama-2-7b-xiaomi14-gpu.toml",
        include_str!("../../scenes/llama-2-7b-xiaomi14-gpu.toml"),
    ),
    (
        "smollm2-135m-desktop.toml",
        include_str!("../../scenes/smollm2-135m-desktop.toml"),
    ),
    (
        "devices/xiaomi14.toml",
        include_str!("../../scenes/devices/xiaomi14.toml"),
    ),
    (
        "devices/xiaomi14-gpu.toml",
        include_str!("../../scenes/devices/xiaomi14-gpu.toml"),
    ),
    (
        "devices/k60pro.toml",
        include_str!("../../scenes/devices/k60pro.toml"),
    ),
    (
        "devices/desktop.toml",
        include_str!("../../scenes/devices/desktop.toml"),
    ),
    (
        "models/qwen1.5-1.8b.toml",
        include_str!("../../scenes/models/qwen1.5-1.8b.toml"),
    ),
    (
        "models/gemma-2b.toml",
        include_str!("../../scenes/models/gemma-2b.toml"),
    ),
    (
        "models/llama-2-7b.toml",
        include_str!("../../scenes/models/llama-2-7b.toml"),
    ),
    (
        "models/smollm2-135m.toml",
        include_str!("../../scenes/models/smollm2-135m.toml"),
    ),
];

/// Why a scene could not be loaded.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SceneError {
    /// No such file, and no shipped scene of that name.
    #[error(
        "scene `{path}` not found: no such file and no shipped scene of that name (shipped: {shipped})"
    )]
    NotFound {
        /// What was asked for.
        path: String,
        /// Names of the shipped scenes.
        shipped: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// A file is not valid TOML for its role, or has unknown keys.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// The parts are readable but do not make a valid plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The scene names a policy that is not built in.
    #[error("{path}: {source}")]
    Policy {
        /// The scene file.
        path: String,
        /// The unknown name and the known ones.
        source: UnknownPolicy,
    },
    /// A size past the limits (docs/robustness.md).
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A processor's modeled time for the plan does not fit the cost arithmetic.
    #[error(
        "processor `{processor}` would take {seconds:.3e} s for this plan (stage {stage} alone {stage_seconds:.3e} s per chunk), past the limit of {max_seconds:.3e} s: check its peak_gops, bandwidth_gbps, launch_us, op_overhead_us and measured latencies"
    )]
    CostOverflow {
        /// The processor.
        processor: String,
        /// Its total modeled time, in s.
        seconds: f64,
        /// Its costliest stage.
        stage: String,
        /// That stage's modeled time, in s.
        stage_seconds: f64,
        /// The limit, in s.
        max_seconds: f64,
    },
}

/// A scene's `[workload]` table: the plan's [`Workload`] and the policy's name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadTable {
    prompt_len: u32,
    chunk_len: u32,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    float_processor: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SceneFile {
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    device: String,
    model: String,
    workload: WorkloadTable,
    #[serde(default)]
    memory: MemoryConfig,
    #[serde(default)]
    placement: PlacementConfig,
}

/// A loaded scene.
#[derive(Debug, Clone, PartialEq)]
pub struct Scene {
    /// Scene name.
    pub name: String,
    /// Device profile.
    pub device: DeviceProfile,
    /// Model.
    pub model: ModelConfig,
    /// Workload.
    pub workload: Workload,
    /// The policy's name (a built-in one: see [`PolicyRegistry::builtin`]).
    pub policy: String,
    /// Memory budgets and alignment (the optional `[memory]` table).
    pub memory: MemoryConfig,
    /// Where each kind of stage may run (the optional `[placement]` table; empty: fixed
    /// placement).
    pub placement: PlacementConfig,
}

/// Where scene files come from.
enum Source {
    Disk(PathBuf),
    Embedded,
}

impl Source {
    /// Reads the file `path` on its own (a device profile, a model description).
    fn read_alone(path: &Path) -> Result<(String, String), SceneError> {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Source::Disk(dir).read(&name)
    }

    fn read(&self, relative: &str) -> Result<(String, String), SceneError> {
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

/// `value` (a device profile, a model) as the TOML text the scene loader reads back.
pub fn toml_text<T: serde::Serialize>(value: &T) -> Result<String, String> {
    toml::to_string(value).map_err(|e| e.to_string())
}

/// Names of the shipped scenes (without `.toml`).
pub fn shipped_scenes() -> Vec<&'static str> {
    EMBEDDED
        .iter()
        .filter(|(path, _)| !path.contains('/'))
        .map(|(path, _)| path.trim_end_matches(".toml"))
        .collect()
}

fn parse<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, SceneError> {
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

impl Scene {
    /// The embedded default scene.
    pub fn default_scene() -> Scene {
        Scene::load(Path::new(DEFAULT_SCENE)).expect("the shipped default scene is valid")
    }

    /// Loads a scene file, or a shipped scene by name (`gemma-2b-xiaomi14`).
    pub fn load(path: &Path) -> Result<Scene, SceneError> {
        if path.is_file() {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Scene::from_source(&Source::Disk(dir), &name);
        }
        let wanted = path.to_string_lossy();
        let wanted = wanted
            .trim_start_matches("scenes/")
            .trim_end_matches(".toml");
        if shipped_scenes().contains(&wanted) {
            return Scene::from_source(&Source::Embedded, &format!("{wanted}.toml"));
        }
        Err(SceneError::NotFound {
            path: path.display().to_string(),
            shipped: shipped_scenes().join(", "),
        })
    }

    fn from_source(source: &Source, file: &str) -> Result<Scene, SceneError> {
        let (path, text) = source.read(file)?;
        let scene: SceneFile = parse(&path, &text)?;
        let device = source.read(&scene.device)?;
        let model = source.read(&scene.model)?;
        Scene::assemble(path, scene, device, model)
    }

    /// Loads a device profile file on its own (`hetsched run --profile`), with the
    /// scene loader's checks: TOML errors with file:line:column, unknown keys rejected,
    /// rates and latencies in range.
    pub fn load_device(path: &Path) -> Result<DeviceProfile, SceneError> {
        let (shown, text) = Source::read_alone(path)?;
        let device: DeviceProfile = parse(&shown, &text)?;
        device.validate()?;
        Ok(device)
    }

    /// Loads a model description file on its own (a scene's model TOML), with the scene
    /// loader's checks: TOML errors with file:line:column, unknown keys rejected, sizes
    /// within the limits.
    pub fn load_model(path: &Path) -> Result<ModelConfig, SceneError> {
        let (shown, text) = Source::read_alone(path)?;
        let model: ModelConfig = parse(&shown, &text)?;
        check_model(&model)?;
        Ok(model)
    }

    /// Parses a scene held in memory, with the checks of [`Scene::load`]: `scene` is the
    /// scene file's text, whose `device` and `model` paths are ignored for the `device`
    /// and `model` texts given. (The fuzzer `examples/fuzz_parsers.rs` drives this.)
    pub fn from_texts(scene: &str, device: &str, model: &str) -> Result<Scene, SceneError> {
        let path = "<memory>/scene.toml".to_string();
        let file: SceneFile = parse(&path, scene)?;
        Scene::assemble(
            path,
            file,
            ("<memory>/device.toml".into(), device.into()),
            ("<memory>/model.toml".into(), model.into()),
        )
    }

    fn assemble(
        path: String,
        scene: SceneFile,
        (device_path, device_text): (String, String),
        (model_path, model_text): (String, String),
    ) -> Result<Scene, SceneError> {
        let table = scene.workload;
        let policy = table.policy.unwrap_or_else(|| DEFAULT_POLICY.to_string());
        if let Err(source) = PolicyRegistry::builtin().check(&policy) {
            return Err(SceneError::Policy { path, source });
        }
        let model: ModelConfig = parse(&model_path, &model_text)?;
        check_model(&model)?;
        Ok(Scene {
            name: scene.name,
            device: parse(&device_path, &device_text)?,
            model,
            workload: Workload {
                prompt_len: table.prompt_len,
                chunk_len: table.chunk_len,
                float_processor: table.float_processor,
            },
            policy,
            memory: scene.memory,
            placement: scene.placement,
        })
    }

    /// Builds the prefill plan of this scene, with its placement rules and memory
    /// budgets.
    pub fn plan(&self) -> Result<PrefillPlan, SceneError> {
        self.check_cost_range()?;
        Ok(PrefillPlan::placed(
            self.model.clone(),
            self.device.clone(),
            self.workload.clone(),
            self.placement.clone(),
        )?
        .with_memory(self.memory.clone())?)
    }

    /// A fresh instance of the scene's policy.
    ///
    /// # Errors
    /// [`SceneError::Policy`] if [`Scene::policy`] was set to a name that is not built in.
    pub fn new_policy(&self) -> Result<Box<dyn Policy>, SceneError> {
        PolicyRegistry::builtin()
            .create(&self.policy)
            .map_err(|source| SceneError::Policy {
                path: self.name.clone(),
                source,
            })
    }

    /// Checks, before the plan is built, that its size and every processor's modeled
    /// time stay within the limits: an upper bound (every chunk at the last chunk's
    /// past) computed in f64, so that the plan's u64 sums cannot overflow.
    fn check_cost_range(&self) -> Result<(), SceneError> {
        check_model(&self.model)?;
        self.device.validate()?;
        let stages = build_stages(&self.model)?;
        let w = &self.workload;
        let chunks = u64::from(w.prompt_len.div_ceil(w.chunk_len.max(1)));
        limits::check(
            "plan instances (chunks × stages)",
            chunks.saturating_mul(stages.len() as u64),
            limits::MAX_INSTANCES,
        )?;
        let shape = ChunkShape {
            tokens: u64::from(w.chunk_len),
            past: u64::from(w.prompt_len),
        };
        for p in &self.device.processors {
            let (mut total, mut worst) = (0.0f64, (0.0f64, ""));
            for stage in &stages {
                let roofline = || {
                    stage.ops.iter().fold(p.cost.launch_us * 1e3, |sum, op| {
                        sum + p.cost.op_ns(&self.model, op, shape).unwrap_or(0.0)
                    })
                };
                let ns = p
                    .cost
                    .stage_cost(&self.model, &stage.ops)
                    .map_or_else(roofline, |measured| measured.ns(shape));
                if ns > worst.0 || ns.is_nan() {
                    worst = (ns, &stage.name);
                }
                total += ns * chunks as f64;
            }
            if total.is_nan() || total > limits::MAX_MODELED_NS {
                return Err(SceneError::CostOverflow {
                    processor: p.name.clone(),
                    seconds: total * 1e-9,
                    stage: worst.1.to_string(),
                    stage_seconds: worst.0 * 1e-9,
                    max_seconds: limits::MAX_MODELED_NS * 1e-9,
                });
            }
        }
        Ok(())
    }

    /// Whether the scene lets some kind of stage run on more than one processor (false
    /// for a scene whose plan cannot be built).
    pub fn has_flexible_placement(&self) -> bool {
        self.placement != PlacementConfig::default()
            && self.plan().is_ok_and(|plan| plan.is_flexible())
    }

    /// The same scene with fixed placement: every kind of stage on the first processor
    /// its `[placement]` rule lists (its home).
    pub fn with_fixed_placement(&self) -> Scene {
        Scene {
            placement: self.placement.homes_only(&self.device),
            ..self.clone()
        }
    }
}

/// Checks a model's shape (a scene's model TOML) against the limits.
fn check_model(model: &ModelConfig) -> Result<(), LimitError> {
    let dims = [
        ("layers", model.layers, limits::MAX_LAYERS),
        ("hidden", model.hidden, limits::MAX_HIDDEN),
        ("heads", model.heads, limits::MAX_HEADS),
        ("kv_heads", model.kv_heads, limits::MAX_HEADS),
        ("head_dim", model.head_dim.unwrap_or(0), limits::MAX_HIDDEN),
        ("ffn", model.ffn, limits::MAX_FFN),
        ("vocab", model.vocab, limits::MAX_VOCAB),
        ("context", model.context, limits::MAX_CONTEXT),
    ];
    for (what, value, max) in dims {
        limits::check(&format!("{} `{what}`", model.name), value.into(), max)?;
    }
    if let Some(ops) = &model.layer_ops {
        limits::check("layer_ops entries", ops.len() as u64, 4096)?;
    }
    Ok(())
}
