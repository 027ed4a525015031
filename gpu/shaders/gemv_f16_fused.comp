#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM for few rows (gemv_fused.glsl) with f16 weights: A rounded to f16, f32
// sums.
#define W_F16
#include "gemv_fused.glsl"
