//! Outlier shadowing at run time (seed 000 section 3.3): which activations are quantized
//! how, and the float weight rows that multiply their outliers.
//!
//! Each decoder layer quantizes four activations
//! ([`ShadowSite`](hetsched_systems::shadow::ShadowSite)); the INT8 linears reading
//! one share its scale and its outliers. A shadowed site clips its per-tensor scale at
//! [`SHADOW_CLIP_RMS`] RMS of the bulk and hands each
//! value beyond the range to its linears' [`ShadowRows`]: the float weights of that input
//! channel times the part the saturated INT8 value misses. With a calibration
//! ([`super::calibration`]) only the important sites keep that shadow (the others quantize
//! by the calibration's pruned rule: by default a looser clip and only their top
//! channels' rows, [`QuantRule::HotMax`]) and only their hot channels' rows stay
//! resident; a cold channel's row is read from the memory-mapped model file when an
//! outlier needs it.
//!
//! This module is the whole layer, and what the rest of the executor calls: the rules
//! ([`QuantRule`], [`PrunedScale`] and the clips [`SHADOW_CLIP_RMS`],
//! [`PRUNED_CLIP_RMS`]), a shadowed site's quantize ([`quantize_clipped`], in `quant`),
//! the float rows ([`ShadowRows::multiply`]) and the counters and report. Weights hold
//! [`ShadowRows`], values quantize and multiply through these; none of it imports them
//! back.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use hetsched_kernels::shadow_scatter;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::KernelError;
use hetsched_import::{ColumnSource, LayerTensor};

mod quant;

pub use quant::{cold_mask, quantize_clipped};

/// Outlier shadowing clips the activation range at this many root-mean-squares of the
/// bulk (`clip_limit`): the bulk of an activation keeps INT8 resolution, the few values
/// beyond go to the float shadow. On SmolLM2-135M, 4 bulk RMS sends as many values to the
/// shadow as 3 plain RMS did, at a third of the KL divergence from f32
/// (docs/outliers.md).
pub const SHADOW_CLIP_RMS: f32 = 4.0;

/// A pruned site's ceiling ([`QuantRule::HotMax`]), in RMS of the bulk: looser than
/// [`SHADOW_CLIP_RMS`], so only the rare extreme values of the channels it keeps no row
/// for go to the shadow (and read their row from the model file).
pub const PRUNED_CLIP_RMS: f32 = 6.0;

/// How one activation is quantized.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantRule {
    /// f32 linears: no quantization.
    PassThrough,
    /// Per-tensor INT8, scale max |x| / 127 (plain W8A8, and pruned shadow sites).
    MaxAbs,
    /// INT8 with one scale per row and group of 32 inputs (max |x| / 127 of the group;
    /// the CPU lane's W4A8, `w4a8-g32`): no outliers, no shadow.
    Groups,
    /// INT8 with one scale per row and group of 128 inputs (`w4a8-g128`; a row's last
    /// group may be shorter): no outliers, no shadow.
    Groups128 {
        /// The activation's row width (the site's linears' input width).
        width: usize,
    },
    /// Per-tensor INT8 with a scale fixed by calibration; values beyond saturate (a
    /// pruned site quantized with its calibrated percentile scale).
    Static {
        /// Real value per INT8 step.
        scale: f32,
    },
    /// Per-tensor INT8, scale clipped at min(max |x|, `rms` × the RMS of the tensor's bulk)
    /// / 127 (`clip_limit`); values beyond go to the float shadow.
    Clip {
        /// Clip in root-mean-squares of the tensor's bulk.
        rms: f32,
    },
    /// Per-tensor INT8, scale from min(max |x| of the channels outside `hot`, `clip` ×
    /// the bulk's RMS) / 127 (a pruned site with [`PrunedScale::HotMax`]). The values
    /// beyond go to the float shadow: mostly those of the `hot` channels, whose rows stay
    /// resident; the rare extreme value of another channel reads its row from the model
    /// file.
    HotMax {
        /// Per input channel: whether it is one of the site's hot channels.
        hot: Arc<[bool]>,
        /// The ceiling, in RMS of the bulk ([`PRUNED_CLIP_RMS`]).
        clip: f32,
    },
}

impl QuantRule {
    /// Whether the site hands outliers to a float shadow (a kept site, or a pruned one
    /// with its top channels' rows): the plan then gives it a shadow stage beside its INT8
    /// stage.
    pub fn shadows(&self) -> bool {
        matches!(self, QuantRule::Clip { .. } | QuantRule::HotMax { .. })
    }
}

