// The fused GEMM of gemm_fused_epilogue.glsl for few rows of A (m <= GEMV_ROWS, decode):
// C[m, n] = A[m, k] · W[n, k]ᵀ with one workgroup of 64 threads per quad of 4 columns (W
// rows), the threads striding over k in vec4s, so every W row is read once, whole and
// coalesced, however small m is (the 64x64 tiles of gemm_fused_tiles.glsl give one token
// n/64 workgroups and read each weight row with one thread in 16). Partial sums meet in a
// shared-memory tree; thread 0 applies the norm's scale and the epilogue. The norm's sums
// of squares come from the same loads of A. With W_F16 defined W is f16 (4 halves per
// uvec2) and A is rounded to f16 as it is read, as in the other fused kernels.
//
// With flags bit 2 (QKV_ROPE only) row r's position comes from positions[r]: its RoPE
// rotation is row positions[r] of a table of every position, and its keys and values go
// to cache row positions[r]. A decode step recorded once then runs at any position: the
// host writes the position into that buffer before each replay.
#extension GL_EXT_control_flow_attributes : require
#ifdef GEMV_SUBGROUP_REDUCE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(std430, binding = 7) readonly buffer Positions { uint positions[]; };

#define ANGLE_ROW(row) ((p.flags & 4u) != 0u ? positions[row] : (row))
#define CACHE_ROW(row) ((p.flags & 4u) != 0u ? positions[row] : p.pos0 + (row))
#include "gemm_fused_epilogue.glsl"

// Rows of A one dispatch takes: the including kernel may fix it (1 for a single
// sequence's decode step: no accumulator array to index, so no loop over rows at all).
#ifndef GEMV_ROWS
#define GEMV_ROWS 8
#endif
// Threads of a workgroup (one quad of columns). With GEMV_SUBGROUP_REDUCE the partial sums
// meet through subgroupAdd and one barrier instead of a log2(THREADS)-deep tree, so a
// workgroup can be wide enough to load a whole row of k in one round (k = 576 is 144
// vec4s: one load per thread of 128 or 256, where 64 threads take three rounds).
#ifndef GEMV_THREADS
#define GEMV_THREADS 64
#endif
layout(local_size_x = GEMV_THREADS) in;
const uint THREADS = GEMV_THREADS;

shared vec4 red[GEMV_ROWS][THREADS];
shared float red_ss[GEMV_ROWS][THREADS];

#include "gemm_fused_operands.glsl"

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint col = gl_WorkGroupID.x * 4;
    vec4 acc[GEMV_ROWS];
    float ss[GEMV_ROWS];
    [[unroll]] for (uint m = 0; m < GEMV_ROWS; m++) {
        acc[m] = vec4(0.0);
        ss[m] = 0.0;
    }
    for (uint kk = tid; kk < p.K4; kk += THREADS) {
        vec4 w0 = load_w(col, kk);
        vec4 w1 = load_w(col + 1, kk);
        vec4 w2 = load_w(col + 2, kk);
        vec4 w3 = load_w(col + 3, kk);
        [[unroll]] for (uint m = 0; m < GEMV_ROWS; m++) {
            if (m < p.M) {
                vec4 x = a[m * p.K4 + kk];
                vec4 u = operand_a(x);
                acc[m] += vec4(dot(u, w0), dot(u, w1), dot(u, w2), dot(u, w3));
                ss[m] += dot(x, x);
            }
        }
    }
#ifdef GEMV_SUBGROUP_REDUCE
    [[unroll]] for (uint m = 0; m < GEMV_ROWS; m++) {
        vec4 sum = subgroupAdd(acc[m]);
        float sum_ss = subgroupAdd(ss[m]);
        if (subgroupElect()) {
            red[m][gl_SubgroupID] = sum;
            red_ss[m][gl_SubgroupID] = sum_ss;
        }
    }
    barrier();
    if (tid != 0) return;
    for (uint m = 0; m < p.M; m++) {
        for (uint i = 1; i < gl_NumSubgroups; i++) {
            red[m][0] += red[m][i];
            red_ss[m][0] += red_ss[m][i];
        }
    }
#else
    [[unroll]] for (uint m = 0; m < GEMV_ROWS; m++) {
        red[m][tid] = acc[m];
        red_ss[m][tid] = ss[m];
    }
    barrier();
    [[unroll]] for (uint s = THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            for (uint m = 0; m < p.M; m++) {
                red[m][tid] += red[m][tid + s];
                red_ss[m][tid] += red_ss[m][tid + s];
            }
        }
        barrier();
    }
    if (tid != 0) return;
#endif
    bool broken = false;
    for (uint m = 0; m < p.M; m++) {
        float scale = (p.flags & 1u) != 0u
            ? inversesqrt(red_ss[m][0] / float(p.kdim) + p.eps)
            : 1.0;
        broken = epilogue_quad(m, col, red[m][0] * scale) || broken;
    }
    if (broken) flags[p.slot] = 1.0;
}
