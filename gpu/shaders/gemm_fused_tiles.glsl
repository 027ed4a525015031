// The 64x64-tile GEMM of gemm_f32.glsl on CUDA cores (C[m, n] = A[m, k] · W[n, k]ᵀ, 16x16
// threads, 4 rows x 4 columns each, k staged 16 deep with the next slice's loads in
// flight) with what a decoder layer chains around its GEMMs folded in
// (gemm_fused_epilogue.glsl), so that a layer is 4 GEMM dispatches and one attention
// instead of about 15 dispatches and 2 copies. With W_F16 defined, W is f16 (4 halves per
// uvec2) and A's elements are rounded to f16 as they are staged: the arithmetic of the
// tensor-core kernel (gemm_f16_coopmat_khr_fused.comp, f16 inputs, f32 sums), for devices
// without cooperative matrices (lavapipe in CI). The norm's sums of squares use A as
// stored (f32) in both.
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 16, local_size_y = 16) in;


#include "gemm_fused_epilogue.glsl"

const uint BM = 64;
const uint BN = 64;
const uint BK4 = 4; // 16 floats of k per step

shared vec4 As[BK4 * 4][BM / 4 + 1];
shared vec4 Ws[BK4 * 4][BN / 4 + 1];
shared float sq[256];
shared float rstd[BM];

#include "gemm_fused_operands.glsl"

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;
    uint lr = tid / 4;
    uint lk = tid % 4;

    vec4 acc[4];
    [[unroll]] for (int i = 0; i < 4; i++) acc[i] = vec4(0.0);
    float ss = 0.0;

    uint steps = (p.K4 + BK4 - 1) / BK4;
    uint arow = m0 + lr;
    uint wrow = n0 + lr;
    vec4 ra = (arow < p.M && lk < p.K4) ? a[arow * p.K4 + lk] : vec4(0.0);
    vec4 rw = load_w(wrow, lk);

    for (uint s = 0; s < steps; s++) {
        barrier();
        ss += dot(ra, ra);
        vec4 ua = operand_a(ra);
        [[unroll]] for (int e = 0; e < 4; e++) {
            As[lk * 4 + e][lr / 4][lr % 4] = ua[e];
            Ws[lk * 4 + e][lr / 4][lr % 4] = rw[e];
        }
        barrier();
        if (s + 1 < steps) {
            uint kk = (s + 1) * BK4 + lk;
            ra = (arow < p.M && kk < p.K4) ? a[arow * p.K4 + kk] : vec4(0.0);
            rw = load_w(wrow, kk);
        }
        [[unroll]] for (uint k = 0; k < BK4 * 4; k++) {
            vec4 av = As[k][ty];
            vec4 bv = Ws[k][tx];
            [[unroll]] for (int i = 0; i < 4; i++) acc[i] += av[i] * bv;
        }
    }

    // Row scales: the four threads that staged a row's slices hold its sum of squares.
    bool norm = (p.flags & 1u) != 0u;
    if (norm) {
        sq[tid] = ss;
        barrier();
        if (tid < BM) {
            float t = sq[4 * tid] + sq[4 * tid + 1] + sq[4 * tid + 2] + sq[4 * tid + 3];
            rstd[tid] = 1.0 / sqrt(t / float(p.kdim) + p.eps);
        }
        barrier();
    }

    bool broken = false;
    uint col = n0 + tx * 4;
    [[unroll]] for (int i = 0; i < 4; i++) {
        uint lrow = ty * 4 + uint(i);
        vec4 v = acc[i];
        if (norm) v *= rstd[lrow];
        broken = epilogue_quad(m0 + lrow, col, v) || broken;
    }
    if (broken) flags[p.slot] = 1.0;
}
