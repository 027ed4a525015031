//! Scenes (a device profile, a model description and a workload) and the plans built
//! from them.

use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;

use hetsched_runtime::scene::Scene;
use hetsched_systems::PrefillPlan;
use hetsched_systems::policy::PolicyRegistry;
use parking_lot::Mutex;

use crate::error::{CapiError, guarded, hs_status};
use crate::handles::{self, HandleKind};
use crate::strings::{out_arg, str_arg, string_out};

/// A scene: device profile, model description, workload and policy name. Opaque; create
/// with `hs_scene_load`, `hs_scene_default` or `hs_scene_from_toml`, end with
/// `hs_scene_destroy`.
pub struct hs_scene {
    _opaque: [u8; 0],
}

/// A prefill plan: the scene's subgraph instances, their placement and modeled costs.
/// Opaque; create with `hs_plan_create`, end with `hs_plan_destroy`. A plan is immutable
/// and may be used from several threads at once.
pub struct hs_plan {
    _opaque: [u8; 0],
}

/// What a plan holds, by value (`hs_plan_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hs_plan_info {
    /// Processor lanes of the device: a host registers a queue for each
    /// (`hs_engine_set_queue`, lanes 0 .. processors - 1).
    pub processors: u32,
    /// Chunks the prompt is cut into.
    pub chunks: u32,
    /// Subgraph stages per chunk.
    pub stages: u32,
    /// Subgraph instances (jobs) of a run.
    pub instances: u32,
    /// Job ids run from 0 to `id_space - 1` (not every id is an instance).
    pub id_space: u32,
    /// The modeled lower bound of the makespan, ns (a prediction of the cost model).
    pub lower_bound_ns: u64,
}

pub(crate) struct SceneObject(pub(crate) Mutex<Scene>);

impl HandleKind for SceneObject {
    const KIND: &'static str = "scene";
    type C = hs_scene;
}

/// A plan with what the reports and the engine need of its scene.
pub(crate) struct PlanObject {
    pub(crate) scene_name: String,
    pub(crate) policy: String,
    pub(crate) plan: Arc<PrefillPlan>,
}

impl HandleKind for PlanObject {
    const KIND: &'static str = "plan";
    type C = hs_plan;
}

fn scene_out(scene: Scene, out: &mut *mut hs_scene) -> Result<(), CapiError> {
    *out = handles::register(SceneObject(Mutex::new(scene)));
    Ok(())
}

fn with_scene(
    scene: *const hs_scene,
    change: impl FnOnce(&mut Scene) -> Result<(), CapiError>,
) -> Result<(), CapiError> {
    let object = handles::get::<SceneObject>(scene, "scene")?;
    let mut scene = object.0.lock();
    // Changed on a copy: a failed change leaves the scene as it was.
    let mut changed = scene.clone();
    change(&mut changed)?;
    *scene = changed;
    Ok(())
}

/// Loads a scene file (TOML naming a device profile and a model description beside it),
/// or a scene shipped inside the library by name (`"qwen-1.8b-sd8gen3"`).
///
/// `path` (UTF-8, NUL-terminated) is the caller's and only read. On success `*out` is a
/// new scene the caller ends with `hs_scene_destroy`; on failure `*out` is untouched.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_load(path: *const c_char, out: *mut *mut hs_scene) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let (path, out) = unsafe { (str_arg(path, "path")?, out_arg(out, "out")?) };
        let scene = Scene::load(Path::new(path)).map_err(CapiError::Load)?;
        scene_out(scene, out)
    })
}

/// The default scene shipped inside the library (Qwen1.5-1.8B on a Snapdragon 8 Gen 3,
/// the one `hetsched simulate` runs with no argument). `*out`: a new scene the caller
/// ends with `hs_scene_destroy`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_default(out: *mut *mut hs_scene) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        scene_out(Scene::default_scene(), out)
    })
}

/// A scene from TOML texts held in memory: the scene file's text (its `device` and
/// `model` paths are ignored), the device profile's and the model description's. All
/// three are the caller's and only read. `*out`: a new scene the caller ends with
/// `hs_scene_destroy`.
///
/// # Safety
/// Each string is NULL or NUL-terminated; `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_from_toml(
    scene_toml: *const c_char,
    device_toml: *const c_char,
    model_toml: *const c_char,
    out: *mut *mut hs_scene,
) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let (scene, device, model, out) = unsafe {
            (
                str_arg(scene_toml, "scene_toml")?,
                str_arg(device_toml, "device_toml")?,
                str_arg(model_toml, "model_toml")?,
                out_arg(out, "out")?,
            )
        };
        let scene = Scene::from_texts(scene, device, model).map_err(CapiError::Load)?;
        scene_out(scene, out)
    })
}

/// Replaces a part of the scene with the one in the TOML file `path`, with the scene
/// loader's checks; on failure the scene is unchanged.
fn set_part_from_file(
    scene: *const hs_scene,
    path: *const c_char,
    part: Part,
) -> Result<(), CapiError> {
    // SAFETY: the exported callers' contract: `path` is NULL or NUL-terminated.
    let path = Path::new(unsafe { str_arg(path, "path") }?);
    with_scene(scene, |s| {
        match part {
            Part::Device => s.device = Scene::load_device(path).map_err(CapiError::Load)?,
            Part::Model => s.model = Scene::load_model(path).map_err(CapiError::Load)?,
        }
        Ok(())
    })
}

