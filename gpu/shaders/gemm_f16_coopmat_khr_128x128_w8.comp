#version 450
#extension GL_GOOGLE_include_directive : require
// Tile variant for the benchmark: 128x128, 8 subgroups of 64x32, two shared stages.
#define BM 128
#define BN 128
#define WM 2
#define WN 4
#define BKV 4
#define STAGES 2
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
