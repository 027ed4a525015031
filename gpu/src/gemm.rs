//! GEMM kernels: `out[m, n] = a[m, k] · w[n, k]ᵀ` in f32, f16 (f32 accumulation) and INT8
//! (i32 accumulation), resident (`*_device`) and host-slice forms.
//!
//! The host-slice forms split work that would exceed one storage buffer
//! (`maxStorageBufferRange`, 128 MiB on lavapipe): rows of `a` in chunks, and (for weights
//! passed as a slice) columns of the output in blocks of weight rows.

use half::f16;

use crate::buffers::{Elem, GpuMatrix, pack_f16, pack_f32, pack_i8};
use crate::context::GpuContext;
use crate::error::{GpuError, Result, shape};
use crate::job::Job;
use crate::pipelines::{PUSH_WORDS, Shader};

mod coop;
mod coop_kernel;
mod f32;
mod low_precision;

pub use coop_kernel::CoopKernel;

/// Output tile of the tiled GEMM kernels (rows and columns per workgroup).
const TILE: usize = 128;

/// Below this many 128x128 output tiles the f32 GEMM switches to 64x64 tiles: a SmolLM2
/// chunk (512 x 1536 = 48 large tiles) would leave most of a 132-SM GPU idle.
const SMALL_TILE_BELOW: usize = 264;

/// Output tile of the f32 GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GemmTile {
    /// 64x64 when the product has fewer than 264 tiles of 128x128, else 128x128.
    #[default]
    Auto,
    /// 128x128 per workgroup, 8x8 per thread: best for large products.
    Large,
    /// 64x64 per workgroup, 4x4 per thread: more workgroups for small products.
    Small,
}

/// Which GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    F32,
    F16,
    I8,
}

impl Kind {
    fn elem(self) -> Elem {
        match self {
            Kind::F32 => Elem::F32,
            Kind::F16 => Elem::F16,
            Kind::I8 => Elem::I8,
        }
    }
    fn out_elem(self) -> Elem {
        match self {
            Kind::I8 => Elem::I32,
            _ => Elem::F32,
        }
    }
    fn shader(self) -> Shader {
        match self {
            Kind::F32 => Shader::GemmF32,
            Kind::F16 => Shader::GemmF16,
            Kind::I8 => Shader::GemmI8,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Kind::F32 => "matmul_f32",
            Kind::F16 => "matmul_f16",
            Kind::I8 => "gemm_i8",
        }
    }
    fn pack(self, host: HostA<'_>, rows: usize, cols: usize) -> Vec<u32> {
        match host {
            HostA::F32(a) => pack_f32(a, rows, cols),
            HostA::F16(a) => pack_f16(a, rows, cols),
            HostA::I8(a) => pack_i8(a, rows, cols),
        }
    }
}

/// Host activations of one of the GEMM element types.
#[derive(Clone, Copy)]
enum HostA<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    I8(&'a [i8]),
}

impl HostA<'_> {
    fn len(&self) -> usize {
        match self {
            HostA::F32(a) => a.len(),
            HostA::F16(a) => a.len(),
            HostA::I8(a) => a.len(),
        }
    }
    fn rows(&self, start: usize, end: usize, k: usize) -> Self {
        match self {
            HostA::F32(a) => HostA::F32(&a[start * k..end * k]),
            HostA::F16(a) => HostA::F16(&a[start * k..end * k]),
            HostA::I8(a) => HostA::I8(&a[start * k..end * k]),
        }
    }
}

/// Operand checks of the resident f32 GEMM, for [`crate::GpuBatch::matmul_f32`].
pub(crate) fn check_f32_operands(a: &GpuMatrix, w: &GpuMatrix, out: &GpuMatrix) -> Result<()> {
    check_operands(Kind::F32, a, w, out)
}

fn check_operands(kind: Kind, a: &GpuMatrix, w: &GpuMatrix, out: &GpuMatrix) -> Result<()> {
    let op = kind.name();
    if a.elem() != kind.elem() || w.elem() != kind.elem() || out.elem() != kind.out_elem() {
        return Err(shape(
            op,
            format!(
                "element types a {:?}, w {:?}, out {:?}; expected {:?}, {:?}, {:?}",
                a.elem(),
                w.elem(),
                out.elem(),
                kind.elem(),
                kind.elem(),
                kind.out_elem()
            ),
        ));
    }
    if a.cols() != w.cols() {
        return Err(shape(
            op,
            format!(
                "a is [{}, {}] but w is [{}, {}]: k differs",
                a.rows(),
                a.cols(),
                w.rows(),
                w.cols()
            ),
        ));
    }
    if out.rows() != a.rows() || out.cols() != w.rows() {
        return Err(shape(
            op,
            format!(
                "out is [{}, {}], expected [{}, {}]",
                out.rows(),
                out.cols(),
                a.rows(),
                w.rows()
            ),
        ));
    }
    Ok(())
}

