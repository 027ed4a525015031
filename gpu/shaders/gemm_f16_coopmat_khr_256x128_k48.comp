#version 450
#extension GL_GOOGLE_include_directive : require
// The KHR kernel for products of at least 132 such tiles: 256x128, 8 subgroups of 64x64 (the
// most accumulators a subgroup holds in registers), 48 of k per step in one shared stage
// (43 KB; two stages would not fit the 48 KB NVIDIA's Vulkan gives a workgroup).
// 214-227 TFLOPS on an H100, 1% above 32 of k (docs/gpu.md).
#define BM 256
#define BN 128
#define WM 4
#define WN 2
#define BKV 6
#define STAGES 1
#include "gemm_f16_coopmat_khr.glsl"
#include "gemm_f16_coopmat.glsl"
