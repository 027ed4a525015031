//! What a decode step needs to run with the host out of the loop: kernels for few tokens
//! (the embedding gathered on the device, attention over positions read from a buffer,
//! greedy sampling), small host-visible matrices for the token and position that go in and
//! the token that comes out, and batches recorded once and submitted again and again
//! ([`GpuBatch::replayable`], [`RecordedBatch`]).
//!
//! A step recorded this way takes every value that changes from step to step from device
//! buffers the recorded commands copy from host matrices ([`GpuBatch::upload_host`]): the
//! host writes the token and the position, submits the recording, waits, and reads the
//! chosen token back ([`GpuBatch::download_host`]). The few-row GEMM
//! (`gemv_fused.glsl`, which [`GpuBatch::gemm_fused`] picks for up to
//! [`GEMV_MAX_ROWS`] rows) takes the RoPE row and the cache row from the same positions
//! ([`crate::GemmEpilogue::QkvRopeAt`]).

use std::sync::Arc;

use hetsched_kernels::reference::AttentionShape;
use vulkano::buffer::{Buffer, BufferCreateInfo, BufferUsage, Subbuffer};
use vulkano::memory::allocator::{AllocationCreateInfo, MemoryTypeFilter};

use crate::attention::{
    DECODE_ATTENTION_MAX_TOKENS, decode_attention_fits, record_decode_attention,
};
use crate::batch::{GpuBatch, check_attention, dense};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{Result, shape, vk};
use crate::job::{Job, Replay};
use crate::pipelines::{PUSH_WORDS, Shader};

/// Most rows of A the few-row fused GEMM (`gemv_fused.glsl`) takes; more go to the tiles.
pub const GEMV_MAX_ROWS: usize = 8;

fn push(words: &[u32]) -> [u32; PUSH_WORDS] {
    let mut p = [0u32; PUSH_WORDS];
    p[..words.len()].copy_from_slice(words);
    p
}

/// A small `[rows, cols]` matrix of 32-bit words in host-visible memory: what the host
/// writes before a recorded batch runs, or reads after it ran. Kernels never bind it; a
/// batch copies it to or from a device matrix ([`GpuBatch::upload_host`],
/// [`GpuBatch::download_host`]).
#[derive(Clone, Debug)]
pub struct HostMatrix {
    buf: Subbuffer<[u32]>,
    rows: usize,
    cols: usize,
}

impl HostMatrix {
    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Writes all `rows · cols` words (row-major). Fails while a submitted batch that
    /// copies it may still run.
    pub fn write(&self, words: &[u32]) -> Result<()> {
        if words.len() != self.rows * self.cols {
            return Err(shape(
                "host matrix write",
                format!(
                    "{} words for a [{}, {}] matrix",
                    words.len(),
                    self.rows,
                    self.cols
                ),
            ));
        }
        self.buf
            .write()
            .map_err(vk("writing a host matrix"))?
            .copy_from_slice(words);
        Ok(())
    }

    /// Reads all words (row-major).
    pub fn read(&self) -> Result<Vec<u32>> {
        Ok(self
            .buf
            .read()
            .map_err(vk("reading a host matrix"))?
            .to_vec())
    }
}

impl GpuContext {
    /// A zero-filled [`HostMatrix`] of `rows · cols` 32-bit words.
    pub fn host_matrix(&self, rows: usize, cols: usize) -> Result<HostMatrix> {
        let words = (rows * cols).max(1) as u64;
        let buf = Buffer::from_iter(
            self.memory.clone(),
            BufferCreateInfo {
                usage: BufferUsage::TRANSFER_SRC | BufferUsage::TRANSFER_DST,
                ..Default::default()
            },
            AllocationCreateInfo {
                memory_type_filter: MemoryTypeFilter::PREFER_HOST
                    | MemoryTypeFilter::HOST_RANDOM_ACCESS,
                ..Default::default()
            },
            (0..words as usize).map(|_| 0u32),
        )
        .map_err(vk("allocating a host matrix"))?;
        Ok(HostMatrix { buf, rows, cols })
    }
}

