//! Timestamps that kernels write as the device runs them: what lets a timeline show when
//! queued work really ran, not when the host recorded it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use vulkano::query::{QueryPool, QueryPoolCreateInfo, QueryResultFlags, QueryType};

use crate::batch::GpuBatch;
use crate::context::GpuContext;
use crate::error::{Result, shape, vk};
use crate::job::Job;

/// A pool of device timestamps, all reset, to be written by [`GpuBatch::timestamp`] and
/// read back (in ns) with [`GpuTimer::read_ns`] once the work has finished.
#[derive(Clone, Debug)]
pub struct GpuTimer {
    pool: Arc<QueryPool>,
    period_ns: f64,
    count: u32,
    /// Which timestamps were recorded: Vulkan allows one write per reset.
    written: Arc<Vec<AtomicBool>>,
}

impl GpuContext {
    /// A timer of `count` timestamps, or `None` when the compute queue has no timestamps.
    pub fn timer(&self, count: usize) -> Result<Option<GpuTimer>> {
        let Some(period) = self.info.timestamp_period_ns else {
            return Ok(None);
        };
        let count = u32::try_from(count.max(1))
            .map_err(|_| shape("timer", format!("{count} timestamps are too many")))?;
        let pool = QueryPool::new(
            self.device.clone(),
            QueryPoolCreateInfo {
                query_count: count,
                ..QueryPoolCreateInfo::query_type(QueryType::Timestamp)
            },
        )
        .map_err(vk("creating a timestamp query pool"))?;
        let mut job = Job::with_timer(self, false)?;
        job.reset_queries(&pool, 0..count)?;
        job.finish()?;
        Ok(Some(GpuTimer {
            pool,
            period_ns: f64::from(period),
            count,
            written: Arc::new((0..count).map(|_| AtomicBool::new(false)).collect()),
        }))
    }
}

impl GpuTimer {
    /// Number of timestamps.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the timer holds no timestamps (never: it holds at least one).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Every timestamp in ns on the device's clock (an arbitrary origin), `None` for those
    /// never written. Call once the work that writes them has finished (a waited
    /// [`GpuBatch::submit`] after it, or [`GpuContext::wait_idle`]).
    pub fn read_ns(&self) -> Result<Vec<Option<u64>>> {
        // (value, availability) per query.
        let mut raw = vec![0u64; 2 * self.count as usize];
        self.pool
            .get_results(0..self.count, &mut raw, QueryResultFlags::WITH_AVAILABILITY)
            .map_err(vk("reading timestamps"))?;
        Ok(raw
            .chunks_exact(2)
            .map(|q| (q[1] != 0).then(|| (q[0] as f64 * self.period_ns) as u64))
            .collect())
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// Writes timestamp `index` of `timer` once every command recorded before it (in this
    /// batch and every earlier submission) has finished. Each index can be written once.
    pub fn timestamp(&mut self, timer: &GpuTimer, index: usize) -> Result<()> {
        let Some(written) = timer.written.get(index) else {
            return Err(shape(
                "timestamp",
                format!("index {index} of a timer of {}", timer.len()),
            ));
        };
        if written.swap(true, Ordering::Relaxed) {
            return Err(shape(
                "timestamp",
                format!("timestamp {index} was already recorded"),
            ));
        }
        self.job_mut().write_timestamp(&timer.pool, index as u32)
    }
}
