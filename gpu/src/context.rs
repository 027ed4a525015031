//! Device selection: one Vulkan instance, device, compute queue and the allocators shared by
//! every kernel.

use std::sync::{Arc, Mutex};

use vulkano::{
    Version, VulkanLibrary,
    buffer::Subbuffer,
    command_buffer::{PrimaryAutoCommandBuffer, allocator::StandardCommandBufferAllocator},
    descriptor_set::allocator::StandardDescriptorSetAllocator,
    device::{
        Device, DeviceCreateInfo, DeviceExtensions, DeviceFeatures, Queue, QueueCreateInfo,
        QueueFlags,
        physical::{PhysicalDevice, PhysicalDeviceType},
    },
    instance::{Instance, InstanceCreateInfo},
    memory::allocator::StandardMemoryAllocator,
    sync::{self, GpuFuture, future::FenceSignalFuture},
};

use crate::error::{GpuError, Result, describe, vk};
use crate::pipelines::Pipelines;

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
    /// (head, token) along its keys (`None`: [`DECODE_MIN_KEY_BLOCKS`](crate::DECODE_MIN_KEY_BLOCKS));
    /// a cache of at most this many blocks runs unsplit, in one dispatch with no merge.
    pub decode_min_key_blocks: Option<usize>,
    /// Keep the one-row GEMV's 64-thread shared-memory tree (`gemv1_*_fused.comp`) even
    /// where subgroup arithmetic allows its 128-thread kernel (`gemv1_*_fused_sg.comp`):
    /// for comparing the two.
    pub one_row_gemv_tree: bool,
    /// Keep the output projection a GEMM of its own after attention (a layer of 5
    /// dispatches) even where attention could add it into the residual stream itself
    /// ([`GpuContext::attention_fuses_output`]): the deterministic path (the fused one
    /// sums the heads' products with float atomics, in no fixed order).
    pub unfused_output_projection: bool,
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
}

impl DeviceInfo {
    /// Whether each kernel call can report its GPU time.
    pub fn has_timestamps(&self) -> bool {
        self.timestamp_period_ns.is_some()
    }
}

/// The Vulkan device, its compute queue, allocators and (lazily built) pipelines.
///
/// Safe to share between threads: every call records and submits its own command buffer and
/// waits for it.
pub struct GpuContext {
    pub(crate) device: Arc<Device>,
    pub(crate) queue: Arc<Queue>,
    pub(crate) memory: Arc<StandardMemoryAllocator>,
    pub(crate) descriptors: Arc<StandardDescriptorSetAllocator>,
    pub(crate) commands: Arc<StandardCommandBufferAllocator>,
    pub(crate) pipelines: Pipelines,
    pub(crate) info: DeviceInfo,
    pub(crate) last_gpu_time_ns: Mutex<Option<u64>>,
    /// The last submission while it may still run: every submission waits for it (through
    /// a semaphore), so submissions run in order even when nobody waits for them.
    stream: Mutex<Option<Pending>>,
    /// Partial products of split-K GEMMs, grown on demand. Shared by every GEMM: within a
    /// command buffer vulkano orders its uses, across command buffers the stream does.
    split_k_scratch: Mutex<Option<Subbuffer<[u32]>>>,
    /// Counters and partial outputs of the key-split tensor-core attention (its counters
    /// start at zero and every dispatch leaves them at zero), grown on demand.
    pub(crate) attention_scratch: Mutex<Option<Subbuffer<[u32]>>>,
    /// [`GpuOptions::f32_attention`].
    pub(crate) f32_attention: bool,
    /// [`GpuOptions::attention_min_key_blocks`] (the attention resolves the default).
    pub(crate) attention_min_key_blocks: Option<usize>,
    /// [`GpuOptions::decode_min_key_blocks`] (the attention resolves the default).
    pub(crate) decode_min_key_blocks: Option<usize>,
    /// [`GpuOptions::unfused_output_projection`].
    pub(crate) unfused_output_projection: bool,
    /// The one-row GEMV runs its subgroup kernel: the device has subgroup arithmetic in
    /// compute shaders and [`GpuOptions::one_row_gemv_tree`] is off.
    pub(crate) one_row_gemv_subgroup: bool,
    /// Tiny buffers bound where a fused kernel's mode leaves a binding unused (one each, so
    /// that no buffer is bound twice in one dispatch).
    unused_bindings: std::sync::OnceLock<[Subbuffer<[u32]>; 5]>,
    /// Dispatches recorded on this context (see [`GpuContext::dispatch_count`]).
    pub(crate) dispatches: std::sync::atomic::AtomicU64,
}