/// A [`GpuBatch`] recorded once ([`GpuBatch::record`]), submitted as often as wanted: every
/// submission runs the same commands on the buffers' contents at that time.
pub struct RecordedBatch {
    ctx: Arc<GpuContext>,
    replay: Replay,
    dispatches: usize,
}

impl std::fmt::Debug for RecordedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordedBatch")
            .field("dispatches", &self.dispatches)
            .finish()
    }
}

impl RecordedBatch {
    /// Submits the recording after every earlier submission on its context and returns at
    /// once; a later waited submission sees its results.
    pub fn submit_async(&self) -> Result<()> {
        self.replay.submit(&self.ctx, false)
    }

    /// Submits the recording and waits for it (and so for everything submitted before).
    pub fn submit(&self) -> Result<()> {
        self.replay.submit(&self.ctx, true)
    }

    /// Dispatches recorded.
    pub fn dispatches(&self) -> usize {
        self.dispatches
    }
}

impl GpuBatch<Arc<GpuContext>> {
    /// A batch to record once and submit many times ([`GpuBatch::record`]); no
    /// timestamps, no reads (copy results into a [`HostMatrix`] instead).
    pub fn replayable(ctx: Arc<GpuContext>) -> Result<Self> {
        Ok(GpuBatch::from_job(Job::replayable(ctx)?))
    }

