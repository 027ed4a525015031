#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
// Causal grouped-query flash attention on tensor cores (VK_KHR_cooperative_matrix, f16
// inputs, f32 accumulation), head_dim <= 64 and a multiple of 4; the f32 fallback is
// attention_flash.comp. A workgroup of 4 subgroups takes BQ = 64 query rows of one head
// (16 per subgroup) and one of `splits` ranges of the key blocks (BK = 64 keys) those rows
// see, so that short chunks and long contexts both give the device enough workgroups.
//
// Per key block: K and V are read in place from the f32 cache, converted to f16 into shared
// memory (the next block's loads in flight in registers while this one is multiplied);
// each subgroup computes S = Q·Kᵀ (16 x 64, Q's four A fragments loaded once, the softmax
// scale and log2(e) folded into them), stores it to its shared slice, and each lane takes
// half a row (32 keys): causal mask, online softmax in base 2 (running max and sum per row,
// the two lanes of a row combined by a shuffle), P written back as f16; then P·V (16 x 64)
// into fresh accumulators, stored to the same slice and added by each lane into its
// 32 f32 output registers after scaling them by the row's correction. Per-row scaling of an
// accumulator is not expressible on KHR cooperative matrices (element order is opaque),
// hence the round trip through shared memory.
//
// With splits > 1 each workgroup writes its unnormalized output and (max, sum) per row to
// the scratch buffer and counts itself in on its query block's counter; the last one to
// arrive merges the splits and resets the counter to 0 for the next dispatch (the
// threadfence-reduction pattern: the partials are `coherent`, a buffer barrier orders them
// before the atomic). Layouts as attention_flash.glsl: q, out [n_tokens, n_heads, head_dim];
// k, v [kv, n_kv_heads, head_dim].
//
// With FUSE_O defined (attention_flash_khr_o.comp, head_dim = 64) the workgroup that holds a
// head's final output tile also multiplies it by the head's 64 columns of the output
// projection W_o [n_out, n_heads * 64] (f16) on tensor cores and adds the product into the
// residual stream x [n_tokens, n_out] with float atomics: the nine heads' partial products
// of a row meet in x in whatever order their workgroups finish (see attention_o.glsl).
layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 1) readonly buffer K { vec4 k[]; };
layout(std430, binding = 2) readonly buffer V { vec4 v[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
// [counters: n_heads * q_blocks][(m, l): 2 x 128 per range][o: 32 x 128 per range], a range
// being (split, head, query block); word j of thread t at j * 128 + t, so that the 128
// threads of a workgroup write (and the merging one reads) whole contiguous lines.
layout(std430, binding = 4) coherent buffer S { uint sw[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint pos0;
    uint kv_len;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    float scale;
    uint splits;
    uint ml_base;  // word offset of the (m, l) partials in sw
    uint o_base;   // word offset of the output partials in sw
    uint o_cols;   // FUSE_O: columns of x (rows of W_o)
    uint ldwo4;    // FUSE_O: W_o's row stride in uvec4 (8 halves)
    uint ldx;      // FUSE_O: x's row stride in floats
    uint slot;     // FUSE_O: the flag a non-finite product raises
    uint pad[2];
} p;

const uint BQ = 64;
const uint BK = 64;
const uint D = 64;
const uint SROW = 9;   // shared row stride in uvec4 (72 halves: one uvec4 of padding)
const uint FROW4 = 17; // vec4 row stride of the S / PV slices (68 floats)
const float NEG_INF = -1.0 / 0.0;

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ROW_MAJOR gl_CooperativeMatrixLayoutRowMajor
#define COL_MAJOR gl_CooperativeMatrixLayoutColumnMajor

shared uvec4 ks[BK * SROW];          // [key][dim] f16 (Q's staging before the first block)
shared uvec4 vs[BK * SROW];          // [key][dim] f16
shared vec4 fs[4 * 16 * FROW4];      // per subgroup: S, then P·V, 16 x 64 f32
shared uvec4 ps[4 * 16 * SROW];      // per subgroup: P, 16 x 64 f16
shared bool last_arrival;

uvec4 rk[4];
uvec4 rv[4];

#ifdef FUSE_O
#include "attention_o_khr.glsl"
#endif

// Eight f32 of row `row` starting at dim 8 * part, as f16 (zeros past d or past the keys).
uvec4 fetch8(uint idx4, bool ok, uint part, bool from_k) {
    vec4 a = vec4(0.0);
    vec4 b = vec4(0.0);
    uint d4 = p.head_dim / 4;
    if (ok && part * 2 < d4) a = from_k ? k[idx4] : v[idx4];
    if (ok && part * 2 + 1 < d4) b = from_k ? k[idx4 + 1] : v[idx4 + 1];
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy),
                 packHalf2x16(b.zw));
}

// Loads key block `kb` (keys kb*BK ..) into registers: thread t moves uvec4 e = t + 128 i,
// key e / 8, dims 8 (e % 8) ..
void fetch(uint kb, uint g, uint key_end) {
    uint tid = gl_LocalInvocationID.x;
    uint kv4 = p.n_kv_heads * p.head_dim / 4;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint e = tid + 128 * i;
        uint key = kb * BK + e / 8;
        uint part = e % 8;
        uint idx4 = key * kv4 + g * p.head_dim / 4 + part * 2;
        bool ok = key < key_end;
        rk[i] = fetch8(idx4, ok, part, true);
        rv[i] = fetch8(idx4, ok, part, false);
    }
}