enum Part {
    Device,
    Model,
}

/// Replaces the scene's device profile with the one in the TOML file `path` (the
/// caller's, only read). On failure the scene is unchanged.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_set_device_file(
    scene: *const hs_scene,
    path: *const c_char,
) -> hs_status {
    guarded(|| set_part_from_file(scene, path, Part::Device))
}

/// Replaces the scene's model description with the one in the TOML file `path` (the
/// caller's, only read). On failure the scene is unchanged.
///
/// # Safety
/// `path` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_set_model_file(
    scene: *const hs_scene,
    path: *const c_char,
) -> hs_status {
    guarded(|| set_part_from_file(scene, path, Part::Model))
}

/// Sets the workload: the prompt's tokens and the chunk length (both > 0; the plan
/// checks them against the model's limits).
#[unsafe(no_mangle)]
pub extern "C" fn hs_scene_set_workload(
    scene: *const hs_scene,
    prompt_len: u32,
    chunk_len: u32,
) -> hs_status {
    guarded(|| {
        if prompt_len == 0 || chunk_len == 0 {
            return Err(CapiError::InvalidArgument(format!(
                "prompt_len ({prompt_len}) and chunk_len ({chunk_len}) must be positive"
            )));
        }
        with_scene(scene, |s| {
            s.workload.prompt_len = prompt_len;
            s.workload.chunk_len = chunk_len;
            Ok(())
        })
    })
}

/// Sets the scene's policy by name (one of `hs_policy_names`); `name` is the caller's,
/// only read. An unknown name is `HS_ERR_UNKNOWN_POLICY` and leaves the scene unchanged.
///
/// # Safety
/// `name` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_set_policy(
    scene: *const hs_scene,
    name: *const c_char,
) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let name = unsafe { str_arg(name, "name") }?;
        PolicyRegistry::builtin().check(name)?;
        with_scene(scene, |s| {
            s.policy = name.to_string();
            Ok(())
        })
    })
}

/// The scene's name. `*out`: a new string the caller frees with `hs_string_free`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_scene_name(scene: *const hs_scene, out: *mut *mut c_char) -> hs_status {
    guarded(|| {
        let object = handles::get::<SceneObject>(scene, "scene")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        *out = string_out(object.0.lock().name.clone());
        Ok(())
    })
}

/// Ends a scene. NULL is a no-op; a handle already destroyed is `HS_ERR_INVALID_HANDLE`.
/// Plans built from it stay valid.
#[unsafe(no_mangle)]
pub extern "C" fn hs_scene_destroy(scene: *mut hs_scene) -> hs_status {
    guarded(|| handles::destroy::<SceneObject>(scene, "scene"))
}

/// The built-in policies' names as a JSON array of strings (`["balance","stall",...]`).
/// `*out`: a new string the caller frees with `hs_string_free`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_policy_names(out: *mut *mut c_char) -> hs_status {
    guarded(|| {
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        let registry = PolicyRegistry::builtin();
        let names: Vec<&str> = registry.names().collect();
        let json = serde_json::to_string(&names)
            .map_err(|e| CapiError::Internal(format!("policy names: {e}")))?;
        *out = string_out(json);
        Ok(())
    })
}

/// Builds the scene's prefill plan (placement, modeled costs, lower bound). `*out`: a new
/// plan the caller ends with `hs_plan_destroy`; it does not depend on the scene handle.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_plan_create(
    scene: *const hs_scene,
    out: *mut *mut hs_plan,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<SceneObject>(scene, "scene")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        let scene = object.0.lock().clone();
        let plan = scene.plan().map_err(CapiError::Plan)?;
        *out = handles::register(PlanObject {
            scene_name: scene.name,
            policy: scene.policy,
            plan: Arc::new(plan),
        });
        Ok(())
    })
}

/// The plan's sizes and modeled lower bound, written to `*out`.
///
/// # Safety
/// `out` is NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn hs_plan_get_info(
    plan: *const hs_plan,
    out: *mut hs_plan_info,
) -> hs_status {
    guarded(|| {
        let object = handles::get::<PlanObject>(plan, "plan")?;
        // SAFETY: the contract above.
        let out = unsafe { out_arg(out, "out") }?;
        let plan = &object.plan;
        *out = hs_plan_info {
            processors: plan.lanes() as u32,
            chunks: plan.chunks,
            stages: plan.stage_count(),
            instances: plan.instance_count() as u32,
            id_space: plan.id_space() as u32,
            lower_bound_ns: plan.lower_bound().ns(),
        };
        Ok(())
    })
}

/// Ends a plan. NULL is a no-op; a handle already destroyed is `HS_ERR_INVALID_HANDLE`.
/// Runs and engines made from it stay valid.
#[unsafe(no_mangle)]
pub extern "C" fn hs_plan_destroy(plan: *mut hs_plan) -> hs_status {
    guarded(|| handles::destroy::<PlanObject>(plan, "plan"))
}
