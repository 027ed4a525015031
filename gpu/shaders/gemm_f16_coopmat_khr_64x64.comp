#version 450
#extension GL_GOOGLE_include_directive : require
// The KHR kernel for small products (fewer than 132 tiles of 256x128): 64x64, 4 subgroups of
// 32x32, two shared stages.
#define BM 64
#define BN 64
#define WM 2
#define WN 2
#define BKV 4
#define STAGES 2
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
