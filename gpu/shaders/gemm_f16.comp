#version 450
// Tiled f16 GEMM, f32 accumulation: C[m, n] = A[m, k] · W[n, k]ᵀ.
//
// Halves are stored packed two per 32-bit word (rows padded to whole uvec4 = 8 halves) and
// widened with unpackHalf2x16, core GLSL 450: no 16-bit storage or arithmetic feature is
// needed, so it runs on lavapipe. Same tiling as gemm_f32.comp: 128x128 tile per 16x16
// workgroup, 8x8 per thread, k staged 16 deep in shared memory as f32.
layout(local_size_x = 16, local_size_y = 16) in;

layout(std430, binding = 0) readonly buffer A { uvec4 a[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w[]; };
layout(std430, binding = 2) writeonly buffer C { vec4 c[]; };

layout(push_constant) uniform Push {
    uint M;
    uint N;
    uint K4;     // padded k in uvec4 units (8 halves each)
    uint lda4;
    uint ldw4;
    uint ldc4;   // C row stride in vec4 (f32)
    uint pad[10];
} p;

const uint BM = 128;
const uint BN = 128;
const uint BKV = 2;  // uvec4 per row per step: 16 halves of k

shared vec4 As[BKV * 8][BM / 4 + 1];
shared vec4 Ws[BKV * 8][BN / 4 + 1];

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;
    uint lr = tid / 2;
    uint lk = tid % 2;

    vec4 acc[8][2];
    for (int i = 0; i < 8; i++) { acc[i][0] = vec4(0.0); acc[i][1] = vec4(0.0); }

    uint steps = (p.K4 + BKV - 1) / BKV;
    uint row = m0 + lr;
    uint col = n0 + lr;
    uvec4 ra = (row < p.M && lk < p.K4) ? a[row * p.lda4 + lk] : uvec4(0);
    uvec4 rw = (col < p.N && lk < p.K4) ? w[col * p.ldw4 + lk] : uvec4(0);

    for (uint s = 0; s < steps; s++) {
        barrier();
        for (int e = 0; e < 4; e++) {
            vec2 av = unpackHalf2x16(ra[e]);
            vec2 wv = unpackHalf2x16(rw[e]);
            As[lk * 8 + 2 * e][lr / 4][lr % 4] = av.x;
            As[lk * 8 + 2 * e + 1][lr / 4][lr % 4] = av.y;
            Ws[lk * 8 + 2 * e][lr / 4][lr % 4] = wv.x;
            Ws[lk * 8 + 2 * e + 1][lr / 4][lr % 4] = wv.y;
        }
        barrier();
        if (s + 1 < steps) {
            uint kk = (s + 1) * BKV + lk;
            ra = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : uvec4(0);
            rw = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : uvec4(0);
        }
        for (uint k = 0; k < BKV * 8; k++) {
            vec4 a0 = As[k][ty];
            vec4 a1 = As[k][ty + 16];
            vec4 b0 = Ws[k][tx];
            vec4 b1 = Ws[k][tx + 16];
            for (int i = 0; i < 4; i++) {
                acc[i][0] += a0[i] * b0;
                acc[i][1] += a0[i] * b1;
                acc[i + 4][0] += a1[i] * b0;
                acc[i + 4][1] += a1[i] * b1;
            }
        }
    }

    for (int i = 0; i < 8; i++) {
        uint r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (r >= p.M) continue;
        uint c0 = n0 / 4 + tx;
        uint c1 = n0 / 4 + 16 + tx;
        if (c0 < p.ldc4) c[r * p.ldc4 + c0] = acc[i][0];
        if (c1 < p.ldc4) c[r * p.ldc4 + c1] = acc[i][1];
    }
}