/// The per-tensor scale a pruned site (one without the full shadow) quantizes with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrunedScale {
    /// Each tensor's own max |x| / 127: nothing saturates, the bulk loses resolution.
    #[default]
    Max,
    /// The calibration's percentile scale: the few values beyond saturate.
    Percentile,
    /// The max |x| outside the site's top channels (calibration's `top_channels`, as
    /// many as `Calibration::pruned_shadow_bytes` hold), whose float rows stay resident
    /// and take their values beyond: at qkv and gate_up the channels that blow up a max
    /// scale are few and fixed (the residual stream's massive channels), so a few rows buy
    /// most of the resolution back. Capped at
    /// [`PRUNED_CLIP_RMS`] bulk RMS: at down the large
    /// values are spread over every channel, and the rare ones beyond the cap read their
    /// rows from the model file.
    #[serde(rename = "hot-max")]
    HotMax,
}

/// Input-channel rows of an INT8 linear's float weights kept for the shadow.
pub struct ShadowRows {
    /// Output features.
    n: usize,
    /// Per input channel: its row in `rows`, or [`COLD`].
    slots: Vec<u32>,
    /// `[hot channels, n]`: row `slot` holds every output's weight of that channel.
    rows: Vec<f32>,
    /// Where a cold channel's row is read from; `None` when every channel is hot.
    cold: Option<ColdRows>,
    /// Cold rows read earlier and kept, by channel, while [`ColdRows::cache`] has room
    /// (set once, read without a lock; empty without a cold source).
    kept: Vec<OnceLock<Arc<[f32]>>>,
    /// How many of `kept` are set.
    kept_rows: AtomicUsize,
}

/// A channel whose row is not resident.
const COLD: u32 = u32::MAX;

/// Output rows per task of the shadow multiply.
const SHADOW_ROWS_PER_TASK: usize = 8;

/// The model file a linear's cold rows are read from.
#[derive(Clone)]
pub struct ColdRows {
    /// The memory-mapped model.
    pub source: Arc<dyn ColumnSource>,
    /// Decoder layer.
    pub layer: usize,
    /// Which linear.
    pub which: LayerTensor,
    /// The budget for keeping rows once read, shared by every linear of the model.
    pub cache: Arc<ColdRowCache>,
}

/// A byte budget for cold rows kept in memory once read, shared by every linear of a
/// model. A read gathers one element from every output row of the mapped tensor (several
/// microseconds), and a channel that had an outlier in one chunk tends to have more in the
/// next; rows are kept first come, first kept, until the budget is spent (no eviction, so
/// the memory it takes is bounded and reported).
#[derive(Debug)]
pub struct ColdRowCache {
    budget: u64,
    used: AtomicU64,
}

impl ColdRowCache {
    /// A cache that keeps at most `budget` bytes of rows (0: every miss reads the file).
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            used: AtomicU64::new(0),
        }
    }

    /// Takes `bytes` from the budget if they fit.
    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                (used + bytes <= self.budget).then_some(used + bytes)
            })
            .is_ok()
    }

    /// Bytes of rows kept so far.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for ShadowRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShadowRows")
            .field("n", &self.n)
            .field("k", &self.slots.len())
            .field("hot", &(self.rows.len() / self.n.max(1)))
            .field("cold_source", &self.cold.is_some())
            .finish()
    }
}

impl ShadowRows {
    /// Every input channel's row of `w` (`[n, k]`) resident: a full transposed copy.
    pub fn all(w: &[f32], n: usize, k: usize) -> Self {
        let channels: Vec<u32> = (0..k as u32).collect();
        Self::build(w, n, k, &channels, None)
    }

    /// The rows of `hot` channels of `w` (`[n, k]`) resident, the others read from
    /// `cold` on demand. Channels out of range are ignored.
    pub fn hot(w: &[f32], n: usize, k: usize, hot: &[u32], cold: ColdRows) -> Self {
        Self::build(w, n, k, hot, Some(cold))
    }

