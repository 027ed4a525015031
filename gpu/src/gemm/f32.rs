//! The f32 GEMM's public forms: resident (with a chosen tile, or repeated for benchmarks)
//! and host slices.

use super::{GemmTile, HostA, Kind, check_operands, record_gemm};
use crate::buffers::{GpuMatrix, unpack_f32};
use crate::context::GpuContext;
use crate::error::Result;
use crate::job::Job;

impl GpuContext {
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
    /// (from [`GpuContext::alloc_matrix`] with [`Elem::F32`](crate::Elem::F32)). Returns the GPU time in ns
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
}
