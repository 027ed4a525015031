//! Recording and submitting one command buffer: uploads, dispatches with timestamps around
//! them, downloads; then wait on a fence and read the results back.

// `dispatch`, `write_timestamp` and `reset_query_pool` are `unsafe` in vulkano 0.35: it does
// not check that a shader stays inside its buffers, nor query-state rules. Each call below
// says why it holds.
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::Arc;

use vulkano::{
    buffer::{Buffer, BufferCreateInfo, BufferUsage, Subbuffer},
    command_buffer::{
        AutoCommandBufferBuilder, CommandBufferUsage, CopyBufferInfo, PrimaryAutoCommandBuffer,
    },
    descriptor_set::{DescriptorSet, WriteDescriptorSet},
    memory::allocator::{AllocationCreateInfo, MemoryTypeFilter},
    pipeline::{Pipeline, PipelineBindPoint},
    query::{QueryPool, QueryPoolCreateInfo, QueryResultFlags, QueryType},
    sync::PipelineStage,
};

use crate::context::GpuContext;
use crate::error::{GpuError, Result, vk};
use crate::pipelines::{PUSH_WORDS, Shader};

/// One command buffer being recorded, on the context `C` refers to (a borrow for a call's
/// own job, an `Arc` for a batch kept open across calls).
pub(crate) struct Job<C: AsRef<GpuContext>> {
    ctx: C,
    builder: AutoCommandBufferBuilder<PrimaryAutoCommandBuffer>,
    timer: Option<Arc<QueryPool>>,
    dispatched: bool,
    /// Dispatches recorded.
    dispatches: usize,
    downloads: Vec<Subbuffer<[u32]>>,
    /// Whether the command buffer is submitted again and again ([`Job::replayable`]).
    replayed: bool,
}

/// One storage buffer of a [`GpuContext::run_simple`] call, bound in order from binding 0.
pub(crate) enum Bind<'a> {
    /// Uploaded from the host.
    Upload(&'a [u32]),
    /// Allocated, `words` long, contents undefined (the kernel writes every word).
    Output(u64),
}

/// Workgroups for a grid-stride loop over `items` with 256-thread groups.
pub(crate) fn stride_groups(items: usize) -> [u32; 3] {
    [items.div_ceil(256).clamp(1, 65_535) as u32, 1, 1]
}

/// What a finished job gives back.
pub(crate) struct Finished {
    /// One word vector per [`Job::download`], in call order.
    pub(crate) downloads: Vec<Vec<u32>>,
    /// GPU time from the first dispatch to the end of the last, when timestamps exist.
    pub(crate) gpu_ns: Option<u64>,
}

impl GpuContext {
    /// A device-local buffer of `words` 32-bit words, checked against the storage-buffer limit.
    pub(crate) fn alloc_words(&self, words: u64, what: &str) -> Result<Subbuffer<[u32]>> {
        let bytes = words * 4;
        let limit = self.info.max_storage_buffer_range;
        if bytes > limit {
            return Err(GpuError::BufferTooLarge {
                what: what.to_string(),
                bytes,
                limit,
            });
        }
        // Vulkan has no empty buffers; an empty operand still gets one word.
        Buffer::new_slice::<u32>(
            self.memory.clone(),
            BufferCreateInfo {
                usage: BufferUsage::STORAGE_BUFFER
                    | BufferUsage::TRANSFER_SRC
                    | BufferUsage::TRANSFER_DST,
                ..Default::default()
            },
            AllocationCreateInfo {
                memory_type_filter: MemoryTypeFilter::PREFER_DEVICE,
                ..Default::default()
            },
            words.max(1),
        )
        .map_err(vk("allocating a device buffer"))
    }

    fn host_buffer(&self, words: u64, filter: MemoryTypeFilter) -> Result<Subbuffer<[u32]>> {
        Buffer::new_slice::<u32>(
            self.memory.clone(),
            BufferCreateInfo {
                usage: BufferUsage::TRANSFER_SRC | BufferUsage::TRANSFER_DST,
                ..Default::default()
            },
            AllocationCreateInfo {
                memory_type_filter: filter,
                ..Default::default()
            },
            words.max(1),
        )
        .map_err(vk("allocating a staging buffer"))
    }
}

/// A command buffer recorded once and submitted again and again.
pub(crate) struct Replay {
    cb: Arc<PrimaryAutoCommandBuffer>,
}

impl Replay {
    /// Submits the command buffer on `ctx` (after every earlier submission); with `wait`,
    /// waits for it.
    pub(crate) fn submit(&self, ctx: &GpuContext, wait: bool) -> Result<()> {
        ctx.submit(self.cb.clone(), wait)
    }
}

