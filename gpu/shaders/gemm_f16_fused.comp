#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM with f16 weights on CUDA cores (gemm_fused_tiles.glsl): A rounded to f16,
// f32 sums; the fallback of gemm_f16_coopmat_khr_fused.comp where there are no cooperative
// matrices, and what lavapipe tests of the f16 resident path run.
#define W_F16
#include "gemm_fused_tiles.glsl"