fn push(a: &GpuMatrix, w: &GpuMatrix, out: &GpuMatrix) -> [u32; PUSH_WORDS] {
    let mut p = [0u32; PUSH_WORDS];
    p[0] = a.rows() as u32;
    p[1] = w.rows() as u32;
    p[2] = (a.ld_words() / 4) as u32;
    p[3] = (a.ld_words() / 4) as u32;
    p[4] = (w.ld_words() / 4) as u32;
    p[5] = (out.ld_words() / 4) as u32;
    p
}

fn groups(m: usize, n: usize) -> [u32; 3] {
    [n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1]
}

/// Records one f32 GEMM dispatch into `job` (operands already checked).
pub(crate) fn record_f32_gemm(
    job: &mut Job<impl AsRef<GpuContext>>,
    tile: GemmTile,
    operands: (&GpuMatrix, &GpuMatrix, &GpuMatrix),
) -> Result<()> {
    record_gemm(job, Kind::F32, tile, operands)
}

/// Records one GEMM dispatch, choosing the f32 tile size.
fn record_gemm(
    job: &mut Job<impl AsRef<GpuContext>>,
    kind: Kind,
    tile: GemmTile,
    (a, w, out): (&GpuMatrix, &GpuMatrix, &GpuMatrix),
) -> Result<()> {
    let (m, n) = (a.rows(), w.rows());
    let small = match tile {
        GemmTile::Auto => m.div_ceil(TILE) * n.div_ceil(TILE) < SMALL_TILE_BELOW,
        GemmTile::Large => false,
        GemmTile::Small => true,
    };
    if kind == Kind::F32 && small {
        return record_f32_small(job, (a, w, out));
    }
    job.dispatch(
        kind.shader(),
        &[&a.buf, &w.buf, &out.buf],
        push(a, w, out),
        groups(m, n),
    )
}

/// Workgroups the 64x64 f32 kernel aims for: two per SM of a 132-SM GPU.
const SPLIT_K_TARGET: usize = 264;

/// Fewest k steps (of 16) one split-K slice sums.
const SPLIT_K_MIN_STEPS: usize = 4;

/// Split-K factor for an `m x n` product over `k_steps` steps of 16: enough slices of k
/// that the 64x64 tiles times the slices reach [`SPLIT_K_TARGET`] workgroups, each slice
/// at least [`SPLIT_K_MIN_STEPS`] deep. SmolLM2's 512 x 576 x 576 has 72 tiles: 4 slices.
fn split_k(m: usize, n: usize, k_steps: usize) -> usize {
    let tiles = m.div_ceil(TILE / 2) * n.div_ceil(TILE / 2);
    if tiles >= SPLIT_K_TARGET {
        return 1;
    }
    SPLIT_K_TARGET
        .div_ceil(tiles)
        .min(k_steps / SPLIT_K_MIN_STEPS)
        .max(1)
}

/// The 64x64-tile f32 GEMM, with split-K when the product has too few tiles to fill the
/// GPU: each slice of k writes its own partial product into the context's scratch
/// buffer, and a second kernel adds them into `out`.
fn record_f32_small(
    job: &mut Job<impl AsRef<GpuContext>>,
    (a, w, out): (&GpuMatrix, &GpuMatrix, &GpuMatrix),
) -> Result<()> {
    let (m, n) = (a.rows(), w.rows());
    let t = TILE / 2;
    let k_steps = (a.ld_words() / 4).div_ceil(4);
    let mut splits = split_k(m, n, k_steps);
    let per = k_steps.div_ceil(splits.max(1)).max(1);
    splits = k_steps.div_ceil(per).max(1);
    let len = m * out.ld_words();
    let scratch_bytes = (splits * len * 4) as u64;
    if splits == 1 || scratch_bytes > job.ctx().info.max_storage_buffer_range {
        return job.dispatch(
            Shader::GemmF32Small,
            &[&a.buf, &w.buf, &out.buf],
            push(a, w, out),
            [n.div_ceil(t) as u32, m.div_ceil(t) as u32, 1],
        );
    }
    let scratch = job.ctx().split_k_scratch((splits * len) as u64)?;
    let mut p = push(a, w, out);
    p[6] = per as u32;
    job.dispatch(
        Shader::GemmF32Small,
        &[&a.buf, &w.buf, &scratch],
        p,
        [n.div_ceil(t) as u32, m.div_ceil(t) as u32, splits as u32],
    )?;
    let mut p = [0u32; PUSH_WORDS];
    p[0] = len as u32;
    p[1] = splits as u32;
    job.dispatch(
        Shader::GemmReduce,
        &[&scratch, &out.buf],
        p,
        crate::job::stride_groups(len),
    )
}

impl GpuContext {
    fn gemm_device(
        &self,
        kind: Kind,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        check_operands(kind, a, w, out)?;
        let mut job = Job::new(self)?;
        for _ in 0..repeat.max(1) {
            record_gemm(&mut job, kind, GemmTile::Auto, (a, w, out))?;
        }
        Ok(job.finish()?.gpu_ns)
    }

