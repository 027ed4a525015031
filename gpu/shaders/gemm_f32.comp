#version 450
// Tiled f32 GEMM: C[m, n] = A[m, k] · W[n, k]ᵀ (both operands k-contiguous, the GGUF layout).
//
// One workgroup of 16x16 threads computes a 128x128 tile of C; each thread an 8x8 block
// (rows ty*4..+3 and 64+ty*4..+3, columns likewise), so that its shared-memory reads are
// vec4-wide and the two halves do not hit the same banks. Written out by hand rather than
// as gemm_f32.glsl with H = 2: that generic form ran at 2.3 TFLOPS on an H200 (likely its
// accumulator arrays, indexed in nested loops, left registers), this one at 35. Each step
// stages a 16-deep slice of A and W in shared memory, transposed to [k][row], while the next
// slice's global loads are already in flight in registers. Rows are padded to whole vec4s with zeros (see buffers.rs),
// so only row/column indices need bounds checks, never k.
layout(local_size_x = 16, local_size_y = 16) in;

layout(std430, binding = 0) readonly buffer A { vec4 a[]; };
layout(std430, binding = 1) readonly buffer W { vec4 w[]; };
layout(std430, binding = 2) writeonly buffer C { vec4 c[]; };

layout(push_constant) uniform Push {
    uint M;      // rows of A and C
    uint N;      // rows of W = columns of C
    uint K4;     // padded k in vec4 units
    uint lda4;   // A row stride in vec4
    uint ldw4;   // W row stride in vec4
    uint ldc4;   // C row stride in vec4
    uint pad[10];
} p;

const uint BM = 128;
const uint BN = 128;
const uint BK4 = 4; // 16 floats of k per step

// [k][row/4], one vec4 of padding per row against bank conflicts on the transposed stores.
shared vec4 As[BK4 * 4][BM / 4 + 1];
shared vec4 Ws[BK4 * 4][BN / 4 + 1];

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0 = gl_WorkGroupID.x * BN;

    // Each thread loads 2 vec4 of A and 2 of W per step: rows lr and lr + 64, k-vec lk.
    uint lr = tid / 4;
    uint lk = tid % 4;

    vec4 acc[8][2];
    for (int i = 0; i < 8; i++) { acc[i][0] = vec4(0.0); acc[i][1] = vec4(0.0); }

    vec4 ra[2];
    vec4 rw[2];
    uint steps = (p.K4 + BK4 - 1) / BK4;

    // Prefetch step 0.
    for (int h = 0; h < 2; h++) {
        uint row = m0 + lr + h * 64;
        uint kk = lk;
        ra[h] = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : vec4(0.0);
        uint col = n0 + lr + h * 64;
        rw[h] = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : vec4(0.0);
    }

    for (uint s = 0; s < steps; s++) {
        barrier();
        for (int h = 0; h < 2; h++) {
            uint r = lr + h * 64;
            for (int e = 0; e < 4; e++) {
                As[lk * 4 + e][r / 4][r % 4] = ra[h][e];
                Ws[lk * 4 + e][r / 4][r % 4] = rw[h][e];
            }
        }
        barrier();
        if (s + 1 < steps) {
            uint kk = (s + 1) * BK4 + lk;
            for (int h = 0; h < 2; h++) {
                uint row = m0 + lr + h * 64;
                ra[h] = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : vec4(0.0);
                uint col = n0 + lr + h * 64;
                rw[h] = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : vec4(0.0);
            }
        }
        for (uint k = 0; k < BK4 * 4; k++) {
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

    // Columns past N come from zero rows of W, so storing them writes zeros into C's padding.
    for (int i = 0; i < 8; i++) {
        uint row = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (row >= p.M) continue;
        uint c0 = n0 / 4 + tx;
        uint c1 = n0 / 4 + 16 + tx;
        if (c0 < p.ldc4) c[row * p.ldc4 + c0] = acc[i][0];
        if (c1 < p.ldc4) c[row * p.ldc4 + c1] = acc[i][1];
    }
}
