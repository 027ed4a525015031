#version 450
#extension GL_GOOGLE_include_directive : require
// The fused f32 GEMM of a decoder layer (gemm_fused_tiles.glsl): f32 weights and sums.
#include "gemm_fused_tiles.glsl"
