#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM for one row of A (gemv_fused.glsl) with f16 weights: A rounded to f16,
// f32 sums. A single sequence's decode step.
#define W_F16
#define GEMV_ROWS 1
#include "gemv_fused.glsl"
