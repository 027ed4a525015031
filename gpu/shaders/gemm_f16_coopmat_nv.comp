#version 450
#extension GL_GOOGLE_include_directive : require
// f16 GEMM on VK_NV_cooperative_matrix: 128x128 tiles, 4 subgroups of 64x64, 32 of k per step.
#define BM 128
#define BN 128
#define WM 2
#define WN 2
#define BKV 4
#define STAGES 1
#include "gemm_f16_coopmat_nv.glsl"
#include "gemm_f16_coopmat.glsl"
