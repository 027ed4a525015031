// The output projection folded into attention_flash_khr.glsl (FUSE_O): the workgroup that
// holds head h's final output tile (64 query rows x 64 dims, scaled by 1 / l) multiplies it
// by W_o's columns h * 64 .. h * 64 + 63 on tensor cores and adds the product into the
// residual stream x with float atomics, 64 columns of W_o at a time (staged as f16 in ks,
// the next 64 in flight in registers; each subgroup's 16 x 64 product goes through its fs
// slice so that a whole subgroup adds 32 consecutive floats of one row at once).
//
// Why atomics: x's row needs every head's product, and the heads are separate workgroups.
// The deterministic alternatives cost more than the output projection's own dispatch:
// per-head partials summed in the next GEMM's prologue re-read them once per 64-column
// tile (48 times for gate/up), and a last-arriving workgroup that sums them serialises
// 1.3 MB of reads per 64-row block on one SM. The price is the order of the nine heads'
// additions into each element, which varies between runs (rounding in the last bits);
// GpuOptions::unfused_output_projection keeps the separate, deterministic GEMM.

layout(std430, binding = 5) readonly buffer Wo { uvec4 wo[]; };
layout(std430, binding = 6) buffer X { float x[]; };
layout(std430, binding = 7) buffer Flags { float flags[]; };

// W_o rows c0 .. c0 + 63 (zeros past o_cols), head h's 64 columns, into registers: thread t
// moves uvec4 e = t + 128 i, row e / 8, dims 8 (e % 8) ..
void fetch_wo(uint c0, uint h) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint e = tid + 128 * i;
        uint col = c0 + e / 8;
        rk[i] = col < p.o_cols ? wo[col * p.ldwo4 + h * 8 + e % 8] : uvec4(0);
    }
}

// x[t0 + row, :] += vals · W_o[:, h * 64 ..]ᵀ for the tile's rows below `rows`; `vals` is
// this lane's half row in the main loop's register order (zeros past the chunk). Every
// thread of the workgroup calls it.
void project_out(float vals[32], uint t0, uint rows, uint h) {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / 32;
    uint lane = tid % 32;
    uint r = lane / 2;
    uint hf = lane % 2;
    uint pbase = sg * 16 * SROW;
    [[unroll]] for (uint j = 0; j < 4; j++) { // as P: register groups 2j, 2j + 1
        ps[pbase + r * SROW + hf * 4 + (j ^ (2 * hf))] = uvec4(
            packHalf2x16(vec2(vals[8 * j], vals[8 * j + 1])),
            packHalf2x16(vec2(vals[8 * j + 2], vals[8 * j + 3])),
            packHalf2x16(vec2(vals[8 * j + 4], vals[8 * j + 5])),
            packHalf2x16(vec2(vals[8 * j + 6], vals[8 * j + 7])));
    }
    fetch_wo(0, h);
    barrier(); // every subgroup is done with ks (the last key block) and has written its P
    FRAG_A oa[4];
    [[unroll]] for (uint kk = 0; kk < 4; kk++)
        coopMatLoad(oa[kk], ps, pbase + kk * 2, SROW, ROW_MAJOR);
    bool bad = false;
    for (uint c0 = 0; c0 < p.o_cols; c0 += 64) {
        [[unroll]] for (uint i = 0; i < 4; i++) {
            uint e = tid + 128 * i;
            ks[(e / 8) * SROW + e % 8] = rk[i];
        }
        barrier();
        if (c0 + 64 < p.o_cols) fetch_wo(c0 + 64, h);
        // B = W_oᵀ: W_o's rows are ks's rows, column-major as K in S = Q·Kᵀ.
        [[unroll]] for (uint n = 0; n < 4; n++) {
            FRAG_C y = FRAG_C(0.0);
            [[unroll]] for (uint kk = 0; kk < 4; kk++) {
                FRAG_B wf;
                coopMatLoad(wf, ks, n * 16 * SROW + kk * 2, SROW, COL_MAJOR);
                y = coopMatMulAdd(oa[kk], wf, y);
            }
            coopMatStore(y, fs, sg * 16 * FROW4 + n * 4, FROW4, ROW_MAJOR);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint i = 0; i < 16; i++) {
            uint lr = sg * 16 + i;
            [[unroll]] for (uint hc = 0; hc < 2; hc++) {
                uint c = hc * 32 + lane;
                float y = fs[lr * FROW4 + c / 4][c % 4];
                if (lr < rows && c0 + c < p.o_cols) {
                    bad = bad || isnan(y) || isinf(y);
                    atomicAdd(x[(t0 + lr) * p.ldx + c0 + c], y);
                }
            }
        }
        barrier(); // ks and fs are read before the next 64 columns overwrite them
    }
    if (bad) flags[p.slot] = 1.0;
}
