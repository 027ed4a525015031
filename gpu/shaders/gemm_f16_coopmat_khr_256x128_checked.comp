#version 450
#extension GL_GOOGLE_include_directive : require
// Variant for the benchmark: gemm_f16_coopmat_khr_256x128 with bounds checks on every load.
#define BM 256
#define BN 128
#define WM 4
#define WN 2
#define BKV 4
#define STAGES 1
#define CHECKED_ONLY
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
