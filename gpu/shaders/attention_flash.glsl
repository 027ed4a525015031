#extension GL_EXT_control_flow_attributes : require
// Causal grouped-query attention for prefill, FlashAttention-style with register tiles
// (head_dim <= 64): a workgroup of 128 threads takes BQ = 32 query rows of one head and
// walks the keys 0 .. pos0 + its last row in blocks of BK = 32, reading earlier chunks'
// keys and values in place from the cache. Per block: S = Q·Kᵀ (each thread 4 rows x 2
// keys, Q and K staged transposed in shared memory so both reads are vectors), the causal
// mask, an online softmax (running max m and sum l per row; 4 threads per row, reduced in
// shared memory), then O = diag(corr)·O + P·V (each thread 4 rows x 4 dims, 16 registers).
// The old tiled kernel (attention_tiled.comp: 8 queries, scalar loops) ran at about 2.3
// TFLOPS on an H100; this one does 4x more work per shared-memory read.
// Query blocks are walked last-first so that the longest rows (most keys) start first.
// Layouts: q, out [n_tokens, n_heads, head_dim]; k, v [kv, n_kv_heads, head_dim]; query t
// sits at position pos0 + t and sees keys 0..=pos0+t.
//
// With FUSE_O defined (attention_flash_o.comp) each query block's output tile of the head
// is also multiplied by the head's columns of the output projection W_o [n_out, n_heads *
// head_dim] (f32, or f16 with flags bit 0, the tile then rounded to f16 as the tensor-core
// kernel rounds it) and added into the residual stream x [n_tokens, n_out] with float
// atomics: the plain-shader twin of attention_o_khr.glsl, what lavapipe tests.
layout(local_size_x = 16, local_size_y = 8) in;

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint pos0;
    uint kv_len;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    float scale;
    uint flags;    // FUSE_O: bit 0, W_o is f16
    uint o_cols;   // FUSE_O: columns of x (rows of W_o)
    uint ldwo;     // FUSE_O: W_o's row stride in 32-bit words
    uint ldx;      // FUSE_O: x's row stride in floats
    uint slot;     // FUSE_O: the flag a non-finite product raises
    uint pad[4];
} p;

const uint BQ = 32;
const uint BK = 32;
const uint D = 64;
const float NEG_INF = -1.0 / 0.0;

shared vec4 qs[D][BQ / 4];   // [dim][row / 4]
shared vec2 ks[D][BK / 2];   // [dim][key / 2]
shared vec4 vs[BK][D / 4];   // [key][dim / 4]
shared float ps[BQ][BK + 1]; // scores, then probabilities
shared float red[128];
shared float row_m[BQ];
shared float row_l[BQ];
shared float row_corr[BQ];

#ifdef FUSE_O
#include "attention_o.glsl"
#endif

