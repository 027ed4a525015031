#version 450
#extension GL_GOOGLE_include_directive : require
// Tile variant: 128x128, 4 subgroups of 64x64, 32 of k per step, two shared stages.
#define BM 128
#define BN 128
#define WM 2
#define WN 2
#define BKV 4
#define STAGES 2
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