    /// Host activations against resident weights; rows of `a` are split into chunks that fit
    /// one storage buffer. Returns the raw words of `[m, n]` in the output element type.
    fn gemm_host_a(&self, kind: Kind, a: HostA<'_>, m: usize, w: &GpuMatrix) -> Result<Vec<u32>> {
        let op = kind.name();
        if w.elem() != kind.elem() {
            return Err(shape(
                op,
                format!("weights hold {:?}, expected {:?}", w.elem(), kind.elem()),
            ));
        }
        let (k, n) = (w.cols(), w.rows());
        if a.len() != m * k {
            return Err(shape(
                op,
                format!("a has {} elements, [{m}, {k}] needs {}", a.len(), m * k),
            ));
        }
        let out_elem = kind.out_elem();
        let limit = self.info.max_storage_buffer_range as usize;
        let a_row_bytes = kind.elem().ld(k) / kind.elem().per_word() * 4;
        let c_row_bytes = out_elem.ld(n) * 4;
        let rows_per_chunk = (limit / a_row_bytes.max(1)).min(limit / c_row_bytes.max(1));
        if rows_per_chunk == 0 && m > 0 {
            return Err(GpuError::BufferTooLarge {
                what: format!("one row of {op}"),
                bytes: a_row_bytes.max(c_row_bytes) as u64,
                limit: limit as u64,
            });
        }
        let c_ld_words = out_elem.ld(n);
        let mut words = Vec::with_capacity(m * c_ld_words);
        let mut total_ns: Option<u64> = Some(0);
        let mut start = 0;
        while start < m {
            let end = (start + rows_per_chunk).min(m);
            let rows = end - start;
            let mut job = Job::new(self)?;
            let a_buf = job.upload(&kind.pack(a.rows(start, end, k), rows, k), "activations a")?;
            let a_mat = GpuContext::matrix_from(a_buf, rows, k, kind.elem());
            let c_buf = self.alloc_words((rows * c_ld_words) as u64, "output")?;
            let c_mat = GpuContext::matrix_from(c_buf, rows, n, out_elem);
            record_gemm(&mut job, kind, GemmTile::Auto, (&a_mat, w, &c_mat))?;
            let i = job.download(&c_mat.buf);
            let mut done = job.finish()?;
            total_ns = total_ns.zip(done.gpu_ns).map(|(t, g)| t + g);
            words.extend_from_slice(&done.downloads.swap_remove(i)[..rows * c_ld_words]);
            start = end;
        }
        self.set_last_gpu_time(total_ns);
        Ok(words)
    }

    /// Weights as a host slice: uploaded in blocks of rows that fit one storage buffer, each
    /// block computing a block of output columns. Returns dense `[m, n]` via `unpack`.
    fn gemm_host<T: Copy + Default>(
        &self,
        kind: Kind,
        (a, w): (HostA<'_>, HostA<'_>),
        (m, k, n): (usize, usize, usize),
        unpack: fn(&[u32], usize, usize) -> Vec<T>,
    ) -> Result<Vec<T>> {
        let op = kind.name();
        if w.len() != n * k {
            return Err(shape(
                op,
                format!("w has {} elements, [{n}, {k}] needs {}", w.len(), n * k),
            ));
        }
        if a.len() != m * k {
            return Err(shape(
                op,
                format!("a has {} elements, [{m}, {k}] needs {}", a.len(), m * k),
            ));
        }
        let limit = self.info.max_storage_buffer_range as usize;
        let w_row_bytes = kind.elem().ld(k) / kind.elem().per_word() * 4;
        let w_rows_per_block = (limit / w_row_bytes.max(1)).max(1).min(n.max(1));
        let mut out = vec![T::default(); m * n];
        let mut total_ns: Option<u64> = Some(0);
        let mut j0 = 0;
        while j0 < n || (n == 0 && j0 == 0) {
            let j1 = (j0 + w_rows_per_block).min(n);
            let nb = j1 - j0;
            let w_block = w.rows(j0, j1, k);
            let w_mat = self.upload_packed(kind, w_block, nb, k)?;
            let words = self.gemm_host_a(kind, a, m, &w_mat)?;
            total_ns = total_ns.zip(self.last_gpu_time_ns()).map(|(t, g)| t + g);
            let block = unpack(&words, m, nb);
            for i in 0..m {
                out[i * n + j0..i * n + j1].copy_from_slice(&block[i * nb..(i + 1) * nb]);
            }
            if n == 0 {
                break;
            }
            j0 = j1;
        }
        self.set_last_gpu_time(total_ns);
        Ok(out)
    }

    fn upload_packed(&self, kind: Kind, w: HostA<'_>, n: usize, k: usize) -> Result<GpuMatrix> {
        match (kind, w) {
            (_, HostA::F32(w)) => self.upload_f32(w, n, k),
            (_, HostA::F16(w)) => self.upload_f16(w, n, k),
            (_, HostA::I8(w)) => self.upload_i8(w, n, k),
        }
    }
}
