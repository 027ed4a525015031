#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM for few rows (gemv_fused.glsl): f32 weights and sums.
#include "gemv_fused.glsl"
