//! GEMM kernels: `out[m, n] = a[m, k] · w[n, k]ᵀ` in f32, f16 (f32 accumulation) and INT8
//! (i32 accumulation), resident (`*_device`) and host-slice forms.
//!
//! The host-slice forms split work that would exceed one storage buffer
//! (`maxStorageBufferRange`, 128 MiB on lavapipe): rows of `a` in chunks, and (for weights
//! passed as a slice) columns of the output in blocks of weight rows.

use half::f16;

use crate::buffers::{Elem, GpuMatrix, pack_f16, pack_f32, pack_i8, unpack_f32, unpack_i32};
use crate::context::GpuContext;
use crate::error::{GpuError, Result, shape};
use crate::job::Job;
use crate::pipelines::{PUSH_WORDS, Shader};

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

/// Below this many 256x128 output tiles (one per SM of a 132-SM GPU) [`CoopKernel::Khr`]
/// takes 64x64 tiles: a SmolLM2 chunk (512 x 1536 = 24 large tiles) would leave most SMs idle.
const COOP_SMALL_TILE_BELOW: usize = 132;

/// A cooperative-matrix (tensor-core) f16 GEMM kernel: which Vulkan extension, which
/// workgroup tile. All share `gemm_f16_coopmat.glsl`: subgroups of 32 each own a grid of
/// 16x16x16 f16 fragments with f32 accumulators; the `Khr*` kernels need a glslang 13 at
/// build time (see build.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CoopKernel {
    /// `VK_NV_cooperative_matrix` (Debian's glslc builds it), 256x128 tiles.
    Nv,
    /// `VK_KHR_cooperative_matrix`: 256x128 tiles 48 deep in k, or 64x64 below 132 of them.
    #[default]
    Khr,
    /// KHR, 128x128 tiles, 4 subgroups of 64x64, two shared stages.
    Khr128x128,
    /// KHR, 128x256 tiles, 8 subgroups of 64x64.
    Khr128x256,
    /// KHR, 256x128 tiles, 8 subgroups of 64x64.
    Khr256x128,
    /// KHR, 64x64 tiles, 4 subgroups of 32x32, two shared stages.
    Khr64x64,
    /// KHR, 256x128 tiles, 48 of k per step (what `Khr` runs on large products).
    Khr256x128K48,
}

