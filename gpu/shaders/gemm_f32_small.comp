#version 450
// The 64x64-tile f32 GEMM, for small products; the kernel is in gemm_f32.glsl.
#define H 1
#include "gemm_f32.glsl"
