//! The f16 (f32 accumulation) and INT8 (i32 accumulation) GEMMs' public forms: resident
//! and host slices.

use half::f16;

use super::{HostA, Kind};
use crate::buffers::{GpuMatrix, unpack_f32, unpack_i32};
use crate::context::GpuContext;
use crate::error::Result;

impl GpuContext {
    /// Resident f16 GEMM (f32 accumulation): `a` `[m, k]` and `w` `[n, k]` in
    /// [`Elem::F16`](crate::Elem::F16), `out` `[m, n]` in [`Elem::F32`](crate::Elem::F32). Returns the GPU time in ns.
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
    /// [`Elem::I8`](crate::Elem::I8), `out` `[m, n]` in [`Elem::I32`](crate::Elem::I32). Exact (wrapping like the reference).
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
}