impl GpuContext {
    /// Uploads `binds`, runs one dispatch, reads back the buffers at `read` (indices into
    /// `binds`), in that order.
    pub(crate) fn run_simple(
        &self,
        shader: Shader,
        binds: &[Bind<'_>],
        read: &[usize],
        push: [u32; PUSH_WORDS],
        groups: [u32; 3],
    ) -> Result<Vec<Vec<u32>>> {
        let mut job = Job::new(self)?;
        let mut bufs = Vec::with_capacity(binds.len());
        for (i, b) in binds.iter().enumerate() {
            bufs.push(match b {
                Bind::Upload(words) => job.upload(words, &format!("input {i} of {shader:?}"))?,
                Bind::Output(words) => {
                    self.alloc_words(*words, &format!("output {i} of {shader:?}"))?
                }
            });
        }
        let refs: Vec<&Subbuffer<[u32]>> = bufs.iter().collect();
        job.dispatch(shader, &refs, push, groups)?;
        for &i in read {
            job.download(&bufs[i]);
        }
        Ok(job.finish()?.downloads)
    }
}

/// Calls `f(start, end)` over row ranges whose buffers stay within the storage-buffer limit,
/// given the bytes one row needs in its largest buffer; sums the GPU times into the context's
/// last time.
pub(crate) fn for_row_chunks(
    ctx: &GpuContext,
    op: &'static str,
    rows: usize,
    row_bytes: usize,
    mut f: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    let limit = ctx.info.max_storage_buffer_range as usize;
    let per = limit / row_bytes.max(1);
    if per == 0 {
        return Err(GpuError::BufferTooLarge {
            what: format!("one row of {op}"),
            bytes: row_bytes as u64,
            limit: limit as u64,
        });
    }
    let mut total: Option<u64> = Some(0);
    let mut start = 0;
    while start < rows {
        let end = (start + per).min(rows);
        f(start, end)?;
        total = total.zip(ctx.last_gpu_time_ns()).map(|(t, g)| t + g);
        start = end;
    }
    ctx.set_last_gpu_time(total);
    Ok(())
}

impl<C: AsRef<GpuContext>> Job<C> {
    pub(crate) fn new(ctx: C) -> Result<Self> {
        Self::with_timer(ctx, true)
    }

    /// The context the job records for.
    pub(crate) fn ctx(&self) -> &GpuContext {
        self.ctx.as_ref()
    }

    /// How the job holds its context.
    pub(crate) fn handle(&self) -> &C {
        &self.ctx
    }

    /// Dispatches recorded so far.
    pub(crate) fn dispatches(&self) -> usize {
        self.dispatches
    }

    /// A job that records no timestamps (when `timed` is false or the queue has none).
    pub(crate) fn with_timer(handle: C, timed: bool) -> Result<Self> {
        Self::with_usage(handle, timed, CommandBufferUsage::OneTimeSubmit)
    }

    /// An untimed job whose command buffer can be submitted again and again
    /// ([`Job::into_replay`]).
    pub(crate) fn replayable(handle: C) -> Result<Self> {
        Self::with_usage(handle, false, CommandBufferUsage::MultipleSubmit)
    }

    fn with_usage(handle: C, timed: bool, usage: CommandBufferUsage) -> Result<Self> {
        let ctx = handle.as_ref();
        let mut builder = AutoCommandBufferBuilder::primary(
            ctx.commands.clone(),
            ctx.queue.queue_family_index(),
            usage,
        )
        .map_err(vk("starting a command buffer"))?;
        let timer = match ctx.info.timestamp_period_ns {
            Some(_) if timed => {
                let pool = QueryPool::new(
                    ctx.device.clone(),
                    QueryPoolCreateInfo {
                        query_count: 2,
                        ..QueryPoolCreateInfo::query_type(QueryType::Timestamp)
                    },
                )
                .map_err(vk("creating a timestamp query pool"))?;
                // SAFETY: the pool is new and used only by this command buffer.
                unsafe { builder.reset_query_pool(pool.clone(), 0..2) }
                    .map_err(vk("resetting timestamps"))?;
                Some(pool)
            }
            _ => None,
        };
        Ok(Job {
            ctx: handle,
            builder,
            timer,
            dispatched: false,
            dispatches: 0,
            downloads: Vec::new(),
            replayed: usage == CommandBufferUsage::MultipleSubmit,
        })
    }

    /// A new device buffer holding `words`, copied from a staging buffer. Record uploads
    /// before the first dispatch so that the GPU time excludes them.
    pub(crate) fn upload(&mut self, words: &[u32], what: &str) -> Result<Subbuffer<[u32]>> {
        let dst = self.ctx().alloc_words(words.len() as u64, what)?;
        self.upload_into(words, dst.clone())?;
        Ok(dst)
    }

