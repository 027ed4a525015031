//! The cooperative-matrix (tensor-core) f16 GEMM kernels: which can run here, and their
//! resident form.

use super::coop_kernel::CoopKernel;
use super::{Kind, check_operands, push};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::job::Job;
use crate::pipelines::Shader;

impl GpuContext {
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

    /// Whether `shader` is a kernel that cannot run here: a cooperative-matrix kernel the
    /// device lacks, or a variant of the one-dispatch decode layers it does not pick for
    /// one sequence with f32 weights (for [`GpuContext::prepare`], which builds every other
    /// pipeline; the batched and f16 variants are built at their first use).
    pub(crate) fn shader_unusable(&self, shader: Shader) -> bool {
        if matches!(
            shader,
            Shader::DecodeLayer
                | Shader::DecodeLayer1
                | Shader::DecodeLayerRows8
                | Shader::DecodeLayer1Rows8
                | Shader::DecodeLayerF16
                | Shader::DecodeLayer1F16
                | Shader::DecodeLayerRows8F16
                | Shader::DecodeLayer1Rows8F16
        ) {
            return self.decode_layer_kernel(1, Elem::F32).map(|(s, _, _)| s) != Some(shader);
        }
        if shader == Shader::AttentionFlashKhr {
            return !self.tensor_core_attention_available();
        }
        if shader == Shader::AttentionFlashKhrO {
            return !(self.tensor_core_attention_available() && self.info.float_atomic_add);
        }
        if shader == Shader::AttentionFlashO {
            return !self.info.float_atomic_add;
        }
        if shader == Shader::GemmF16FusedKhr {
            return !self.fused_gemm_on_tensor_cores();
        }
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
