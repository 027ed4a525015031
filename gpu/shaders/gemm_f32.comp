#version 450
// The 128x128-tile f32 GEMM; the kernel is in gemm_f32.glsl.
#define H 2
#include "gemm_f32.glsl"