void stash() {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint e = tid + 128 * i;
        ks[(e / 8) * SROW + e % 8] = rk[i];
        vs[(e / 8) * SROW + e % 8] = rv[i];
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / 32;
    uint lane = tid % 32;
    uint h = gl_WorkGroupID.x;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint q_blocks = (p.n_tokens + BQ - 1) / BQ;
    uint yb = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    uint t0 = (q_blocks - 1 - yb) * BQ; // last query block first: it has the most keys
    uint rows = min(BQ, p.n_tokens - t0);
    uint tile_keys = p.pos0 + t0 + rows;
    uint n_blocks = (tile_keys + BK - 1) / BK;
    uint kb0 = split * n_blocks / p.splits;
    uint kb1 = (split + 1) * n_blocks / p.splits;

    // Q (scaled by scale · log2 e) as f16 into ks, then each subgroup's 4 A fragments.
    float qscale = p.scale * 1.4426950408889634;
    uint q4 = p.n_heads * p.head_dim / 4;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint e = tid + 128 * i;
        uint r = e / 8;
        uint part = e % 8;
        uint idx4 = (t0 + r) * q4 + h * p.head_dim / 4 + part * 2;
        vec4 a = vec4(0.0);
        vec4 b = vec4(0.0);
        uint d4 = p.head_dim / 4;
        if (r < rows && part * 2 < d4) a = q[idx4] * qscale;
        if (r < rows && part * 2 + 1 < d4) b = q[idx4 + 1] * qscale;
        ks[r * SROW + part] = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw),
                                    packHalf2x16(b.xy), packHalf2x16(b.zw));
    }
    barrier();
    FRAG_A qa[4];
    [[unroll]] for (uint kk = 0; kk < 4; kk++)
        coopMatLoad(qa[kk], ks, sg * 16 * SROW + kk * 2, SROW, ROW_MAJOR);

    // This lane's half row: row r of the subgroup's 16, keys / dims 32 hf ... Its register
    // group i (4 values) holds keys / dims 32 hf + 4 (i ^ 4 hf) ..: the two lanes of a row
    // read their vec4s 16 floats apart, so the 8 lanes of a 128-bit shared load phase hit
    // 32 distinct banks (reading in the same order they would collide pairwise).
    uint r = lane / 2;
    uint hf = lane % 2;
    uint swz = 4 * hf;
    uint row = sg * 16 + r;               // within the query block
    uint qpos = p.pos0 + t0 + row;        // its position: it sees keys 0 ..= qpos
    float m_run = NEG_INF;
    float l_run = 0.0;
    float acc[32];
    [[unroll]] for (uint j = 0; j < 32; j++) acc[j] = 0.0;
    uint fbase = sg * 16 * FROW4 + r * FROW4 + hf * 8; // this lane's half row, in vec4
    uint pbase = sg * 16 * SROW;

    if (kb0 < kb1) fetch(kb0, g, tile_keys);
    for (uint kb = kb0; kb < kb1; kb++) {
        barrier(); // everyone is done with the last block's ks / vs (and with Q's staging)
        stash();
        barrier();
        if (kb + 1 < kb1) fetch(kb + 1, g, tile_keys);

        // S = Q·Kᵀ: B = Kᵀ, column-major in ks.
        FRAG_C sc[4];
        [[unroll]] for (uint n = 0; n < 4; n++) {
            sc[n] = FRAG_C(0.0);
            [[unroll]] for (uint kk = 0; kk < 4; kk++) {
                FRAG_B kf;
                coopMatLoad(kf, ks, n * 16 * SROW + kk * 2, SROW, COL_MAJOR);
                sc[n] = coopMatMulAdd(qa[kk], kf, sc[n]);
            }
            coopMatStore(sc[n], fs, sg * 16 * FROW4 + n * 4, FROW4, ROW_MAJOR);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // Online softmax over this lane's 32 keys of row r.
        float s[32];
        float bmax = NEG_INF;
        uint key0 = kb * BK + hf * 32;
        [[unroll]] for (uint i = 0; i < 8; i++) {
            vec4 x = fs[fbase + (i ^ swz)];
            [[unroll]] for (uint e = 0; e < 4; e++) {
                bool seen = row < rows && key0 + 4 * (i ^ swz) + e <= qpos;
                s[4 * i + e] = seen ? x[e] : NEG_INF;
                bmax = max(bmax, s[4 * i + e]);
            }
        }
        bmax = max(bmax, subgroupShuffleXor(bmax, 1));
        float m_new = max(m_run, bmax);
        float m_use = m_new == NEG_INF ? 0.0 : m_new; // a row with nothing seen yet: p = 0
        float corr = exp2(m_run - m_use);             // m_run = -inf: 0
        float sum = 0.0;
        [[unroll]] for (uint j = 0; j < 32; j++) {
            s[j] = exp2(s[j] - m_use);
            sum += s[j];
        }
        sum += subgroupShuffleXor(sum, 1);
        l_run = l_run * corr + sum;
        m_run = m_new;
        [[unroll]] for (uint j = 0; j < 4; j++) { // register groups 2j, 2j + 1: one uvec4
            ps[pbase + r * SROW + hf * 4 + (j ^ (swz / 2))] = uvec4(
                packHalf2x16(vec2(s[8 * j], s[8 * j + 1])),
                packHalf2x16(vec2(s[8 * j + 2], s[8 * j + 3])),
                packHalf2x16(vec2(s[8 * j + 4], s[8 * j + 5])),
                packHalf2x16(vec2(s[8 * j + 6], s[8 * j + 7])));
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // P·V into fresh accumulators (V row-major in vs), stored over S.
        FRAG_A pa[4];
        [[unroll]] for (uint kk = 0; kk < 4; kk++)
            coopMatLoad(pa[kk], ps, pbase + kk * 2, SROW, ROW_MAJOR);
        [[unroll]] for (uint n = 0; n < 4; n++) {
            FRAG_C pv = FRAG_C(0.0);
            [[unroll]] for (uint kk = 0; kk < 4; kk++) {
                FRAG_B vf;
                coopMatLoad(vf, vs, kk * 16 * SROW + n * 2, SROW, ROW_MAJOR);
                pv = coopMatMulAdd(pa[kk], vf, pv);
            }
            coopMatStore(pv, fs, sg * 16 * FROW4 + n * 4, FROW4, ROW_MAJOR);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint i = 0; i < 8; i++) {
            vec4 x = fs[fbase + (i ^ swz)];
            [[unroll]] for (uint e = 0; e < 4; e++) acc[4 * i + e] = acc[4 * i + e] * corr + x[e];
        }
        subgroupBarrier(); // the slice is read before the next block's S overwrites it
    }

    uint t = t0 + row;
    uint dim0 = hf * 32;
    if (p.splits == 1) {
        float inv = row < rows ? 1.0 / l_run : 0.0;
        [[unroll]] for (uint j = 0; j < 32; j++) {
            uint dim = dim0 + 4 * ((j / 4) ^ swz) + j % 4;
            acc[j] *= inv;
            if (row < rows && dim < p.head_dim) o[(t * p.n_heads + h) * p.head_dim + dim] = acc[j];
        }
#ifdef FUSE_O
        project_out(acc, t0, rows, h);
#endif
        return;
    }
    // Partials of this range, in the registers' order (every range maps threads to rows
    // and dims alike).
    uint range = (split * p.n_heads + h) * q_blocks + yb;
    sw[p.ml_base + range * 256 + tid] = floatBitsToUint(m_run);
    sw[p.ml_base + range * 256 + 128 + tid] = floatBitsToUint(l_run);
    [[unroll]] for (uint j = 0; j < 32; j++)
        sw[p.o_base + (range * 32 + j) * 128 + tid] = floatBitsToUint(acc[j]);
    memoryBarrierBuffer();
    barrier();
    uint counter = h * q_blocks + yb;
    if (tid == 0) last_arrival = atomicAdd(sw[counter], 1u) == p.splits - 1;
    barrier();
    if (!last_arrival) return;
    memoryBarrierBuffer();
    if (tid == 0) sw[counter] = 0u; // every split has counted in: ready for the next dispatch
#ifndef FUSE_O
    if (row >= rows) return;
#endif
    float m_all = NEG_INF;
    for (uint sp = 0; sp < p.splits; sp++) {
        uint rg = (sp * p.n_heads + h) * q_blocks + yb;
        m_all = max(m_all, uintBitsToFloat(sw[p.ml_base + rg * 256 + tid]));
    }
    float l_all = 0.0;
    float out_acc[32];
    [[unroll]] for (uint j = 0; j < 32; j++) out_acc[j] = 0.0;
    for (uint sp = 0; sp < p.splits; sp++) {
        uint rg = (sp * p.n_heads + h) * q_blocks + yb;
        float m_s = uintBitsToFloat(sw[p.ml_base + rg * 256 + tid]);
        float w = m_s == NEG_INF ? 0.0 : exp2(m_s - m_all);
        l_all += w * uintBitsToFloat(sw[p.ml_base + rg * 256 + 128 + tid]);
        [[unroll]] for (uint j = 0; j < 32; j++)
            out_acc[j] += w * uintBitsToFloat(sw[p.o_base + (rg * 32 + j) * 128 + tid]);
    }
    // Rows past the chunk (FUSE_O keeps every lane for the subgroup's matrices) give 0.
    float inv = row < rows ? 1.0 / l_all : 0.0;
    [[unroll]] for (uint j = 0; j < 32; j++) {
        uint dim = dim0 + 4 * ((j / 4) ^ swz) + j % 4;
        out_acc[j] *= inv;
        if (row < rows && dim < p.head_dim) o[(t * p.n_heads + h) * p.head_dim + dim] = out_acc[j];
    }
#ifdef FUSE_O
    project_out(out_acc, t0, rows, h);
#endif
}