/// A submission that was flushed and may still run.
type Pending = FenceSignalFuture<Box<dyn GpuFuture + Send + Sync>>;

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("info", &self.info)
            .finish()
    }
}

impl AsRef<GpuContext> for GpuContext {
    fn as_ref(&self) -> &GpuContext {
        self
    }
}

fn preference(p: &PhysicalDevice) -> DeviceKind {
    DeviceKind::of(p.properties().device_type)
}

impl GpuContext {
    /// Opens the best Vulkan device: a discrete GPU, then integrated, virtual, and last a CPU
    /// implementation (lavapipe). Errors, never panics, when there is no loader or no device.
    pub fn new(options: GpuOptions) -> Result<Self> {
        let library = VulkanLibrary::new().map_err(|e| GpuError::NoDevice(describe(&e)))?;
        let instance = Instance::new(library, InstanceCreateInfo::default())
            .map_err(|e| GpuError::NoDevice(format!("creating the instance: {}", describe(&e))))?;
        let wanted = options
            .device_name_contains
            .as_deref()
            .map(str::to_lowercase);
        let (physical, family) = instance
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
            })?;

        let (extensions, features) = wanted_extensions_and_features(&physical);
        let (device, mut queues) = Device::new(
            physical.clone(),
            DeviceCreateInfo {
                enabled_extensions: extensions,
                enabled_features: features,
                queue_create_infos: vec![QueueCreateInfo {
                    queue_family_index: family,
                    ..Default::default()
                }],
                ..Default::default()
            },
        )
        .map_err(vk("creating the logical device"))?;
        let queue = queues
            .next()
            .ok_or_else(|| GpuError::NoDevice("the device returned no queue".into()))?;

        let info = device_info(&physical, family, &extensions, &features, &options);
        let memory = Arc::new(StandardMemoryAllocator::new_default(device.clone()));
        let descriptors = Arc::new(StandardDescriptorSetAllocator::new(
            device.clone(),
            Default::default(),
        ));
        let commands = Arc::new(StandardCommandBufferAllocator::new(
            device.clone(),
            Default::default(),
        ));
        let one_row_gemv_subgroup = info.subgroup_arithmetic && !options.one_row_gemv_tree;
        Ok(GpuContext {
            pipelines: Pipelines::new(device.clone()),
            device,
            queue,
            memory,
            descriptors,
            commands,
            info,
            last_gpu_time_ns: Mutex::new(None),
            stream: Mutex::new(None),
            split_k_scratch: Mutex::new(None),
            attention_scratch: Mutex::new(None),
            f32_attention: options.f32_attention,
            unfused_output_projection: options.unfused_output_projection,
            attention_min_key_blocks: options.attention_min_key_blocks,
            decode_min_key_blocks: options.decode_min_key_blocks,
            one_row_gemv_subgroup,
            unused_bindings: std::sync::OnceLock::new(),
            dispatches: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Does now what the first calls would otherwise pay for (about 170 ms on an H100):
    /// builds every kernel's pipeline and runs one tiny upload, kernel and read back, so
    /// that the allocators' first memory blocks and the driver's first submission stay out
    /// of measured work.
    pub fn prepare(&self) -> Result<()> {
        self.pipelines.build_all(|s| self.coop_shader_unusable(s))?;
        self.rms_norm(&[1.0; 4], &[1.0; 4], 1e-5, 1, 4).map(drop)
    }

    /// The chosen device and what it offers.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// GPU time of the last kernel call on this context, in nanoseconds, from timestamp
    /// queries around its dispatches (uploads and downloads excluded); `None` when the queue
    /// has no timestamps or nothing ran yet. With several threads sharing the context, this is
    /// whichever call finished last: use the `*_device` calls, which return their own time,
    /// to attribute times exactly.
    pub fn last_gpu_time_ns(&self) -> Option<u64> {
        *self
            .last_gpu_time_ns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Submits `cb` after every earlier submission (a semaphore orders them: Vulkan does
    /// not order separate submissions on its own) and, with `wait`, waits for it.
    pub(crate) fn submit(&self, cb: Arc<PrimaryAutoCommandBuffer>, wait: bool) -> Result<()> {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let previous: Box<dyn GpuFuture + Send + Sync> = match stream.take() {
            Some(mut pending) => {
                pending.cleanup_finished();
                if pending.is_signaled().map_err(vk("polling a fence"))? {
                    sync::now(self.device.clone()).boxed_send_sync()
                } else {
                    pending.then_signal_semaphore().boxed_send_sync()
                }
            }
            None => sync::now(self.device.clone()).boxed_send_sync(),
        };
        let submitted = previous
            .then_execute(self.queue.clone(), cb)
            .map_err(vk("submitting work"))?
            .boxed_send_sync()
            .then_signal_fence_and_flush()
            .map_err(vk("submitting work"))?;
        if wait {
            submitted.wait(None).map_err(vk("waiting for the GPU"))?;
        } else {
            *stream = Some(submitted);
        }
        Ok(())
    }

    /// The split-K scratch buffer, at least `words` long.
    pub(crate) fn split_k_scratch(&self, words: u64) -> Result<Subbuffer<[u32]>> {
        let mut scratch = self
            .split_k_scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &*scratch {
            Some(buf) if buf.len() >= words => Ok(buf.clone()),
            _ => {
                // Grown in powers of two; a replaced buffer lives on in the command buffers
                // that still use it.
                let limit = self.info.max_storage_buffer_range / 4;
                let buf = self.alloc_words(
                    words.next_power_of_two().min(limit).max(words),
                    "split-K scratch",
                )?;
                *scratch = Some(buf.clone());
                Ok(buf)
            }
        }
    }

    /// Five distinct one-word buffers for bindings a kernel's mode does not touch.
    pub(crate) fn unused_bindings(&self) -> Result<[Subbuffer<[u32]>; 5]> {
        if let Some(bufs) = self.unused_bindings.get() {
            return Ok(bufs.clone());
        }
        let one = || self.alloc_words(4, "an unused binding");
        let bufs = [one()?, one()?, one()?, one()?, one()?];
        Ok(self.unused_bindings.get_or_init(|| bufs).clone())
    }

    /// Compute dispatches recorded on this context so far (every kernel of every call and
    /// batch): how many launches a piece of work costs, read before and after it.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for every submission so far (a no-op when none is pending).
    pub fn wait_idle(&self) -> Result<()> {
        let pending = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(pending) = pending {
            pending.wait(None).map_err(vk("waiting for the GPU"))?;
        }
        Ok(())
    }

    pub(crate) fn set_last_gpu_time(&self, ns: Option<u64>) {
        *self
            .last_gpu_time_ns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = ns;
    }
}

/// Extensions and features the kernels can use, each enabled only where offered.
fn wanted_extensions_and_features(p: &PhysicalDevice) -> (DeviceExtensions, DeviceFeatures) {
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
        ..DeviceFeatures::empty()
    };
    (extensions, features)
}

fn device_info(
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
    }
}
