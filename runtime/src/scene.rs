//! Scenes: a device profile, a model and a workload, read from TOML.
//!
//! A scene file names its device and model files by paths relative to itself, so several
//! scenes share them. Unknown keys are rejected. The scenes shipped in `scenes/` are also
//! embedded in the binary, so `hetsched simulate` runs without any file.

use std::path::Path;

use hetsched_systems::memory::MemoryConfig;
use hetsched_systems::policy::UnknownPolicy;
use hetsched_systems::{
    DEFAULT_POLICY, DeviceProfile, ModelConfig, PlacementConfig, PlanError, Policy, PolicyRegistry,
    PrefillPlan, Workload,
};
use serde::Deserialize;
use thiserror::Error;

use hetsched_limits::LimitError;

mod check;
mod source;

use check::check_model;
pub use source::shipped_scenes;
use source::{Source, parse};

/// The scene `hetsched simulate` runs when none is given.
pub const DEFAULT_SCENE: &str = "qwen1.5-1.8b-xiaomi14";

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

/// `value` (a device profile, a model) as the TOML text the scene loader reads back.
pub fn toml_text<T: serde::Serialize>(value: &T) -> Result<String, String> {
    toml::to_string(value).map_err(|e| e.to_string())
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