    fn build(w: &[f32], n: usize, k: usize, hot: &[u32], cold: Option<ColdRows>) -> Self {
        let mut slots = vec![COLD; k];
        let mut rows = Vec::with_capacity(hot.len() * n);
        for &c in hot {
            let c = c as usize;
            if c >= k || slots[c] != COLD {
                continue;
            }
            slots[c] = (rows.len() / n.max(1)) as u32;
            rows.extend(w.chunks_exact(k).map(|row| row[c]));
        }
        let kept = match cold {
            Some(_) => (0..k).map(|_| OnceLock::new()).collect(),
            None => Vec::new(),
        };
        Self {
            n,
            slots,
            rows,
            cold,
            kept,
            kept_rows: AtomicUsize::new(0),
        }
    }

    /// Bytes this table keeps resident: the hot rows, the channel index and the cold rows
    /// kept so far ([`Self::kept_bytes`]).
    pub fn resident_bytes(&self) -> u64 {
        (4 * (self.rows.len() + self.slots.len())) as u64 + self.kept_bytes()
    }

    /// Bytes of cold rows kept once read.
    pub fn kept_bytes(&self) -> u64 {
        (4 * self.n * self.kept_rows.load(Ordering::Relaxed)) as u64
    }

    /// Bytes of a full float copy of the linear's weights.
    pub fn full_bytes(&self) -> u64 {
        (4 * self.n * self.slots.len()) as u64
    }

    /// Channels whose rows are resident.
    pub fn hot_channels(&self) -> usize {
        self.rows.len() / self.n.max(1)
    }

    /// The float shadow `[rows, n]` of `outliers` (flat index into a `[rows, k]`
    /// activation, ascending, and the part the INT8 value misses): each adds residual ×
    /// its channel's row to its output row. Cold rows are read once, then blocks of output
    /// rows are spread over the current thread pool (the shadow runs beside an INT8 stage
    /// whose lane may leave threads idle), each through
    /// [`hetsched_kernels::shadow_scatter`] with a per-channel table of rows (an index, not
    /// a map lookup, per outlier).
    pub fn multiply(
        &self,
        outliers: &[(u32, f32)],
        rows: usize,
        counters: &ShadowCounters,
    ) -> Result<Vec<f32>, KernelError> {
        let start = Instant::now();
        let (n, k) = (self.n, self.slots.len().max(1));
        check_outliers(outliers, rows, k)?;
        let mut needed = vec![false; k];
        for &(i, _) in outliers {
            needed[i as usize % k] = true;
        }
        let mut table: Vec<&[f32]> = vec![&[]; k];
        let mut cold = Vec::new();
        let mut hits = 0;
        for c in (0..k).filter(|&c| needed[c]) {
            match (self.slots[c], self.kept.get(c).and_then(OnceLock::get)) {
                (COLD, Some(row)) => {
                    table[c] = row;
                    hits += 1;
                }
                (COLD, None) => cold.push(c),
                (slot, _) => {
                    table[c] = &self.rows[slot as usize * n..(slot as usize + 1) * n];
                    hits += 1;
                }
            }
        }
        let read = self.read_and_keep(cold)?;
        for (c, row) in &read {
            table[*c] = row;
        }
        let mut y = vec![0f32; rows * n];
        y.par_chunks_mut(SHADOW_ROWS_PER_TASK * n.max(1))
            .enumerate()
            .for_each(|(block, out)| {
                let first = (block * SHADOW_ROWS_PER_TASK * k) as u32;
                let last = first + (out.len() / n.max(1) * k) as u32;
                let from = outliers.partition_point(|&(i, _)| i < first);
                let to = outliers.partition_point(|&(i, _)| i < last);
                shadow_scatter(out, n, k, first, &outliers[from..to], &table);
            });
        counters.record(
            hits as u64,
            read.len() as u64,
            outliers.len() as u64,
            start.elapsed().as_nanos() as u64,
        );
        Ok(y)
    }

