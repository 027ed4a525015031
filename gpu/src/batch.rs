//! Several kernels on resident matrices recorded into one command buffer and submitted
//! together: what a subgraph whose tensors all live on the device needs. No host round trip
//! between its kernels; the command buffer's automatic barriers order each kernel after the
//! writes it reads.
//!
//! Every operand is an f32 [`GpuMatrix`] whose rows are dense (`cols` a multiple of 4, so
//! the 16-byte row padding is empty): the element-wise kernels index them as flat arrays.

use std::ops::Range;
use std::sync::Arc;

use hetsched_kernels::reference::{AttentionShape, RopeStyle};

use crate::attention::{record_attention, validate_shape};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::gemm::GemmTile;
use crate::job::{Job, stride_groups};
use crate::pipelines::{PUSH_WORDS, Shader};
use crate::rope::cos_sin_table;

/// Kernels recorded for one submission; see the module note. Dropping it without
/// [`GpuBatch::submit`] runs nothing. `C` is how it holds its context: a borrow
/// ([`GpuContext::batch`]) or an `Arc` ([`GpuBatch::owned`]), for a batch that stays open
/// across calls and gathers the work of several of them.
pub struct GpuBatch<C: AsRef<GpuContext>> {
    job: Job<C>,
    reads: Vec<Read>,
}

/// One [`GpuBatch::read`]: which download holds it, and the row layout to strip the
/// padding from.
#[derive(Clone, Copy, Debug)]
struct Read {
    download: usize,
    rows: usize,
    cols: usize,
    ld: usize,
}

impl Read {
    const EMPTY: Read = Read {
        download: usize::MAX,
        rows: 0,
        cols: 0,
        ld: 0,
    };

    /// The dense `[rows, cols]` values of the downloaded words.
    fn dense(&self, words: &[u32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for row in words.chunks(self.ld.max(1)).take(self.rows) {
            out.extend(
                row[..self.cols.min(row.len())]
                    .iter()
                    .map(|&w| f32::from_bits(w)),
            );
        }
        out
    }
}

/// What a submitted batch gives back.
#[derive(Clone, Debug, Default)]
pub struct BatchOutput {
    /// One dense `[rows, cols]` vector per [`GpuBatch::read`], in call order.
    pub reads: Vec<Vec<f32>>,
    /// GPU time from the first kernel to the end of the last, when timestamps exist.
    pub gpu_ns: Option<u64>,
}

/// Checks that `m` is a dense f32 matrix of `rows x cols`.
pub(crate) fn dense(
    op: &'static str,
    what: &str,
    m: &GpuMatrix,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if m.elem() != Elem::F32 || m.ld() != m.cols() {
        return Err(shape(
            op,
            format!(
                "{what} must be a dense f32 matrix (f32, columns a multiple of 4), got {:?} with {} columns",
                m.elem(),
                m.cols()
            ),
        ));
    }
    has_shape(op, what, m, rows, cols)
}

/// Checks that `m` is `[rows, cols]`.
pub(crate) fn has_shape(
    op: &'static str,
    what: &str,
    m: &GpuMatrix,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if m.rows() != rows || m.cols() != cols {
        return Err(shape(
            op,
            format!(
                "{what} is [{}, {}], expected [{rows}, {cols}]",
                m.rows(),
                m.cols()
            ),
        ));
    }
    Ok(())
}

fn push(words: &[u32]) -> [u32; PUSH_WORDS] {
    let mut p = [0u32; PUSH_WORDS];
    p[..words.len()].copy_from_slice(words);
    p
}

/// The operand checks of [`GpuBatch::attention`] (and of its fused twin).
pub(crate) fn check_attention(
    q: &GpuMatrix,
    (k_cache, v_cache): (&GpuMatrix, &GpuMatrix),
    s: &AttentionShape,
    out: &GpuMatrix,
) -> Result<()> {
    let q_cols = s.n_heads * s.head_dim;
    let kv_cols = s.n_kv_heads * s.head_dim;
    dense("attention", "q", q, s.n_tokens, q_cols)?;
    dense("attention", "out", out, s.n_tokens, q_cols)?;
    dense("attention", "k_cache", k_cache, k_cache.rows(), kv_cols)?;
    dense("attention", "v_cache", v_cache, v_cache.rows(), kv_cols)?;
    let capacity = k_cache.rows().min(v_cache.rows());
    if capacity < s.kv_len {
        return Err(shape(
            "attention",
            format!("caches hold {capacity} rows, kv_len is {}", s.kv_len),
        ));
    }
    let kv = s.kv_len * kv_cols;
    validate_shape(s, q.rows() * q_cols, kv, kv)
}

impl GpuContext {
    /// Starts a batch of kernels on resident matrices.
    ///
    /// ```no_run
    /// # fn demo(ctx: &hetsched_gpu::GpuContext) -> hetsched_gpu::Result<()> {
    /// use hetsched_gpu::Elem;
    /// let x = ctx.upload_f32(&[1.0; 8], 2, 4)?;
    /// let norm = ctx.upload_f32(&[1.0; 4], 1, 4)?;
    /// let w = ctx.upload_f32(&[0.5; 12], 3, 4)?;
    /// let (normed, y) = (ctx.alloc_matrix(2, 4, Elem::F32)?, ctx.alloc_matrix(2, 3, Elem::F32)?);
    /// let mut batch = ctx.batch()?;
    /// batch.rms_norm(&x, &norm, 1e-5, &normed)?;
    /// batch.matmul_f32(&normed, &w, &y)?;
    /// batch.read(&y, 0..2)?;
    /// let out = batch.submit()?;                  // one submission, one wait
    /// assert_eq!(out.reads[0].len(), 2 * 3);
    /// # Ok(()) }
    /// ```
    pub fn batch(&self) -> Result<GpuBatch<&GpuContext>> {
        Ok(GpuBatch {
            job: Job::new(self)?,
            reads: Vec::new(),
        })
    }

