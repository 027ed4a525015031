#version 450
#extension GL_GOOGLE_include_directive : require
// f16 GEMM on VK_NV_cooperative_matrix (builds with Debian's glslc): the KHR kernel's best
// tiling, 256x128, 8 subgroups of 64x64, 32 of k per step.
#define BM 256
#define BN 128
#define WM 4
#define WN 2
#define BKV 4
#define STAGES 1
#include "gemm_f16_coopmat_nv.glsl"
#include "gemm_f16_coopmat.glsl"
