// f16 GEMM on tensor cores through cooperative matrices: C[m, n] (f32) = A[m, k] · W[n, k]ᵀ.
// The body of the gemm_f16_coopmat_*.comp kernels, which first define
//
//   FRAG_A, FRAG_B, FRAG_C        16x16 fragment types (f16 A and B, f32 accumulator)
//   LOAD_A(f, array, offset, stride), LOAD_B(...), STORE_C(...), MMA(a, b, c)
//                                 the extension's load / store / multiply-add
//   BM, BN                        output tile of one workgroup
//   WM, WN                        subgroups along m and n (each owns (BM/WM) x (BN/WN))
//   BKV                           k per step in uvec4 (8 halves each)
//   STAGES                        1: one shared buffer, two barriers per step;
//                                 2: two buffers, one barrier per step (needs twice the memory)
//
// so that the NV and KHR extensions share one tiling. Every loop over fragments is
// [[unroll]]ed: an accumulator array indexed by a loop counter the compiler cannot resolve
// lives in local memory. The first NV kernel, this tiling at 128x128 without the unrolling,
// ran at 31 TFLOPS on an H100; with it, 165.
//
// The workgroup's BM x (BKV*8) slice of A and BN x (BKV*8) slice of W go through shared
// memory, rows padded by one uvec4 so that the 8 rows one ldmatrix phase reads fall in
// distinct banks; the next step's slices are loaded into registers while the tensor cores
// work on this one. W is [n, k] row-major, which is B = Wᵀ (k x n) column-major, so B
// fragments load column-major from W's rows. Rows of A and W past m and n and k past the
// padded row length read as zero, so any m, n and k work; output fragments that straddle m
// or n go through shared memory and are written element by element.
//
// Workgroups are numbered along a 1-D index (split over x and y when it exceeds the x limit)
// and walk the tiles in column strips GROUP_M tiles tall, so that the workgroups in flight
// share their A rows and W rows in L2.

#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

const uint SUBGROUPS = WM * WN;
layout(local_size_x = SUBGROUPS * 32) in;

layout(std430, binding = 0) readonly buffer A { uvec4 a[]; };
layout(std430, binding = 1) readonly buffer W { uvec4 w[]; };
layout(std430, binding = 2) buffer C { float c[]; };

layout(push_constant) uniform Push {
    uint M;
    uint N;
    uint K4;     // padded k in uvec4 (8 halves)
    uint lda4;
    uint ldw4;
    uint ldc;    // C row stride in floats
    uint groups_x; // workgroups along x of the dispatch (the 1-D index wraps at it)
    uint pad[9];
} p;

const uint THREADS = SUBGROUPS * 32;
const uint SROW = BKV + 1;                 // shared row stride in uvec4
const uint FM = BM / WM / 16;              // fragments per subgroup along m
const uint FN = BN / WN / 16;              // ... along n
// Loads: a step's slice is moved in up to two column parts, the first P1 = 4 uvec4 wide
// (or BKV when narrower) and the rest, P2 (0, 2 or 4), so that 48 of k (BKV 6) keeps every
// thread busy with shifts and masks only. In a part P wide, thread t moves column t % P of
// rows t / P, + THREADS / P, ... (A1, A2, W1, W2 uvec4 per thread). Spreading a slice evenly
// instead, uvec4 e = t + THREADS * r at row e / BKV, cost a 256x128 tile a fifth of its
// speed (divisions and guards per load); 42 rows per pass of 6, with 4 threads idle, lost
// to 32 of k.
const uint P1 = BKV >= 4 ? 4 : BKV;
const uint P2 = BKV - P1;
const uint P2D = P2 == 0 ? 1 : P2; // a divisor even where the second part is empty
const uint A1 = BM * P1 / THREADS;
const uint A2 = BM * P2 / THREADS;
const uint W1 = BN * P1 / THREADS;
const uint W2 = BN * P2 / THREADS;
const uint STAGE_A = BM * SROW;
const uint STAGE_W = BN * SROW;
const uint GROUP_M = 8;
// Compile-time checks (a negative array size fails the build): whole 16-deep fragments per
// step, whole passes of loads, and room in As for every subgroup's 16x16 f32 edge fragment.
const int CHECK_K[(BKV % 2 == 0 && P2 <= 4) ? 1 : -1] = int[](0);
const int CHECK_LOADS[(THREADS % P1 == 0 && THREADS % P2D == 0 && (BM * P1) % THREADS == 0
    && (BM * P2) % THREADS == 0 && (BN * P1) % THREADS == 0 && (BN * P2) % THREADS == 0)
    ? 1 : -1] = int[](0);
