// Tiled f32 GEMM: C[m, n] = A[m, k] · W[n, k]ᵀ (both operands k-contiguous, the GGUF layout).
//
// One workgroup of 16x16 threads computes a 64x64 tile of C (H = 1, gemm_f32_small.comp);
// each thread a 4x4 block, so that its shared-memory reads are vec4-wide. The H = 2 form of
// this code (128x128) was slow on NVIDIA, see gemm_f32.comp, which spells that one out. Each step stages a 16-deep slice of A and W in shared memory, transposed to
// [k][row], while the next slice's global loads are already in flight in registers. Rows are padded to whole vec4s with zeros (see buffers.rs),
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
    uint split_steps; // k steps per workgroup layer z (split-K; 0: all of k, one layer)
    uint pad[9];
} p;

// H halves of 64 rows/columns: H = 2 gives the 128x128 tile, H = 1 a 64x64 tile (4x4 per
// thread) for products too small to fill the GPU with 128x128 tiles.
const uint BM = 64 * H;
const uint BN = 64 * H;
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

    // Each thread loads H vec4 of A and H of W per step: rows lr + 64 h, k-vec lk.
    uint lr = tid / 4;
    uint lk = tid % 4;

    vec4 acc[4 * H][H];
    for (int i = 0; i < 4 * H; i++)
        for (int j = 0; j < H; j++) acc[i][j] = vec4(0.0);

    vec4 ra[H];
    vec4 rw[H];
    // Split-K: layer z of the grid sums steps s0 .. s0 + steps of k into its own slice of C
    // ([z][M][ldc4]); gemm_reduce.comp adds the slices.
    uint all_steps = (p.K4 + BK4 - 1) / BK4;
    uint per = p.split_steps == 0 ? all_steps : p.split_steps;
    uint s0 = gl_WorkGroupID.z * per;
    uint steps = s0 < all_steps ? min(per, all_steps - s0) : 0;

    // Prefetch step 0.
    for (int h = 0; h < H; h++) {
        uint row = m0 + lr + h * 64;
        uint kk = s0 * BK4 + lk;
        ra[h] = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : vec4(0.0);
        uint col = n0 + lr + h * 64;
        rw[h] = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : vec4(0.0);
    }

    for (uint s = 0; s < steps; s++) {
        barrier();
        for (int h = 0; h < H; h++) {
            uint r = lr + h * 64;
            for (int e = 0; e < 4; e++) {
                As[lk * 4 + e][r / 4][r % 4] = ra[h][e];
                Ws[lk * 4 + e][r / 4][r % 4] = rw[h][e];
            }
        }
        barrier();
        if (s + 1 < steps) {
            uint kk = (s0 + s + 1) * BK4 + lk;
            for (int h = 0; h < H; h++) {
                uint row = m0 + lr + h * 64;
                ra[h] = (row < p.M && kk < p.K4) ? a[row * p.lda4 + kk] : vec4(0.0);
                uint col = n0 + lr + h * 64;
                rw[h] = (col < p.N && kk < p.K4) ? w[col * p.ldw4 + kk] : vec4(0.0);
            }
        }
        for (uint k = 0; k < BK4 * 4; k++) {
            vec4 av[H];
            vec4 bv[H];
            for (int h = 0; h < H; h++) {
                av[h] = As[k][ty + 16 * h];
                bv[h] = Ws[k][tx + 16 * h];
            }
            for (int h = 0; h < H; h++)
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < H; j++) acc[4 * h + i][j] += av[h][i] * bv[j];
        }
    }

    // Columns past N come from zero rows of W, so storing them writes zeros into C's padding.
    for (int i = 0; i < 4 * H; i++) {
        uint row = m0 + 64 * (i / 4) + ty * 4 + (i % 4);
        if (row >= p.M) continue;
        for (int j = 0; j < H; j++) {
            uint cj = n0 / 4 + 16 * j + tx;
            if (cj < p.ldc4) c[(gl_WorkGroupID.z * p.M + row) * p.ldc4 + cj] = acc[i][j];
        }
    }
}
