//! Choosing the Vulkan device (the preferred kind with a compute queue, optionally by
//! name), the extensions and features the kernels enable on it, and the [`DeviceInfo`]
//! they read back.

use std::sync::Arc;

use vulkano::{
    Version,
    device::{
        DeviceExtensions, DeviceFeatures, QueueFlags,
        physical::{PhysicalDevice, PhysicalDeviceType},
    },
    instance::Instance,
};

use crate::error::{GpuError, Result, describe};

/// What kind of processor the Vulkan device is, in order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    /// A discrete GPU (first choice).
    DiscreteGpu,
    /// A GPU sharing memory with the CPU.
    IntegratedGpu,
    /// A GPU in a virtual machine.
    VirtualGpu,
    /// A CPU implementation such as Mesa's lavapipe (last choice; what CI runs on).
    Cpu,
    /// Anything else the driver reports.
    Other,
}

impl DeviceKind {
    fn of(t: PhysicalDeviceType) -> Self {
        match t {
            PhysicalDeviceType::DiscreteGpu => DeviceKind::DiscreteGpu,
            PhysicalDeviceType::IntegratedGpu => DeviceKind::IntegratedGpu,
            PhysicalDeviceType::VirtualGpu => DeviceKind::VirtualGpu,
            PhysicalDeviceType::Cpu => DeviceKind::Cpu,
            _ => DeviceKind::Other,
        }
    }
}

/// How to pick and set up the device.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Only consider devices whose name contains this text (case-insensitive).
    pub device_name_contains: Option<String>,
    /// Refuse CPU implementations (lavapipe): for callers that only want real GPU speed.
    pub reject_cpu_devices: bool,
    /// Pretend `maxStorageBufferRange` is at most this many bytes. Tests use it to exercise
    /// the splitting of large operations without allocating 128 MiB buffers.
    pub max_buffer_bytes: Option<u64>,
    /// Keep attention in f32 (`attention_flash.comp`) even where the tensor-core kernel
    /// (`attention_flash_khr.comp`, f16 inputs, f32 accumulation) could run: the reference
    /// path, exact to 1e-5.
    pub f32_attention: bool,
    /// Fewest 64-key blocks per key range of the tensor-core attention's split (`None`:
    /// 8, the best of 16, 8 and 4 on an H100); a tuning knob for long contexts, where fewer
    /// blocks per range give a chunk's 72 query blocks more workgroups.
    pub attention_min_key_blocks: Option<usize>,
    /// Fewest 64-key blocks each workgroup of the decode attention walks when it splits a
    /// (head, token) along its keys (`None`: [`DECODE_MIN_KEY_BLOCKS`]);
    /// a cache of at most this many blocks runs unsplit, in one dispatch with no merge.
    ///
    /// [`DECODE_MIN_KEY_BLOCKS`]: crate::DECODE_MIN_KEY_BLOCKS
    pub decode_min_key_blocks: Option<usize>,
    /// Keep the one-row GEMV's 64-thread shared-memory tree (`gemv1_*_fused.comp`) even
    /// where subgroup arithmetic allows its 128-thread kernel (`gemv1_*_fused_sg.comp`):
    /// for comparing the two.
    pub one_row_gemv_tree: bool,
    /// Keep the output projection a GEMM of its own after attention (a layer of 5
    /// dispatches) even where attention could add it into the residual stream itself
    /// ([`GpuContext::attention_fuses_output`]), and a stage of its own in the
    /// one-dispatch decode layers ([`crate::GpuBatch::decode_layers`]): the deterministic
    /// path (the fused one sums the heads' products with float atomics, in no fixed
    /// order).
    ///
    /// [`GpuContext::attention_fuses_output`]: crate::GpuContext::attention_fuses_output
    pub unfused_output_projection: bool,
    /// Record a decode step's llama layers as five dispatches each even where the device
    /// runs them as one ([`GpuContext::decode_layer_workgroups`]): for comparing the two.
    ///
    /// [`GpuContext::decode_layer_workgroups`]: crate::GpuContext::decode_layer_workgroups
    pub five_dispatch_decode: bool,
    /// Workgroups per multiprocessor of the one-dispatch decode layer's grid, steps of
    /// one row and of several alike (`None`: [`DECODE_LAYER_GROUPS_PER_SM`]). More than
    /// the device keeps resident at once makes every step fail (see
    /// [`crate::GpuBatch::decode_layers`]).
    ///
    /// [`DECODE_LAYER_GROUPS_PER_SM`]: crate::DECODE_LAYER_GROUPS_PER_SM
    pub decode_layer_groups_per_sm: Option<u32>,
    /// Most keys at which a decode step of one sequence in the one-dispatch layers runs
    /// attention and o as one stage (`None`: [`ATTENTION_WITH_O_MAX_KEYS`]; 0 never, as
    /// [`GpuOptions::unfused_output_projection`] does at every length).
    ///
    /// [`ATTENTION_WITH_O_MAX_KEYS`]: crate::ATTENTION_WITH_O_MAX_KEYS
    pub decode_attention_with_o_max_keys: Option<usize>,
    /// The one-dispatch decode layers prefetch a later stage's weights: each stage starts
    /// the loads of the next product's weight rows into the cache. Off by default: on an
    /// H100 it slowed the whole step in one dispatch from 815 to 768 tokens/s (tg128).
    pub decode_layer_prefetch: bool,
    /// At most this many layers in one dispatch of the one-dispatch decode layers (`None`:
    /// [`crate::DECODE_LAYERS_PER_DISPATCH`]; at most 64, the kernel's descriptor arrays).
    pub decode_layers_per_dispatch: Option<usize>,
}

