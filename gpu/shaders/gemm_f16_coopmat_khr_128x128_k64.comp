#version 450
#extension GL_GOOGLE_include_directive : require
// Tile variant for the benchmark: 128x128, 4 subgroups of 64x64, 64 of k per step.
#define BM 128
#define BN 128
#define WM 2
#define WN 2
#define BKV 8
#define STAGES 1
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
