#version 450
// Per-tensor INT8 GEMM with exact i32 accumulation: C[m, n] = A[m, k] · W[n, k]ᵀ.
//
// Four i8 are packed per 32-bit word (rows padded to whole uvec4 = 16 values), so neither
// shaderInt8 nor 8-bit storage is needed (lavapipe has neither in every version); bytes are
// sign-extended with bitfieldExtract. Tiling as gemm_f32.comp (128x128 per 16x16 workgroup,
// 8x8 per thread), with k staged 32 deep in shared memory still packed, four per word.
// Integer addition wraps, as the reference's wrapping_add does.
layout(local_size_x = 16, local_size_y = 16) in;

layout(std430, binding = 0) readonly buffer A { uvec4 a[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w[]; };
layout(std430, binding = 2) writeonly buffer C { ivec4 c[]; };

layout(push_constant) uniform Push {
    uint M;
    uint N;
    uint K4;     // padded k in uvec4 units (16 i8 each)
    uint lda4;
    uint ldw4;
    uint ldc4;   // C row stride in ivec4
    uint pad[10];
} p;

const uint BM = 128;
const uint BN = 128;
const uint BKV = 2;  // uvec4 per row per step: 32 values of k, 8 words

shared uvec4 As[BKV * 4][BM / 4 + 1];
shared uvec4 Ws[BKV * 4][BN / 4 + 1];

ivec4 bytes(uint word) {
    int v = int(word);
    return ivec4(bitfieldExtract(v, 0, 8), bitfieldExtract(v, 8, 8),
                 bitfieldExtract(v, 16, 8), bitfieldExtract(v, 24, 8));
}

int dot4(ivec4 x, ivec4 y) {
    return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;
    uint lr = tid / 2;
    uint lk = tid % 2;

    ivec4 acc[8][2];
    for (int i = 0; i < 8; i++) { acc[i][0] = ivec4(0); acc[i][1] = ivec4(0); }

    uint steps = (p.K4 + BKV - 1) / BKV;
    uint row = m0 + lr;
    uint col = n0 + lr;
    uvec4 ra = (row < p.M && lk < p.K4) ? a[row * p.lda4 + lk] : uvec4(0);
    uvec4 rw = (col < p.N && lk < p.K4) ? w[col * p.ldw4 + lk] : uvec4(0);

    for (uint s = 0; s < steps; s++) {
        barrier();
        for (int e = 0; e < 4; e++) {
            As[lk * 4 + e][lr / 4][lr % 4] = ra[e];
            Ws[lk * 4 + e][lr / 4][lr % 4] = rw[e];
        }
        barrier();
        if (s + 1 < steps) {
            uint kk = (s + 1) * BKV + lk;
            ra = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : uvec4(0);
            rw = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : uvec4(0);
        }
        for (uint k = 0; k < BKV * 4; k++) {
            uvec4 a0 = As[k][ty];
            uvec4 a1 = As[k][ty + 16];
            uvec4 b0 = Ws[k][tx];
            uvec4 b1 = Ws[k][tx + 16];
            ivec4 bw[8];
            for (int j = 0; j < 4; j++) { bw[j] = bytes(b0[j]); bw[j + 4] = bytes(b1[j]); }
            for (int i = 0; i < 4; i++) {
                ivec4 x0 = bytes(a0[i]);
                ivec4 x1 = bytes(a1[i]);
                acc[i][0] += ivec4(dot4(x0, bw[0]), dot4(x0, bw[1]), dot4(x0, bw[2]), dot4(x0, bw[3]));
                acc[i][1] += ivec4(dot4(x0, bw[4]), dot4(x0, bw[5]), dot4(x0, bw[6]), dot4(x0, bw[7]));
                acc[i + 4][0] += ivec4(dot4(x1, bw[0]), dot4(x1, bw[1]), dot4(x1, bw[2]), dot4(x1, bw[3]));
                acc[i + 4][1] += ivec4(dot4(x1, bw[4]), dot4(x1, bw[5]), dot4(x1, bw[6]), dot4(x1, bw[7]));
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