/// What the chosen device offers that the kernels rely on.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// The driver's device name, e.g. "NVIDIA H100 80GB HBM3" or "llvmpipe (LLVM 15...)".
    pub name: String,
    /// Discrete, integrated, virtual, CPU.
    pub kind: DeviceKind,
    /// Driver name and version text, when the driver reports them.
    pub driver: String,
    /// Vulkan API version of the device, "major.minor.patch".
    pub api_version: String,
    /// Bytes one storage buffer binding may span (`maxStorageBufferRange`, possibly lowered by
    /// [`GpuOptions::max_buffer_bytes`]). Larger operands are split or refused.
    pub max_storage_buffer_range: u64,
    /// Alignment of a storage buffer binding's offset
    /// (`minStorageBufferOffsetAlignment`): where a matrix may start inside a
    /// [`crate::GpuArena`].
    pub storage_offset_alignment: u64,
    /// Shared memory per workgroup (`maxComputeSharedMemorySize`).
    pub max_shared_memory: u32,
    /// `maxComputeWorkGroupCount`.
    pub max_workgroup_count: [u32; 3],
    /// Subgroup (warp) size, when reported.
    pub subgroup_size: Option<u32>,
    /// Compute shaders may shuffle between a subgroup's lanes (`subgroupShuffleXor`, used by
    /// the tensor-core attention's softmax).
    pub subgroup_shuffle: bool,
    /// Compute shaders may reduce across a subgroup (`subgroupAdd`, used by the one-row
    /// GEMV).
    pub subgroup_arithmetic: bool,
    /// Nanoseconds per timestamp tick, when the compute queue supports timestamps.
    pub timestamp_period_ns: Option<f32>,
    /// `shaderInt8` (8-bit arithmetic in shaders).
    pub shader_int8: bool,
    /// `storageBuffer8BitAccess` (i8 storage buffers). The INT8 kernels pack four i8 in a
    /// 32-bit word either way, so they run without it.
    pub storage_8bit: bool,
    /// `shaderFloat16`.
    pub shader_f16: bool,
    /// `shaderFloat64`: quantization uses it for exact rounding at ties (see quantize.comp).
    pub shader_f64: bool,
    /// `storageBuffer16BitAccess`.
    pub storage_16bit: bool,
    /// `VK_KHR_cooperative_matrix` is offered.
    pub coop_matrix_khr: bool,
    /// The `[m, n, k]` shapes of f16 x f16 + f32 subgroup matrices `VK_KHR_cooperative_matrix`
    /// offers (the KHR f16 GEMM needs `[16, 16, 16]`); empty without the extension or its
    /// `cooperativeMatrix` feature.
    pub coop_matrix_khr_f16_shapes: Vec<[u32; 3]>,
    /// `VK_NV_cooperative_matrix` is offered and enabled (what the NV f16 GEMM uses; it
    /// builds with Debian's glslc, which knows only `GL_NV_cooperative_matrix`).
    pub coop_matrix_nv: bool,
    /// `shaderBufferFloat32AtomicAdd` (`VK_EXT_shader_atomic_float`) is enabled: what
    /// attention with the output projection folded in needs.
    pub float_atomic_add: bool,
    /// Streaming multiprocessors, where the driver reports them
    /// (`VK_NV_shader_sm_builtins`): what sizes the one-dispatch decode layer's grid.
    pub multiprocessors: Option<u32>,
    /// Shaders may index arrays of storage buffers with a dynamically uniform index
    /// (`shaderStorageBufferArrayDynamicIndexing`, enabled where offered).
    pub storage_buffer_array_indexing: bool,
    /// Storage buffers one shader stage may bind (`maxPerStageDescriptorStorageBuffers`).
    pub max_stage_storage_buffers: u32,
}

