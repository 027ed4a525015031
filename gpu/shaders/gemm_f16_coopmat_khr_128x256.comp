#version 450
#extension GL_GOOGLE_include_directive : require
// Tile variant: 128x256, 8 subgroups of 64x64, 32 of k per step.
#define BM 128
#define BN 256
#define WM 2
#define WN 4
#define BKV 4
#define STAGES 1
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
