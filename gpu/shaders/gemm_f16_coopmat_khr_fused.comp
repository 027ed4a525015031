#version 450
#extension GL_GOOGLE_include_directive : require
// The fused GEMM of a decoder layer on tensor cores (VK_KHR_cooperative_matrix): f32 A
// rounded to f16 as it is staged, f16 W [n, k] (8 halves per uvec4), f32 sums, and the
// norm prologue and epilogues of gemm_fused_epilogue.glsl. The tiling is that of
// gemm_f16_coopmat_khr_64x64.comp (64x64 tiles, 4 subgroups of 32x32, 32 of k per step,
// two shared stages, the next step's loads in flight in registers); the accumulators go
// through shared memory once at the end so that every thread applies the epilogue to
// whole quads of columns it knows the coordinates of (a cooperative matrix hides which
// lane holds which element). Grid: x over 64-column tiles of W, y over 64-row tiles of A.
#include "gemm_f16_coopmat_khr.glsl"
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer A { vec4 a[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w[]; };

#include "gemm_fused_epilogue.glsl"

const uint BM = 64;
const uint BN = 64;
const uint BKV = 4;           // k per step in uvec4 (32 halves)
const uint SROW = BKV + 1;    // shared row stride in uvec4 (one of padding)
const uint STAGE = BM * SROW; // one stage of As (and of Ws: BN = BM)
const uint CROW = BN / 4 + 1; // row stride of the output tile in vec4
const uint LOADS = 2;         // uvec4 of A and of W per thread and step: rows t/4, t/4 + 32

shared uvec4 As[2 * STAGE];
shared uvec4 Ws[2 * STAGE];
shared vec4 Ct[BM * CROW];
shared float sq[128 * LOADS];
shared float rstd[BM];

uvec4 ra[LOADS];
uvec4 rw[LOADS];
float ss[LOADS];

// A's f32 vec4 `v` of row `row`, zeros outside.
vec4 load_a(uint row, uint v) {
    return (row < p.M && v < p.K4) ? a[row * p.K4 + v] : vec4(0.0);
}

// Step s's uvec4 of A (as f16, squares summed in f32) and of W into registers.
void fetch(uint s, uint m0, uint n0) {
    uint t = gl_LocalInvocationID.x;
    uint kk = s * BKV + t % 4;
    uint k8 = (p.K4 + 1) / 2; // A's padded k in uvec4 of halves
    [[unroll]] for (uint r = 0; r < LOADS; r++) {
        uint row = m0 + t / 4 + 32 * r;
        vec4 v0 = load_a(row, 2 * kk);
        vec4 v1 = load_a(row, 2 * kk + 1);
        ss[r] += dot(v0, v0) + dot(v1, v1);
        ra[r] = uvec4(packHalf2x16(v0.xy), packHalf2x16(v0.zw), packHalf2x16(v1.xy),
                      packHalf2x16(v1.zw));
        uint col = n0 + t / 4 + 32 * r;
        rw[r] = (col < p.N && kk < k8) ? w[col * p.ldw4 + kk] : uvec4(0);
    }
}

void stash(uint stage) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint r = 0; r < LOADS; r++) {
        uint at = stage * STAGE + (t / 4 + 32 * r) * SROW + t % 4;
        As[at] = ra[r];
        Ws[at] = rw[r];
    }
}

FRAG_C acc[2][2];

// One step's multiply-adds: each subgroup's 32x32 of the tile, 16 of k at a time.
void multiply(uint stage, uint wm, uint wn) {
    [[unroll]] for (uint kk = 0; kk < BKV; kk += 2) {
        FRAG_A fa[2];
        [[unroll]] for (uint i = 0; i < 2; i++)
            LOAD_A(fa[i], As, stage * STAGE + (wm * 32 + i * 16) * SROW + kk, SROW);
        [[unroll]] for (uint j = 0; j < 2; j++) {
            FRAG_B fb;
            LOAD_B(fb, Ws, stage * STAGE + (wn * 32 + j * 16) * SROW + kk, SROW);
            [[unroll]] for (uint i = 0; i < 2; i++)
                acc[i][j] = MMA(fa[i], fb, acc[i][j]);
        }
    }
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;
    uint sg = gl_SubgroupID;
    uint wm = sg / 2;
    uint wn = sg % 2;
    [[unroll]] for (uint i = 0; i < 2; i++)
        [[unroll]] for (uint j = 0; j < 2; j++)
            acc[i][j] = FRAG_C(0.0);
    [[unroll]] for (uint r = 0; r < LOADS; r++) ss[r] = 0.0;

    uint steps = ((p.K4 + 1) / 2 + BKV - 1) / BKV;
    fetch(0, m0, n0);
    stash(0);
    barrier();
    for (uint s = 0; s < steps; s++) {
        if (s + 1 < steps) fetch(s + 1, m0, n0);
        multiply(s & 1, wm, wn);
        // The other stage was last read in step s - 1, which every subgroup finished
        // before the barrier that ended it.
        if (s + 1 < steps) stash((s + 1) & 1);
        barrier();
    }

    [[unroll]] for (uint i = 0; i < 2; i++)
        [[unroll]] for (uint j = 0; j < 2; j++)
            STORE_C(acc[i][j], Ct, (wm * 32 + i * 16) * CROW + (wn * 32 + j * 16) / 4, CROW);
    bool norm = (p.flags & 1u) != 0u;
    [[unroll]] for (uint r = 0; r < LOADS; r++) sq[t * LOADS + r] = ss[r];
    barrier();
    // Row lr's squares: threads 4 (lr % 32) .. + 3, load lr / 32.
    if (t < BM) {
        uint base = (t % 32) * 4 * LOADS + t / 32;
        float sum = sq[base] + sq[base + LOADS] + sq[base + 2 * LOADS] + sq[base + 3 * LOADS];
        rstd[t] = norm ? 1.0 / sqrt(sum / float(p.kdim) + p.eps) : 1.0;
    }
    barrier();

    bool broken = false;
    uint q = t % 16; // this thread's quad of columns
    [[unroll]] for (uint i = 0; i < BM / 8; i++) {
        uint lrow = t / 16 + 8 * i;
        vec4 v = Ct[lrow * CROW + q] * rstd[lrow];
        broken = epilogue_quad(m0 + lrow, n0 + 4 * q, v) || broken;
    }
    if (broken) flags[p.slot] = 1.0;
}