impl CoopKernel {
    /// Every kernel, in the order benchmarks list them.
    pub const ALL: &'static [CoopKernel] = &[
        CoopKernel::Nv,
        CoopKernel::Khr,
        CoopKernel::Khr128x128,
        CoopKernel::Khr128x256,
        CoopKernel::Khr256x128,
        CoopKernel::Khr64x64,
        CoopKernel::Khr256x128K48,
    ];

    /// The fixed-tile kernel that runs an `m x n` product.
    fn resolve(self, m: usize, n: usize) -> CoopKernel {
        match self {
            CoopKernel::Khr if m.div_ceil(256) * n.div_ceil(128) < COOP_SMALL_TILE_BELOW => {
                CoopKernel::Khr64x64
            }
            CoopKernel::Khr => CoopKernel::Khr256x128K48,
            fixed => fixed,
        }
    }

    /// The shader of a fixed-tile kernel ([`CoopKernel::Khr`]: its large one; the KHR
    /// shaders are built or left out together).
    fn shader(self) -> Shader {
        match self {
            CoopKernel::Nv => Shader::GemmF16CoopNv,
            CoopKernel::Khr256x128 => Shader::GemmF16CoopKhr256x128,
            CoopKernel::Khr128x128 => Shader::GemmF16CoopKhr128x128,
            CoopKernel::Khr128x256 => Shader::GemmF16CoopKhr128x256,
            CoopKernel::Khr64x64 => Shader::GemmF16CoopKhr64x64,
            CoopKernel::Khr | CoopKernel::Khr256x128K48 => Shader::GemmF16CoopKhr256x128K48,
        }
    }

    /// Whether build.rs compiled this kernel's shader.
    pub(crate) fn built(self) -> bool {
        self.shader().compiled()
    }

    /// Rows and columns of the output one workgroup of a fixed-tile kernel computes (the
    /// shader's BM and BN).
    fn tile(self) -> (usize, usize) {
        match self {
            CoopKernel::Khr128x128 => (128, 128),
            CoopKernel::Khr128x256 => (128, 256),
            CoopKernel::Khr64x64 => (64, 64),
            _ => (256, 128),
        }
    }

    /// A short name for errors and benchmark tables.
    pub fn name(self) -> &'static str {
        match self {
            CoopKernel::Nv => "f16-coopmat-nv",
            CoopKernel::Khr => "f16-coopmat-khr",
            CoopKernel::Khr128x128 => "f16-coopmat-khr-128x128",
            CoopKernel::Khr128x256 => "f16-coopmat-khr-128x256",
            CoopKernel::Khr256x128 => "f16-coopmat-khr-256x128",
            CoopKernel::Khr64x64 => "f16-coopmat-khr-64x64",
            CoopKernel::Khr256x128K48 => "f16-coopmat-khr-256x128-k48",
        }
    }
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

    /// Resident f32 GEMM with a chosen tile size, `repeat` times in one submission; returns
    /// the GPU time of all of them. For tests and benchmarks of each variant.
    pub fn matmul_f32_device_with(
        &self,
        (a, w, out): (&GpuMatrix, &GpuMatrix, &GpuMatrix),
        tile: GemmTile,
        repeat: usize,
    ) -> Result<Option<u64>> {
        check_operands(Kind::F32, a, w, out)?;
        let mut job = Job::new(self)?;
        for _ in 0..repeat.max(1) {
            record_gemm(&mut job, Kind::F32, tile, (a, w, out))?;
        }
        Ok(job.finish()?.gpu_ns)
    }

    /// Resident f32 GEMM: `out = a · wᵀ` with `a` `[m, k]`, `w` `[n, k]`, `out` `[m, n]`
    /// (from [`GpuContext::alloc_matrix`] with [`Elem::F32`]). Returns the GPU time in ns
    /// when the device has timestamps.
    pub fn matmul_f32_device(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::F32, a, w, out, 1)
    }

    /// Runs the resident f32 GEMM `repeat` times in one submission and returns the GPU time
    /// of all of them: what benchmarks use to amortise launch overhead.
    pub fn matmul_f32_device_repeat(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::F32, a, w, out, repeat)
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

    /// f32 GEMM of host slices: `a` `[m, k]`, `w` `[n, k]` (one row per output feature) ->
    /// `[m, n]`, like `hetsched_kernels::reference::matmul_f32`. Large operands are split.
    pub fn matmul_f32(
        &self,
        a: &[f32],
        m: usize,
        k: usize,
        w: &[f32],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.gemm_host(
            Kind::F32,
            (HostA::F32(a), HostA::F32(w)),
            (m, k, n),
            unpack_f32,
        )
    }

    /// f32 GEMM of host activations `a` `[m, k]` against resident weights `w` `[n, k]`.
    pub fn matmul_f32_resident(&self, a: &[f32], m: usize, w: &GpuMatrix) -> Result<Vec<f32>> {
        let words = self.gemm_host_a(Kind::F32, HostA::F32(a), m, w)?;
        Ok(unpack_f32(&words, m, w.rows()))
    }

    /// Resident f16 GEMM (f32 accumulation): `a` `[m, k]` and `w` `[n, k]` in
    /// [`Elem::F16`], `out` `[m, n]` in [`Elem::F32`]. Returns the GPU time in ns.
    pub fn matmul_f16_device(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::F16, a, w, out, 1)
    }

    /// [`GpuContext::matmul_f16_device`] `repeat` times in one submission (for benchmarks).
    pub fn matmul_f16_device_repeat(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::F16, a, w, out, repeat)
    }

    /// f16 GEMM of host slices with f32 accumulation: `a` `[m, k]`, `w` `[n, k]` -> f32
    /// `[m, n]`; equals `reference::matmul_f32` on the widened inputs up to f32 rounding.
    pub fn matmul_f16(
        &self,
        a: &[f16],
        m: usize,
        k: usize,
        w: &[f16],
        n: usize,
    ) -> Result<Vec<f32>> {
        self.gemm_host(
            Kind::F16,
            (HostA::F16(a), HostA::F16(w)),
            (m, k, n),
            unpack_f32,
        )
    }

    /// f16 GEMM of host activations against resident f16 weights.
    pub fn matmul_f16_resident(&self, a: &[f16], m: usize, w: &GpuMatrix) -> Result<Vec<f32>> {
        let words = self.gemm_host_a(Kind::F16, HostA::F16(a), m, w)?;
        Ok(unpack_f32(&words, m, w.rows()))
    }

    /// Resident INT8 GEMM with i32 accumulation: `a` `[m, k]` and `w` `[n, k]` in
    /// [`Elem::I8`], `out` `[m, n]` in [`Elem::I32`]. Exact (wrapping like the reference).
    pub fn gemm_i8_device(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::I8, a, w, out, 1)
    }

    /// [`GpuContext::gemm_i8_device`] `repeat` times in one submission (for benchmarks).
    pub fn gemm_i8_device_repeat(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.gemm_device(Kind::I8, a, w, out, repeat)
    }

    /// INT8 GEMM of host slices, like `reference::gemm_i8_reference`: `a` `[m, k]`, `w`
    /// `[n, k]` -> i32 `[m, n]`, exact.
    pub fn gemm_i8(&self, a: &[i8], m: usize, k: usize, w: &[i8], n: usize) -> Result<Vec<i32>> {
        self.gemm_host(
            Kind::I8,
            (HostA::I8(a), HostA::I8(w)),
            (m, k, n),
            unpack_i32,
        )
    }

    /// INT8 GEMM of host activations against resident i8 weights.
    pub fn gemm_i8_resident(&self, a: &[i8], m: usize, w: &GpuMatrix) -> Result<Vec<i32>> {
        let words = self.gemm_host_a(Kind::I8, HostA::I8(a), m, w)?;
        Ok(unpack_i32(&words, m, w.rows()))
    }

    /// Whether [`GpuContext::matmul_f16_coop_device`] (the NV kernel) can run here.
    pub fn has_coop_matrix_f16(&self) -> bool {
        self.check_coop(CoopKernel::Nv).is_ok()
    }

    /// Whether [`GpuContext::matmul_f16_coop_khr_device`] can run here: this build has the
    /// KHR kernels and the device offers `VK_KHR_cooperative_matrix` with 16x16x16 f16
    /// matrices.
    pub fn has_coop_matrix_khr_f16(&self) -> bool {
        self.check_coop(CoopKernel::Khr).is_ok()
    }

    /// `Ok` when `kernel` can run on this device and build, else why not:
    /// [`GpuError::NotBuilt`] (its shader compiler was missing at build time) or
    /// [`GpuError::Unsupported`] (the device lacks the extension, 16x16x16 f16 matrices,
    /// `shaderFloat16` or 32-wide subgroups, which the subgroup grid assumes).
    pub fn check_coop(&self, kernel: CoopKernel) -> Result<()> {
        let info = &self.info;
        let (offered, feature) = if kernel == CoopKernel::Nv {
            (
                info.coop_matrix_nv,
                "VK_NV_cooperative_matrix with shaderFloat16 and 32-wide subgroups",
            )
        } else {
            (
                info.coop_matrix_khr && info.coop_matrix_khr_f16_shapes.contains(&[16, 16, 16]),
                "VK_KHR_cooperative_matrix with 16x16x16 f16 -> f32 subgroup matrices, \
                 shaderFloat16 and 32-wide subgroups",
            )
        };
        if !kernel.built() {
            return Err(GpuError::NotBuilt {
                kernel: kernel.name(),
                reason: crate::pipelines::NOT_BUILT_REASON,
            });
        }
        if !(offered && info.shader_f16 && info.subgroup_size == Some(32)) {
            return Err(GpuError::Unsupported {
                kernel: kernel.name(),
                feature,
            });
        }
        Ok(())
    }

    /// Whether `shader` is a cooperative-matrix kernel that cannot run here (for
    /// [`GpuContext::prepare`], which builds every other pipeline).
    pub(crate) fn coop_shader_unusable(&self, shader: Shader) -> bool {
        CoopKernel::ALL
            .iter()
            .any(|k| k.shader() == shader && self.check_coop(*k).is_err())
    }

    /// Resident f16 GEMM on tensor cores through `VK_NV_cooperative_matrix` (16x16x16 f16
    /// fragments, f32 accumulation), same operands as [`GpuContext::matmul_f16_device`],
    /// `repeat` times in one submission; returns the GPU time of all of them.
    /// [`GpuError::Unsupported`] where the extension is missing.
    pub fn matmul_f16_coop_device(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.matmul_f16_coop_device_with((a, w, out), CoopKernel::Nv, repeat)
    }

    /// [`GpuContext::matmul_f16_coop_device`] through `VK_KHR_cooperative_matrix`, with the
    /// tile chosen by size ([`CoopKernel::Khr`]).
    pub fn matmul_f16_coop_khr_device(
        &self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.matmul_f16_coop_device_with((a, w, out), CoopKernel::Khr, repeat)
    }

    /// A chosen cooperative-matrix kernel (for tests and benchmarks of each variant): any
    /// `m`, `n` and `k`.
    pub fn matmul_f16_coop_device_with(
        &self,
        (a, w, out): (&GpuMatrix, &GpuMatrix, &GpuMatrix),
        kernel: CoopKernel,
        repeat: usize,
    ) -> Result<Option<u64>> {
        self.check_coop(kernel)?;
        check_operands(Kind::F16, a, w, out)?;
        let kernel = kernel.resolve(a.rows(), w.rows());
        let (bm, bn) = kernel.tile();
        let tiles = a.rows().div_ceil(bm) * w.rows().div_ceil(bn);
        // One workgroup per tile along a 1-D index (the kernel orders tiles for L2 reuse),
        // wrapped into y past the x limit.
        let max_x = self.info.max_workgroup_count[0] as usize;
        let groups_x = tiles.clamp(1, max_x);
        let mut p = push(a, w, out);
        p[5] = out.ld_words() as u32;
        p[6] = groups_x as u32;
        let mut job = Job::new(self)?;
        for _ in 0..repeat.max(1) {
            job.dispatch(
                kernel.shader(),
                &[&a.buf, &w.buf, &out.buf],
                p,
                [groups_x as u32, tiles.div_ceil(groups_x).max(1) as u32, 1],
            )?;
        }
        Ok(job.finish()?.gpu_ns)
    }
}