    /// A batch without timestamps, for [`GpuBatch::submit_async`]: a stream of batches
    /// that nobody waits for one by one.
    pub fn batch_untimed(&self) -> Result<GpuBatch<&GpuContext>> {
        Ok(GpuBatch {
            job: Job::with_timer(self, false)?,
            reads: Vec::new(),
        })
    }

    /// The RoPE rotations of `positions` as a resident `[tokens, head_dim]` table of
    /// (cos, sin) pairs, computed in f64 on the host like the reference; upload once per
    /// chunk and pass to [`GpuBatch::rope`].
    pub fn rope_angles(
        &self,
        positions: &[usize],
        head_dim: usize,
        theta_base: f32,
    ) -> Result<GpuMatrix> {
        if !head_dim.is_multiple_of(2) {
            return Err(shape("rope", format!("head_dim {head_dim} must be even")));
        }
        let table: Vec<f32> = cos_sin_table(positions, head_dim, theta_base)
            .into_iter()
            .map(f32::from_bits)
            .collect();
        self.upload_f32(&table, positions.len(), head_dim)
    }
}

impl GpuBatch<Arc<GpuContext>> {
    /// A batch without timestamps that owns a handle on its context, so that it can be
    /// kept open while the work of several calls is recorded into it.
    pub fn owned(ctx: Arc<GpuContext>) -> Result<Self> {
        Ok(GpuBatch {
            job: Job::with_timer(ctx, false)?,
            reads: Vec::new(),
        })
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// Writes host rows into `dst` starting at row `row0`.
    pub fn write(&mut self, dst: &GpuMatrix, row0: usize, data: &[f32]) -> Result<()> {
        let cols = dst.cols();
        dense("write", "dst", dst, dst.rows(), cols)?;
        let rows = data.len() / cols.max(1);
        if rows * cols != data.len() || row0 + rows > dst.rows() {
            return Err(shape(
                "write",
                format!(
                    "{} values at row {row0} do not fit whole rows of [{}, {cols}]",
                    data.len(),
                    dst.rows()
                ),
            ));
        }
        let words: Vec<u32> = data.iter().map(|v| v.to_bits()).collect();
        let start = (row0 * cols) as u64;
        let span = start..start + words.len() as u64;
        self.job.upload_into(&words, dst.buf.clone().slice(span))
    }

    /// Copies rows `src_rows` of `src` into `dst` from row `dst_row0` (same width).
    pub fn copy_rows(
        &mut self,
        src: &GpuMatrix,
        src_rows: Range<usize>,
        dst: &GpuMatrix,
        dst_row0: usize,
    ) -> Result<()> {
        let cols = src.cols();
        dense("copy_rows", "src", src, src.rows(), cols)?;
        dense("copy_rows", "dst", dst, dst.rows(), cols)?;
        let n = src_rows.len();
        if src_rows.end > src.rows() || dst_row0 + n > dst.rows() {
            return Err(shape(
                "copy_rows",
                format!(
                    "rows {src_rows:?} of [{}, {cols}] into row {dst_row0} of [{}, {cols}] overrun",
                    src.rows(),
                    dst.rows()
                ),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let (s, d) = ((src_rows.start * cols) as u64, (dst_row0 * cols) as u64);
        let len = (n * cols) as u64;
        self.job.copy(
            src.buf.clone().slice(s..s + len),
            dst.buf.clone().slice(d..d + len),
        )
    }

    /// `out = a · wᵀ`: `a` `[m, k]`, `w` `[n, k]`, `out` `[m, n]`, all f32.
    pub fn matmul_f32(&mut self, a: &GpuMatrix, w: &GpuMatrix, out: &GpuMatrix) -> Result<()> {
        crate::gemm::check_f32_operands(a, w, out)?;
        crate::gemm::record_f32_gemm(&mut self.job, GemmTile::Auto, (a, w, out))
    }

    /// RMSNorm of every row of `x` `[rows, cols]` into `out`, `weight` `[1, cols]`.
    pub fn rms_norm(
        &mut self,
        x: &GpuMatrix,
        weight: &GpuMatrix,
        eps: f32,
        out: &GpuMatrix,
    ) -> Result<()> {
        let (rows, cols) = (x.rows(), x.cols());
        dense("rms_norm", "x", x, rows, cols)?;
        dense("rms_norm", "weight", weight, 1, cols)?;
        dense("rms_norm", "out", out, rows, cols)?;
        if rows > 65_535 {
            return Err(shape(
                "rms_norm",
                format!("{rows} rows exceed one dispatch"),
            ));
        }
        self.job.dispatch(
            Shader::RmsNorm,
            &[&x.buf, &weight.buf, &out.buf],
            push(&[rows as u32, cols as u32, eps.to_bits()]),
            [rows.max(1) as u32, 1, 1],
        )
    }

    /// RoPE in place on `x` `[tokens, n_heads * head_dim]` with `angles` from
    /// [`GpuContext::rope_angles`] for the same tokens.
    pub fn rope(
        &mut self,
        x: &GpuMatrix,
        angles: &GpuMatrix,
        n_heads: usize,
        style: RopeStyle,
    ) -> Result<()> {
        let (tokens, head_dim) = (angles.rows(), angles.cols());
        dense("rope", "x", x, tokens, n_heads * head_dim)?;
        dense("rope", "angles", angles, tokens, head_dim)?;
        let style = match style {
            RopeStyle::Adjacent => 0,
            RopeStyle::HalfSplit => 1,
        };
        self.job.dispatch(
            Shader::Rope,
            &[&x.buf, &angles.buf],
            push(&[tokens as u32, n_heads as u32, head_dim as u32, style]),
            stride_groups(tokens * n_heads * head_dim / 2),
        )
    }

    /// Causal GQA attention of `q` `[n_tokens, n_heads * head_dim]` over the first
    /// `shape.kv_len` rows of the caches `[capacity, n_kv_heads * head_dim]`, into `out`
    /// (shaped like `q`).
    pub fn attention(
        &mut self,
        q: &GpuMatrix,
        caches: (&GpuMatrix, &GpuMatrix),
        s: &AttentionShape,
        out: &GpuMatrix,
    ) -> Result<()> {
        self.attention_windowed(q, caches, s, 0, out)
    }

    /// [`GpuBatch::attention`] where each query sees at most its last `window` keys
    /// (itself included; a sliding-window layer), 0 meaning all of them. A window runs on
    /// the decode kernel for up to 8 tokens, else on the plain f32 kernel
    /// (`attention.comp`), never on tensor cores.
    pub fn attention_windowed(
        &mut self,
        q: &GpuMatrix,
        (k_cache, v_cache): (&GpuMatrix, &GpuMatrix),
        s: &AttentionShape,
        window: usize,
        out: &GpuMatrix,
    ) -> Result<()> {
        check_attention(q, (k_cache, v_cache), s, out)?;
        record_attention(
            &mut self.job,
            [&q.buf, &k_cache.buf, &v_cache.buf, &out.buf],
            s,
            None,
            window,
        )
    }

    /// `out = silu(gate) * up`, element-wise over same-shaped matrices.
    pub fn silu_mul(&mut self, gate: &GpuMatrix, up: &GpuMatrix, out: &GpuMatrix) -> Result<()> {
        let (rows, cols) = (gate.rows(), gate.cols());
        dense("silu_mul", "gate", gate, rows, cols)?;
        dense("silu_mul", "up", up, rows, cols)?;
        dense("silu_mul", "out", out, rows, cols)?;
        self.job.dispatch(
            Shader::SiluMul,
            &[&gate.buf, &up.buf, &out.buf],
            push(&[(rows * cols) as u32]),
            stride_groups(rows * cols),
        )
    }

    /// `x += d`, element-wise over same-shaped matrices (the residual add).
    pub fn add_assign(&mut self, x: &GpuMatrix, d: &GpuMatrix) -> Result<()> {
        let (rows, cols) = (x.rows(), x.cols());
        dense("add_assign", "x", x, rows, cols)?;
        dense("add_assign", "d", d, rows, cols)?;
        self.job.dispatch(
            Shader::Add,
            &[&x.buf, &d.buf],
            push(&[(rows * cols) as u32]),
            stride_groups(rows * cols),
        )
    }

    /// `x += d` like [`GpuBatch::add_assign`], and element `slot` of `flags` (a dense f32
    /// matrix) set to 1.0 when any sum is NaN or infinite; the flag is never cleared, so
    /// one zeroed `flags` records every checked add of a run.
    pub fn add_assign_checked(
        &mut self,
        x: &GpuMatrix,
        d: &GpuMatrix,
        flags: &GpuMatrix,
        slot: usize,
    ) -> Result<()> {
        let (rows, cols) = (x.rows(), x.cols());
        dense("add_assign_checked", "x", x, rows, cols)?;
        dense("add_assign_checked", "d", d, rows, cols)?;
        dense(
            "add_assign_checked",
            "flags",
            flags,
            flags.rows(),
            flags.cols(),
        )?;
        if slot >= flags.rows() * flags.cols() {
            return Err(shape(
                "add_assign_checked",
                format!(
                    "slot {slot} past a {}-element flags matrix",
                    flags.rows() * flags.cols()
                ),
            ));
        }
        self.job.dispatch(
            Shader::AddChecked,
            &[&x.buf, &d.buf, &flags.buf],
            push(&[(rows * cols) as u32, slot as u32]),
            stride_groups(rows * cols),
        )
    }

    /// Reads rows `rows` of `m` (an f32 matrix, padded or not) back when the batch is
    /// submitted, as dense `[rows, cols]` values; the result's index in
    /// [`BatchOutput::reads`] is the number of earlier `read` calls.
    pub fn read(&mut self, m: &GpuMatrix, rows: Range<usize>) -> Result<()> {
        let (cols, ld) = (m.cols(), m.ld());
        if m.elem() != Elem::F32 {
            return Err(shape(
                "read",
                format!("m must be an f32 matrix, got {:?}", m.elem()),
            ));
        }
        if rows.end > m.rows() || rows.start > rows.end {
            return Err(shape(
                "read",
                format!("rows {rows:?} of a {}-row matrix", m.rows()),
            ));
        }
        let (start, len) = ((rows.start * ld) as u64, (rows.len() * ld) as u64);
        if len == 0 {
            self.reads.push(Read::EMPTY);
            return Ok(());
        }
        let download = self.job.download(&m.buf.clone().slice(start..start + len));
        self.reads.push(Read {
            download,
            rows: rows.len(),
            cols,
            ld,
        });
        Ok(())
    }

    pub(crate) fn job_mut(&mut self) -> &mut Job<C> {
        &mut self.job
    }

    pub(crate) fn from_job(job: Job<C>) -> Self {
        GpuBatch {
            job,
            reads: Vec::new(),
        }
    }

    pub(crate) fn has_reads(&self) -> bool {
        !self.reads.is_empty()
    }

    pub(crate) fn into_job(self) -> Job<C> {
        self.job
    }

    /// Submits everything recorded and returns at once. It runs after every earlier
    /// submission on this context and before every later one, so a later
    /// [`GpuBatch::submit`] (or [`GpuContext::wait_idle`]) sees its results; errors of the
    /// work itself surface there. A batch with reads is refused (use `submit`).
    pub fn submit_async(self) -> Result<()> {
        self.job.submit_async()
    }

    /// Submits everything recorded, waits for it, and returns the reads and the GPU time.
    pub fn submit(self) -> Result<BatchOutput> {
        let done = self.job.finish()?;
        let reads = self
            .reads
            .iter()
            .map(|read| match done.downloads.get(read.download) {
                Some(words) => read.dense(words),
                None => Vec::new(),
            })
            .collect();
        Ok(BatchOutput {
            reads,
            gpu_ns: done.gpu_ns,
        })
    }
}