    /// The rows of `channels` (cold, not kept) read from the cold source, in parallel, and
    /// kept while the cache's budget lasts.
    fn read_and_keep(&self, channels: Vec<usize>) -> Result<RowsByChannel, KernelError> {
        // Each cold row gathers one element from every output row of the memory map:
        // latency-bound, so the reads are spread over the pool too.
        let read: RowsByChannel = channels
            .into_par_iter()
            .map(|c| Ok((c, Arc::from(self.read_cold(c)?))))
            .collect::<Result<_, KernelError>>()?;
        if let Some(cold) = &self.cold {
            for (c, row) in &read {
                // Another chunk may have kept it meanwhile: count its bytes once.
                if self.kept[*c].get().is_none()
                    && cold.cache.reserve((4 * row.len()) as u64)
                    && self.kept[*c].set(row.clone()).is_ok()
                {
                    self.kept_rows.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(read)
    }

    fn read_cold(&self, channel: usize) -> Result<Vec<f32>, KernelError> {
        let Some(cold) = &self.cold else {
            return Err(KernelError::NoColdSource { channel });
        };
        let row = cold
            .source
            .layer_column(cold.layer, cold.which, channel)
            .map_err(KernelError::ColdRead)?;
        if row.len() == self.n {
            Ok(row)
        } else {
            Err(KernelError::ColdRowLength {
                layer: cold.layer,
                which: cold.which,
                found: row.len(),
                expected: self.n,
            })
        }
    }
}

/// What the shadow did, counted over every linear since the model was loaded.
#[derive(Debug, Default)]
pub struct ShadowCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    outliers: AtomicU64,
    nanos: AtomicU64,
}

impl ShadowCounters {
    fn record(&self, hits: u64, misses: u64, outliers: u64, nanos: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(misses, Ordering::Relaxed);
        self.outliers.fetch_add(outliers, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> ShadowUsage {
        ShadowUsage {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            outliers: self.outliers.load(Ordering::Relaxed),
            shadow_ns: self.nanos.load(Ordering::Relaxed),
        }
    }
}

/// Shadow work over some span of runs (a difference of two snapshots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ShadowUsage {
    /// Rows served from memory (per linear call and channel): the resident hot-channel
    /// tables, or cold rows kept from an earlier read.
    pub hits: u64,
    /// Rows read from the model file (a channel never seen hot in calibration).
    pub misses: u64,
    /// Outlier values multiplied in float.
    pub outliers: u64,
    /// Time spent in shadow multiplies, summed over the lanes that ran them.
    pub shadow_ns: u64,
}

impl ShadowUsage {
    /// The work of `self` and `other` together.
    pub fn plus(self, other: ShadowUsage) -> ShadowUsage {
        ShadowUsage {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            outliers: self.outliers + other.outliers,
            shadow_ns: self.shadow_ns + other.shadow_ns,
        }
    }

    /// The work done between `earlier` and `self`.
    pub fn since(self, earlier: ShadowUsage) -> ShadowUsage {
        ShadowUsage {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            outliers: self.outliers - earlier.outliers,
            shadow_ns: self.shadow_ns - earlier.shadow_ns,
        }
    }
}

/// The shadow of a run, for reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShadowReport {
    /// Activation sites shadowed (the others are plain W8A8).
    pub kept_sites: usize,
    /// Activation sites of the model (4 per layer).
    pub sites: usize,
    /// The calibration file used, if any (without one every site keeps every row).
    pub calibration: Option<String>,
    /// Float weight bytes the shadow keeps resident (hot rows, and the cold rows kept
    /// once read: `cold_kept_bytes`).
    pub resident_bytes: u64,
    /// Bytes of a full float copy of every INT8 linear (what a shadow without
    /// calibration keeps).
    pub full_copy_bytes: u64,
    /// `resident_bytes / full_copy_bytes`.
    pub resident_share: f64,
    /// Rows served from memory: hot rows, and cold rows kept from an earlier read.
    pub hits: u64,
    /// Cold rows read from the model file.
    pub misses: u64,
    /// Bytes of cold rows kept in memory once read (part of `resident_bytes`), at most
    /// the model's cold-row budget.
    pub cold_kept_bytes: u64,
    /// Outlier values multiplied in float.
    pub outliers: u64,
    /// Time in shadow multiplies, ms (inside the INT8 jobs).
    pub shadow_ms: f64,
    /// `shadow_ms` over the prefill's wall time (0 where no wall time is known).
    pub prefill_share: f64,
}

/// Float weight rows read from the cold source, with their input channels.
type RowsByChannel = Vec<(usize, Arc<[f32]>)>;

/// `outliers` index a `[rows, k]` activation and ascend (the shadow's blocks of output
/// rows find their outliers by binary search).
fn check_outliers(outliers: &[(u32, f32)], rows: usize, k: usize) -> Result<(), KernelError> {
    if let Some(&(i, _)) = outliers.iter().find(|&&(i, _)| i as usize / k >= rows) {
        return Err(KernelError::OutlierOutside { index: i, rows, k });
    }
    if outliers.windows(2).any(|w| w[0].0 > w[1].0) {
        return Err(KernelError::OutliersUnordered);
    }
    Ok(())
}