    /// Copies `words` into the existing device buffer `dst` (same length) through a staging
    /// buffer.
    pub(crate) fn upload_into(&mut self, words: &[u32], dst: Subbuffer<[u32]>) -> Result<()> {
        if words.is_empty() {
            return Ok(());
        }
        let staging = self.ctx().host_buffer(
            words.len() as u64,
            MemoryTypeFilter::PREFER_HOST | MemoryTypeFilter::HOST_SEQUENTIAL_WRITE,
        )?;
        staging
            .write()
            .map_err(vk("writing a staging buffer"))?
            .copy_from_slice(words);
        self.copy(staging, dst)
    }

    /// Records a device-side copy of `src` into `dst` (same length).
    pub(crate) fn copy(&mut self, src: Subbuffer<[u32]>, dst: Subbuffer<[u32]>) -> Result<()> {
        self.builder
            .copy_buffer(CopyBufferInfo::buffers(src, dst))
            .map_err(vk("recording a copy"))?;
        Ok(())
    }

    /// Resets `queries` of `pool` (before any is written).
    pub(crate) fn reset_queries(
        &mut self,
        pool: &Arc<QueryPool>,
        queries: Range<u32>,
    ) -> Result<()> {
        // SAFETY: the pool is used by no pending command buffer: it was just created.
        unsafe { self.builder.reset_query_pool(pool.clone(), queries) }
            .map_err(vk("resetting timestamps"))?;
        Ok(())
    }

    /// Writes timestamp `query` of `pool` when every earlier command has finished.
    pub(crate) fn write_timestamp(&mut self, pool: &Arc<QueryPool>, query: u32) -> Result<()> {
        // SAFETY: the query was reset when its pool was made (`GpuContext::timer`), and the
        // caller writes each query once.
        unsafe {
            self.builder
                .write_timestamp(pool.clone(), query, PipelineStage::BottomOfPipe)
        }
        .map_err(vk("recording a timestamp"))?;
        Ok(())
    }

    /// Zero-fills `buf` once, before anything this job records runs (device memory starts
    /// undefined): inside a one-shot job, or in a submission of its own before a
    /// replayable job is recorded further, so that its replays do not fill it again.
    pub(crate) fn zero_once(&mut self, buf: &Subbuffer<[u32]>) -> Result<()> {
        if !self.replayed {
            return self.fill_zero(buf);
        }
        let mut zero = Job::new(self.ctx())?;
        zero.fill_zero(buf)?;
        zero.finish().map(drop)
    }

    /// Zero-fills `buf` (device memory starts undefined).
    pub(crate) fn fill_zero(&mut self, buf: &Subbuffer<[u32]>) -> Result<()> {
        self.builder
            .fill_buffer(buf.clone(), 0)
            .map_err(vk("recording a fill"))?;
        Ok(())
    }

    /// Records one dispatch of `shader` with `buffers` at bindings 0.. and `push` constants.
    pub(crate) fn dispatch(
        &mut self,
        shader: Shader,
        buffers: &[&Subbuffer<[u32]>],
        push: [u32; PUSH_WORDS],
        groups: [u32; 3],
    ) -> Result<()> {
        let writes = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| WriteDescriptorSet::buffer(i as u32, (*b).clone()));
        self.dispatch_with(shader, writes, push, groups)
    }

    /// [`Job::dispatch`] where binding `i` is the array `bindings[i]` (one element for a
    /// plain buffer; as many as the shader declares for an array).
    pub(crate) fn dispatch_arrays(
        &mut self,
        shader: Shader,
        bindings: &[&[&Subbuffer<[u32]>]],
        push: [u32; PUSH_WORDS],
        groups: [u32; 3],
    ) -> Result<()> {
        let writes = bindings.iter().enumerate().map(|(i, array)| {
            WriteDescriptorSet::buffer_array(i as u32, 0, array.iter().map(|&b| b.clone()))
        });
        self.dispatch_with(shader, writes, push, groups)
    }