    /// Finishes a [`GpuBatch::replayable`] batch into a [`RecordedBatch`].
    pub fn record(self) -> Result<RecordedBatch> {
        if self.has_reads() {
            return Err(shape(
                "record",
                "a recorded batch returns results through host matrices (download_host), not reads",
            ));
        }
        let job = self.into_job();
        let (ctx, dispatches) = (job.handle().clone(), job.dispatches());
        let replay = job.into_replay()?;
        Ok(RecordedBatch {
            ctx,
            replay,
            dispatches,
        })
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// Copies `src` into the first words of `dst` (as many words as `src` holds).
    pub fn upload_host(&mut self, src: &HostMatrix, dst: &GpuMatrix) -> Result<()> {
        let words = (src.rows * src.cols) as u64;
        if words == 0 || words > dst.buf.len() {
            return Err(shape(
                "upload_host",
                format!("{words} words into a {}-word matrix", dst.buf.len()),
            ));
        }
        let dst = dst.buf.clone().slice(0..words);
        self.job_mut().copy(src.buf.clone(), dst)
    }

    /// Copies the first words of `src` into `dst` (as many words as `dst` holds).
    pub fn download_host(&mut self, src: &GpuMatrix, dst: &HostMatrix) -> Result<()> {
        let words = (dst.rows * dst.cols) as u64;
        if words == 0 || words > src.buf.len() {
            return Err(shape(
                "download_host",
                format!("{words} words from a {}-word matrix", src.buf.len()),
            ));
        }
        let src = src.buf.clone().slice(0..words);
        self.job_mut().copy(src, dst.buf.clone())
    }

    /// `out[r] = table[ids[r]]`: `table` `[vocab, cols]` and `out` `[rows, cols]` dense
    /// f32, `ids` `[1, rows]` (or more columns) of u32 ([`Elem::I32`]). An id past the
    /// table gives a row of zeros (check ids before writing them).
    pub fn embed_rows(
        &mut self,
        table: &GpuMatrix,
        ids: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<()> {
        let (rows, cols) = (out.rows(), out.cols());
        dense("embed_rows", "table", table, table.rows(), cols)?;
        dense("embed_rows", "out", out, rows, cols)?;
        if ids.elem() != Elem::I32 || ids.rows() * ids.cols() < rows {
            return Err(shape(
                "embed_rows",
                format!(
                    "ids must hold {rows} u32 values (I32), got [{}, {}] {:?}",
                    ids.rows(),
                    ids.cols(),
                    ids.elem()
                ),
            ));
        }
        let items = rows * cols / 4;
        self.job_mut().dispatch(
            Shader::EmbedRows,
            &[&table.buf, &ids.buf, &out.buf],
            push(&[rows as u32, (cols / 4) as u32, table.rows() as u32]),
            crate::job::stride_groups(items),
        )
    }

    /// Greedy sampling: `out[r]` = the column of row `r`'s largest value in `x` `[rows,
    /// cols]` f32 (the lower column on a tie, NaN never chosen, `u32::MAX` for a row with
    /// no number), `out` `[1, rows]` or more of u32 ([`Elem::I32`]).
    pub fn argmax_rows(&mut self, x: &GpuMatrix, out: &GpuMatrix) -> Result<()> {
        let rows = x.rows();
        if x.elem() != Elem::F32 || x.cols() == 0 {
            return Err(shape("argmax_rows", "x must be an f32 matrix with columns"));
        }
        if out.elem() != Elem::I32 || out.rows() * out.cols() < rows || rows > 65_535 {
            return Err(shape(
                "argmax_rows",
                format!(
                    "out must hold {rows} u32 values (I32, at most 65535), got [{}, {}] {:?}",
                    out.rows(),
                    out.cols(),
                    out.elem()
                ),
            ));
        }
        self.job_mut().dispatch(
            Shader::ArgmaxRows,
            &[&x.buf, &out.buf],
            push(&[rows as u32, x.cols() as u32, x.ld() as u32]),
            [rows as u32, 1, 1],
        )
    }

    /// Causal attention like [`GpuBatch::attention`] for at most 8 tokens whose positions
    /// are read from `positions` (`[1, n_tokens]` or more of u32, [`Elem::I32`]) when the
    /// batch runs: token `t`
    /// attends to keys `0..=positions[t]`, at most `s.kv_len` of them (the rows the caches
    /// hold); `s.pos0` is ignored. What a recorded decode step replays at every position.
    pub fn attention_at(
        &mut self,
        q: &GpuMatrix,
        caches: (&GpuMatrix, &GpuMatrix),
        s: &AttentionShape,
        positions: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<()> {
        self.attention_at_windowed(q, caches, s, (positions, 0), out)
    }

    /// [`GpuBatch::attention_at`] where each token sees at most its last `window` keys
    /// (itself included), 0 meaning all; `at` is `(positions, window)`.
    pub fn attention_at_windowed(
        &mut self,
        q: &GpuMatrix,
        caches: (&GpuMatrix, &GpuMatrix),
        s: &AttentionShape,
        (positions, window): (&GpuMatrix, usize),
        out: &GpuMatrix,
    ) -> Result<()> {
        let at = AttentionShape {
            pos0: 0,
            kv_len: s.kv_len.max(s.n_tokens),
            ..*s
        };
        check_attention(q, caches, &at, out)?;
        if !decode_attention_fits(&at) || at.kv_len == 0 {
            return Err(shape(
                "attention_at",
                format!(
                    "{} tokens of head_dim {} over {} keys: the decode kernel takes at most \
                     {DECODE_ATTENTION_MAX_TOKENS} tokens, head_dim a multiple of 4 up to {}, \
                     and at least one key",
                    at.n_tokens,
                    at.head_dim,
                    at.kv_len,
                    crate::MAX_HEAD_DIM
                ),
            ));
        }
        if positions.elem() != Elem::I32 || positions.rows() * positions.cols() < at.n_tokens {
            return Err(shape(
                "attention_at",
                format!("positions must hold {} u32 values (I32)", at.n_tokens),
            ));
        }
        let (k, v) = caches;
        record_decode_attention(
            self.job_mut(),
            [&q.buf, &k.buf, &v.buf, &out.buf],
            Some(&positions.buf),
            &at,
            window,
        )
    }
}