impl DeviceInfo {
    /// Whether each kernel call can report its GPU time.
    pub fn has_timestamps(&self) -> bool {
        self.timestamp_period_ns.is_some()
    }
}

fn preference(p: &PhysicalDevice) -> DeviceKind {
    DeviceKind::of(p.properties().device_type)
}

/// Extensions and features the kernels can use, each enabled only where offered.
pub(super) fn wanted_extensions_and_features(
    p: &PhysicalDevice,
) -> (DeviceExtensions, DeviceFeatures) {
    let offered = p.supported_extensions();
    let extensions = DeviceExtensions {
        nv_cooperative_matrix: offered.nv_cooperative_matrix,
        // Only when this build has a KHR kernel to run (see build.rs).
        khr_cooperative_matrix: offered.khr_cooperative_matrix && crate::CoopKernel::Khr.built(),
        ext_shader_atomic_float: offered.ext_shader_atomic_float,
        ..DeviceExtensions::empty()
    };
    let have = p.supported_features();
    // The 8/16-bit features are core from Vulkan 1.2; older devices simply go without them.
    let core12 = p.api_version() >= Version::V1_2;
    let features = DeviceFeatures {
        shader_int8: core12 && have.shader_int8,
        storage_buffer8_bit_access: core12 && have.storage_buffer8_bit_access,
        shader_float16: core12 && have.shader_float16,
        shader_float64: have.shader_float64,
        storage_buffer16_bit_access: core12 && have.storage_buffer16_bit_access,
        // One feature bit for both extensions: vulkano chains it in the KHR structure when
        // that extension is enabled, and none in the NV one; NVIDIA's driver (580, H100)
        // runs the NV kernel so all the same.
        cooperative_matrix: (extensions.nv_cooperative_matrix || extensions.khr_cooperative_matrix)
            && have.cooperative_matrix,
        // GL_KHR_memory_scope_semantics (needed by the cooperative-matrix shader) makes
        // glslang declare the Vulkan memory model.
        vulkan_memory_model: core12 && have.vulkan_memory_model,
        // With the memory model on, device-scope atomics (absmax.comp) need this as well.
        vulkan_memory_model_device_scope: core12
            && have.vulkan_memory_model
            && have.vulkan_memory_model_device_scope,
        // Attention's fused output projection adds into the residual stream with it.
        shader_buffer_float32_atomic_add: extensions.ext_shader_atomic_float
            && have.shader_buffer_float32_atomic_add,
        // The one-dispatch decode step indexes its layers' weights in descriptor arrays.
        shader_storage_buffer_array_dynamic_indexing: have
            .shader_storage_buffer_array_dynamic_indexing,
        ..DeviceFeatures::empty()
    };
    (extensions, features)
}