void main() {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint h = gl_WorkGroupID.x;
    uint d = p.head_dim;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok = p.n_kv_heads * d;
    uint q_tok = p.n_heads * d;
    uint blocks = (p.n_tokens + BQ - 1) / BQ;
    for (uint y = gl_WorkGroupID.y; y < blocks; y += gl_NumWorkGroups.y) {
        uint t0 = (blocks - 1 - y) * BQ;
        uint rows = min(BQ, p.n_tokens - t0);
        // Stage the block's queries, transposed; rows past the chunk and dims past d are 0.
        for (uint i = tid; i < BQ * D; i += 128) {
            uint r = i / D;
            uint c = i % D;
            float x = (r < rows && c < d) ? q[(t0 + r) * q_tok + h * d + c] : 0.0;
            qs[c][r / 4][r % 4] = x;
        }
        if (tid < BQ) {
            row_m[tid] = NEG_INF;
            row_l[tid] = 0.0;
        }
        // Loops over acc, s and kx/vx are unrolled (constant indices keep them in registers).
        vec4 acc[4];
        [[unroll]] for (int i = 0; i < 4; i++) acc[i] = vec4(0.0);
        uint tile_keys = p.pos0 + t0 + rows;
        for (uint base = 0; base < tile_keys; base += BK) {
            barrier(); // the last block's ks, vs and ps are read; qs and row stats written
            for (uint i = tid; i < BK * (D / 4); i += 128) {
                uint j = i / (D / 4);
                uint c4 = i % (D / 4);
                vec4 kx = vec4(0.0);
                vec4 vx = vec4(0.0);
                if (base + j < tile_keys) {
                    uint src = (base + j) * kv_tok + g * d + c4 * 4;
                    [[unroll]] for (uint e = 0; e < 4; e++) {
                        if (c4 * 4 + e < d) {
                            kx[e] = k[src + e];
                            vx[e] = v[src + e];
                        }
                    }
                }
                [[unroll]] for (uint e = 0; e < 4; e++) ks[c4 * 4 + e][j / 2][j % 2] = kx[e];
                vs[j][c4] = vx;
            }
            barrier();
            // S: rows 4 ty .. +3, keys 2 tx, 2 tx + 1.
            vec2 s[4];
            [[unroll]] for (int i = 0; i < 4; i++) s[i] = vec2(0.0);
            [[unroll]] for (uint c = 0; c < D; c++) {
                vec4 a = qs[c][ty];
                vec2 b = ks[c][tx];
                [[unroll]] for (int i = 0; i < 4; i++) s[i] += a[i] * b;
            }
            [[unroll]] for (uint i = 0; i < 4; i++) {
                uint r = ty * 4 + i;
                [[unroll]] for (uint e = 0; e < 2; e++) {
                    uint key = base + tx * 2 + e;
                    bool seen = r < rows && key <= p.pos0 + t0 + r;
                    ps[r][tx * 2 + e] = seen ? s[i][e] * p.scale : NEG_INF;
                }
            }
            barrier();
            // Online softmax: 4 threads per row, 8 keys each.
            uint sr = tid / 4;
            uint part = tid % 4;
            float mx = NEG_INF;
            for (uint e = 0; e < 8; e++) mx = max(mx, ps[sr][part * 8 + e]);
            red[tid] = mx;
            barrier();
            float m_old = row_m[sr];
            float m_new = max(max(m_old, max(red[4 * sr], red[4 * sr + 1])),
                              max(red[4 * sr + 2], red[4 * sr + 3]));
            barrier(); // everyone has read red before it holds sums
            float sum = 0.0;
            for (uint e = 0; e < 8; e++) {
                float x = ps[sr][part * 8 + e];
                float w = x == NEG_INF ? 0.0 : exp(x - m_new);
                ps[sr][part * 8 + e] = w;
                sum += w;
            }
            red[tid] = sum;
            barrier();
            if (part == 0) {
                float corr = m_old == NEG_INF ? 0.0 : exp(m_old - m_new);
                float total = red[4 * sr] + red[4 * sr + 1] + red[4 * sr + 2] + red[4 * sr + 3];
                row_l[sr] = row_l[sr] * corr + total;
                row_m[sr] = m_new;
                row_corr[sr] = corr;
            }
            barrier();
            // O: rows 4 ty .. +3, dims 4 tx .. +3.
            [[unroll]] for (uint i = 0; i < 4; i++) acc[i] *= row_corr[ty * 4 + i];
            [[unroll]] for (uint j = 0; j < BK; j++) {
                vec4 vv = vs[j][tx];
                [[unroll]] for (uint i = 0; i < 4; i++) acc[i] += ps[ty * 4 + i][j] * vv;
            }
        }
        barrier(); // row_l is final
        [[unroll]] for (uint i = 0; i < 4; i++) {
            uint r = ty * 4 + i;
            acc[i] *= r < rows ? 1.0 / row_l[r] : 0.0;
            if (r < rows) {
                [[unroll]] for (uint e = 0; e < 4; e++) {
                    uint c = tx * 4 + e;
                    if (c < d) o[(t0 + r) * q_tok + h * d + c] = acc[i][e];
                }
            }
        }
#ifdef FUSE_O
        project_out(acc, t0, rows, h);
#endif
        barrier(); // row_l is read before the next query block resets it
    }
}
