//! The GPU context: one Vulkan instance, device, compute queue and the allocators shared by
//! every kernel, and the submission of recorded work. Which device is chosen, and what it
//! offers, is `device.rs`.

use std::sync::{Arc, Mutex};

use vulkano::{
    VulkanLibrary,
    buffer::Subbuffer,
    command_buffer::{PrimaryAutoCommandBuffer, allocator::StandardCommandBufferAllocator},
    descriptor_set::allocator::StandardDescriptorSetAllocator,
    device::{Device, DeviceCreateInfo, Queue, QueueCreateInfo},
    instance::{Instance, InstanceCreateInfo},
    memory::allocator::StandardMemoryAllocator,
    sync::{self, GpuFuture, future::FenceSignalFuture},
};

use crate::error::{GpuError, Result, describe, vk};
use crate::pipelines::Pipelines;

mod device;

pub use device::{DeviceInfo, DeviceKind, GpuOptions};
use device::{choose_physical_device, device_info, wanted_extensions_and_features};

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
    /// [`GpuOptions::five_dispatch_decode`].
    pub(crate) five_dispatch_decode: bool,
    /// [`GpuOptions::decode_layer_groups_per_sm`].
    pub(crate) decode_layer_groups_per_sm: Option<u32>,
    /// [`GpuOptions::decode_attention_with_o_max_keys`].
    pub(crate) decode_attention_with_o_max_keys: Option<usize>,
    /// [`GpuOptions::decode_layer_prefetch`].
    pub(crate) decode_layer_prefetch: bool,
    /// [`GpuOptions::decode_layers_per_dispatch`].
    pub(crate) decode_layers_per_dispatch: Option<usize>,
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

impl GpuContext {
    /// Opens the best Vulkan device: a discrete GPU, then integrated, virtual, and last a CPU
    /// implementation (lavapipe). Errors, never panics, when there is no loader or no device.
    pub fn new(options: GpuOptions) -> Result<Self> {
        let library = VulkanLibrary::new().map_err(|e| GpuError::NoDevice(describe(&e)))?;
        let instance = Instance::new(library, InstanceCreateInfo::default())
            .map_err(|e| GpuError::NoDevice(format!("creating the instance: {}", describe(&e))))?;
        let (physical, family) = choose_physical_device(&instance, &options)?;

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
            five_dispatch_decode: options.five_dispatch_decode,
            decode_layer_groups_per_sm: options.decode_layer_groups_per_sm,
            decode_attention_with_o_max_keys: options.decode_attention_with_o_max_keys,
            decode_layer_prefetch: options.decode_layer_prefetch,
            decode_layers_per_dispatch: options.decode_layers_per_dispatch,
            unused_bindings: std::sync::OnceLock::new(),
            dispatches: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Does now what the first calls would otherwise pay for (about 170 ms on an H100):
    /// builds every kernel's pipeline and runs one tiny upload, kernel and read back, so
    /// that the allocators' first memory blocks and the driver's first submission stay out
    /// of measured work.
    pub fn prepare(&self) -> Result<()> {
        self.pipelines.build_all(|s| self.shader_unusable(s))?;
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
