#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM for one row of A (gemv_fused.glsl), f32 weights: 128 threads a quad of
// columns, their sums met through subgroupAdd (devices with subgroup arithmetic).
#define GEMV_ROWS 1
#define GEMV_THREADS 128
#define GEMV_SUBGROUP_REDUCE
#include "gemv_fused.glsl"
