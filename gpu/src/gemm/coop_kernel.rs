//! Which cooperative-matrix (tensor-core) f16 GEMM kernels there are: their shaders,
//! tiles and names, and whether this build compiled each. Apart from their resident form
//! (`coop.rs`) because the device's context asks whether the KHR kernels were built, and
//! the resident form records jobs on that context.

use crate::pipelines::Shader;

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
    pub(super) fn resolve(self, m: usize, n: usize) -> CoopKernel {
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
    pub(super) fn shader(self) -> Shader {
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
    pub(super) fn tile(self) -> (usize, usize) {
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
