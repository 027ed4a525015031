// How the CUDA-core fused GEMMs (gemm_fused_tiles.glsl, gemv_fused.glsl) read their
// operands: W f32, or f16 with W_F16 (4 halves per uvec2); A as f32, rounded to f16 with
// f16 weights: their bindings (0 and 1) and reads. Needs the push constants declared
// first.

layout(std430, binding = 0) readonly buffer A { vec4 a[]; };
#ifdef W_F16
layout(std430, binding = 1) readonly buffer W { uvec2 w[]; };
#else
layout(std430, binding = 1) readonly buffer W { vec4 w[]; };
#endif

// W's k-vec kk of row `row`, zeros outside.
vec4 load_w(uint row, uint kk) {
    if (row >= p.N || kk >= p.K4) return vec4(0.0);
#ifdef W_F16
    uvec2 h = w[row * p.ldw4 * 2 + kk];
    return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y));
#else
    return w[row * p.ldw4 + kk];
#endif
}

#include "operand_f16.glsl"