pub(super) fn device_info(
    p: &PhysicalDevice,
    family: u32,
    extensions: &DeviceExtensions,
    features: &DeviceFeatures,
    options: &GpuOptions,
) -> DeviceInfo {
    let props = p.properties();
    let timestamps = p.queue_family_properties()[family as usize]
        .timestamp_valid_bits
        .is_some_and(|bits| bits > 0);
    let mut range = u64::from(props.max_storage_buffer_range);
    if let Some(cap) = options.max_buffer_bytes {
        range = range.min(cap);
    }
    let v = p.api_version();
    DeviceInfo {
        name: props.device_name.clone(),
        kind: DeviceKind::of(props.device_type),
        driver: [props.driver_name.clone(), props.driver_info.clone()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" "),
        api_version: format!("{}.{}.{}", v.major, v.minor, v.patch),
        max_storage_buffer_range: range,
        storage_offset_alignment: props.min_storage_buffer_offset_alignment.as_devicesize(),
        max_shared_memory: props.max_compute_shared_memory_size,
        max_workgroup_count: props.max_compute_work_group_count,
        subgroup_size: props.subgroup_size,
        subgroup_shuffle: props
            .subgroup_supported_operations
            .is_some_and(|ops| ops.contains(vulkano::device::physical::SubgroupFeatures::SHUFFLE))
            && props
                .subgroup_supported_stages
                .is_some_and(|st| st.contains(vulkano::shader::ShaderStages::COMPUTE)),
        subgroup_arithmetic: props.subgroup_supported_operations.is_some_and(|ops| {
            ops.contains(vulkano::device::physical::SubgroupFeatures::ARITHMETIC)
        }) && props
            .subgroup_supported_stages
            .is_some_and(|st| st.contains(vulkano::shader::ShaderStages::COMPUTE)),
        timestamp_period_ns: timestamps.then_some(props.timestamp_period),
        shader_int8: features.shader_int8,
        storage_8bit: features.storage_buffer8_bit_access,
        shader_f16: features.shader_float16,
        shader_f64: features.shader_float64,
        storage_16bit: features.storage_buffer16_bit_access,
        coop_matrix_khr: p.supported_extensions().khr_cooperative_matrix,
        coop_matrix_khr_f16_shapes: if p.supported_features().cooperative_matrix {
            crate::coopmat::khr_f16_shapes(p)
        } else {
            Vec::new()
        },
        coop_matrix_nv: extensions.nv_cooperative_matrix && features.cooperative_matrix,
        float_atomic_add: features.shader_buffer_float32_atomic_add,
        multiprocessors: props.shader_sm_count.filter(|&n| n > 0),
        storage_buffer_array_indexing: features.shader_storage_buffer_array_dynamic_indexing,
        max_stage_storage_buffers: props.max_per_stage_descriptor_storage_buffers,
    }
}

/// The preferred physical device with a compute queue (among those whose name contains
/// `options.device_name_contains`, CPU implementations left out when asked), and the index
/// of that queue's family.
pub(super) fn choose_physical_device(
    instance: &Arc<Instance>,
    options: &GpuOptions,
) -> Result<(Arc<PhysicalDevice>, u32)> {
    let wanted = options
        .device_name_contains
        .as_deref()
        .map(str::to_lowercase);
    instance
        .enumerate_physical_devices()
        .map_err(|e| GpuError::NoDevice(format!("enumerating devices: {}", describe(&e))))?
        .filter(|p| {
            wanted
                .as_deref()
                .is_none_or(|w| p.properties().device_name.to_lowercase().contains(w))
        })
        .filter(|p| !(options.reject_cpu_devices && preference(p) == DeviceKind::Cpu))
        .filter_map(|p| {
            let family = p
                .queue_family_properties()
                .iter()
                .position(|q| q.queue_flags.intersects(QueueFlags::COMPUTE))?;
            Some((p, family as u32))
        })
        .min_by_key(|(p, _)| preference(p))
        .ok_or_else(|| {
            GpuError::NoDevice(match &options.device_name_contains {
                Some(w) => format!("no device with a compute queue whose name contains {w:?}"),
                None => "no physical device with a compute queue".into(),
            })
        })
}