    /// One dispatch of `shader` with the descriptor set `writes` make.
    fn dispatch_with(
        &mut self,
        shader: Shader,
        writes: impl IntoIterator<Item = WriteDescriptorSet>,
        push: [u32; PUSH_WORDS],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.ctx().info.max_workgroup_count;
        if groups.iter().zip(max).any(|(&g, m)| g > m) {
            return Err(GpuError::Shape {
                op: "dispatch",
                problem: format!(
                    "{groups:?} workgroups exceed the device's maxComputeWorkGroupCount {max:?}"
                ),
            });
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.ctx().pipelines.get(shader)?;
        let layout = pipeline.layout().clone();
        let set_layout = layout.set_layouts()[0].clone();
        let set = DescriptorSet::new(self.ctx().descriptors.clone(), set_layout, writes, [])
            .map_err(vk("writing a descriptor set"))?;
        if !self.dispatched {
            self.dispatched = true;
            if let Some(pool) = &self.timer {
                // SAFETY: query 0 was reset at the start of this command buffer and is written
                // once. Bottom-of-pipe: written once every earlier command (the uploads) is done.
                unsafe {
                    self.builder
                        .write_timestamp(pool.clone(), 0, PipelineStage::BottomOfPipe)
                }
                .map_err(vk("recording a timestamp"))?;
            }
        }
        self.builder
            .bind_pipeline_compute(pipeline)
            .map_err(vk("binding a pipeline"))?
            .bind_descriptor_sets(PipelineBindPoint::Compute, layout.clone(), 0, set)
            .map_err(vk("binding descriptors"))?
            .push_constants(layout, 0, push)
            .map_err(vk("pushing constants"))?;
        // SAFETY: every shader bounds-checks its indices against the sizes pushed with it, and
        // the wrappers size the buffers from the same shape values (see each kernel module).
        unsafe { self.builder.dispatch(groups) }.map_err(vk("recording a dispatch"))?;
        self.dispatches += 1;
        self.ctx()
            .dispatches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads `src` back when the job finishes; returns the index into `Finished::downloads`.
    pub(crate) fn download(&mut self, src: &Subbuffer<[u32]>) -> usize {
        self.downloads.push(src.clone());
        self.downloads.len() - 1
    }

    /// Submits without waiting: the work runs after every earlier submission, and every
    /// later one runs after it. No downloads (nothing would read them) and no GPU time.
    pub(crate) fn submit_async(self) -> Result<()> {
        if !self.downloads.is_empty() {
            return Err(GpuError::Shape {
                op: "submit_async",
                problem: "a batch with reads must be submitted with `submit`, which waits".into(),
            });
        }
        let Job { ctx, builder, .. } = self;
        let cb = builder.build().map_err(vk("finishing a command buffer"))?;
        ctx.as_ref().submit(cb, false)
    }

    /// Finishes the command buffer for submitting again and again ([`Replay::submit`]).
    /// A job from [`Job::replayable`], with no downloads (a recorded batch copies its
    /// results into host matrices instead).
    pub(crate) fn into_replay(self) -> Result<Replay> {
        if !self.downloads.is_empty() {
            return Err(GpuError::Shape {
                op: "replay",
                problem: "a recorded batch returns results through host matrices, not reads".into(),
            });
        }
        let cb = self
            .builder
            .build()
            .map_err(vk("finishing a command buffer"))?;
        Ok(Replay { cb })
    }

    /// Submits, waits, and reads downloads and timestamps.
    pub(crate) fn finish(mut self) -> Result<Finished> {
        if let (Some(pool), true) = (&self.timer, self.dispatched) {
            // SAFETY: query 1 was reset at the start and is written once, after every dispatch.
            unsafe {
                self.builder
                    .write_timestamp(pool.clone(), 1, PipelineStage::BottomOfPipe)
            }
            .map_err(vk("recording a timestamp"))?;
        }
        let mut readbacks = Vec::with_capacity(self.downloads.len());
        for src in &self.downloads {
            let dst = self.ctx().host_buffer(
                src.len(),
                MemoryTypeFilter::PREFER_HOST | MemoryTypeFilter::HOST_RANDOM_ACCESS,
            )?;
            self.builder
                .copy_buffer(CopyBufferInfo::buffers(src.clone(), dst.clone()))
                .map_err(vk("recording a download"))?;
            readbacks.push(dst);
        }
        let Job {
            ctx,
            builder,
            timer,
            dispatched,
            ..
        } = self;
        let ctx = ctx.as_ref();
        let cb = builder.build().map_err(vk("finishing a command buffer"))?;
        ctx.submit(cb, true)?;
        let mut downloads = Vec::with_capacity(readbacks.len());
        for dst in readbacks {
            downloads.push(dst.read().map_err(vk("reading results"))?.to_vec());
        }
        let gpu_ns = match (&timer, dispatched) {
            (Some(pool), true) => {
                let mut ticks = [0u64; 2];
                pool.get_results(0..2, &mut ticks, QueryResultFlags::WAIT)
                    .map_err(vk("reading timestamps"))?;
                let period = ctx.info.timestamp_period_ns.unwrap_or(1.0);
                Some((ticks[1].saturating_sub(ticks[0]) as f64 * f64::from(period)) as u64)
            }
            _ => None,
        };
        if dispatched {
            ctx.set_last_gpu_time(gpu_ns);
        }
        Ok(Finished { downloads, gpu_ns })
    }
}