const int CHECK_EDGE[(STAGES * STAGE_A >= SUBGROUPS * 64) ? 1 : -1] = int[](0);

shared uvec4 As[STAGES * STAGE_A];
shared uvec4 Ws[STAGES * STAGE_W];

uvec4 ra[A1 + A2];
uvec4 rw[W1 + W2];

// Loads into regs[OFS], ... the LOADS uvec4 of a part P wide starting at column C0 of step
// s's slice of buf (rows from FIRST, stride LD); with CHECK, zeros past LIMIT rows or K4.
#define FETCH_PART(regs, OFS, LOADS, P, C0, buf, LD, FIRST, LIMIT, CHECK)                \
    [[unroll]] for (uint r = 0; r < LOADS; r++) {                                         \
        uint row = FIRST + gl_LocalInvocationID.x / P + (THREADS / P) * r;                \
        uint kk = s * BKV + C0 + gl_LocalInvocationID.x % P;                              \
        regs[OFS + r] = (!CHECK || (row < LIMIT && kk < p.K4)) ? buf[row * LD + kk] : uvec4(0); \
    }

// Loads step `s`'s slices of A and W into registers, zeros outside the matrices. A tile
// `inside` all three dimensions skips the bounds checks (no gain on large products on an
// H100, 7-10% on SmolLM2-sized ones with 64x64 tiles).
void fetch(uint s, uint m0, uint n0, bool inside) {
    if (inside) {
        FETCH_PART(ra, 0, A1, P1, 0, a, p.lda4, m0, p.M, false)
        FETCH_PART(ra, A1, A2, P2D, P1, a, p.lda4, m0, p.M, false)
        FETCH_PART(rw, 0, W1, P1, 0, w, p.ldw4, n0, p.N, false)
        FETCH_PART(rw, W1, W2, P2D, P1, w, p.ldw4, n0, p.N, false)
    } else {
        FETCH_PART(ra, 0, A1, P1, 0, a, p.lda4, m0, p.M, true)
        FETCH_PART(ra, A1, A2, P2D, P1, a, p.lda4, m0, p.M, true)
        FETCH_PART(rw, 0, W1, P1, 0, w, p.ldw4, n0, p.N, true)
        FETCH_PART(rw, W1, W2, P2D, P1, w, p.ldw4, n0, p.N, true)
    }
}

// Stores regs[OFS], ... of a part into shared stage `stage` of array sh (STAGE_SIZE each).
#define STASH_PART(regs, OFS, LOADS, P, C0, sh, STAGE_SIZE)                                \
    [[unroll]] for (uint r = 0; r < LOADS; r++)                                           \
        sh[stage * STAGE_SIZE + (gl_LocalInvocationID.x / P + (THREADS / P) * r) * SROW  \
           + C0 + gl_LocalInvocationID.x % P] = regs[OFS + r];

// Stores the registers of `fetch` into shared stage `stage`.
void stash(uint stage) {
    STASH_PART(ra, 0, A1, P1, 0, As, STAGE_A)
    STASH_PART(ra, A1, A2, P2D, P1, As, STAGE_A)
    STASH_PART(rw, 0, W1, P1, 0, Ws, STAGE_W)
    STASH_PART(rw, W1, W2, P2D, P1, Ws, STAGE_W)
}

FRAG_C acc[FM][FN];

