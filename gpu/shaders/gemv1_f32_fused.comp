#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM for one row of A (gemv_fused.glsl): f32 weights and sums. A single
// sequence's decode step: accumulators of one row only, indexed by constants.
#define GEMV_ROWS 1
#include "gemv_fused.glsl"