// One step's multiply-adds from shared stage `stage`: the subgroup's FM A fragments are
// loaded once per 16 of k and reused against each B fragment.
void multiply(uint stage, uint wm, uint wn) {
    [[unroll]] for (uint kk = 0; kk < BKV; kk += 2) { // 16 halves = 2 uvec4
        FRAG_A fa[FM];
        [[unroll]] for (uint i = 0; i < FM; i++)
            LOAD_A(fa[i], As, stage * STAGE_A + (wm * FM * 16 + i * 16) * SROW + kk, SROW);
        [[unroll]] for (uint j = 0; j < FN; j++) {
            FRAG_B fb;
            LOAD_B(fb, Ws, stage * STAGE_W + (wn * FN * 16 + j * 16) * SROW + kk, SROW);
            [[unroll]] for (uint i = 0; i < FM; i++)
                acc[i][j] = MMA(fa[i], fb, acc[i][j]);
        }
    }
}

void main() {
    uint tiles_m = (p.M + BM - 1) / BM;
    uint tiles_n = (p.N + BN - 1) / BN;
    uint pid = gl_WorkGroupID.y * p.groups_x + gl_WorkGroupID.x;
    if (pid >= tiles_m * tiles_n) return; // the whole workgroup: no barrier is skipped
    uint per_group = GROUP_M * tiles_n;
    uint first_m = (pid / per_group) * GROUP_M;
    uint group_m = min(tiles_m - first_m, GROUP_M);
    uint m0 = (first_m + (pid % per_group) % group_m) * BM;
    uint n0 = ((pid % per_group) / group_m) * BN;

    uint sg = gl_SubgroupID;
    uint wm = sg / WN;
    uint wn = sg % WN;

    [[unroll]] for (uint i = 0; i < FM; i++)
        [[unroll]] for (uint j = 0; j < FN; j++)
            acc[i][j] = FRAG_C(0.0);

    uint steps = (p.K4 + BKV - 1) / BKV;
    bool inside = m0 + BM <= p.M && n0 + BN <= p.N && p.K4 % BKV == 0;
    fetch(0, m0, n0, inside);
#if STAGES == 2
    stash(0);
    barrier();
    for (uint s = 0; s < steps; s++) {
        if (s + 1 < steps) fetch(s + 1, m0, n0, inside);
        multiply(s & 1, wm, wn);
        // The other stage was last read in step s - 1, which every subgroup finished
        // before the barrier that ended it.
        if (s + 1 < steps) stash((s + 1) & 1);
        barrier();
    }
#else
    for (uint s = 0; s < steps; s++) {
        barrier(); // every subgroup is done reading the previous step
        stash(0);
        barrier();
        if (s + 1 < steps) fetch(s + 1, m0, n0, inside);
        multiply(0, wm, wn);
    }
    barrier(); // As is reused below for fragments at the edges
#endif

    // vulkano finds a shader's descriptors from ordinary loads and stores and does not count
    // cooperative-matrix stores: this never-taken store keeps binding 2 in the layout.
    if (p.M == 0xffffffffu) c[0] = 0.0;
    uint lane = gl_SubgroupInvocationID;
    uint edge = sg * 64; // this subgroup's 16x16 floats (64 uvec4) of As
    [[unroll]] for (uint i = 0; i < FM; i++) {
        uint row = m0 + wm * FM * 16 + i * 16;
        [[unroll]] for (uint j = 0; j < FN; j++) {
            uint col = n0 + wn * FN * 16 + j * 16;
            if (row + 16 <= p.M && col + 16 <= p.N) {
                STORE_C(acc[i][j], c, row * p.ldc + col, p.ldc);
            } else if (row < p.M && col < p.N) {
                STORE_C(acc[i][j], As, edge, 4);
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                for (uint e = lane; e < 256; e += 32) {
                    uint r = row + e / 16, q = col + e % 16;
                    if (r < p.M && q < p.N)
                        c[r * p.ldc + q] = uintBitsToFloat(As[edge + e / 4][e % 4]);
                }
                subgroupBarrier();
            }
        }
    }
}
