#version 450
// Causal grouped-query attention, tiled (FlashAttention-style) for head_dim <= 128: a
// workgroup of 128 threads takes BQ = 8 consecutive query tokens of one head and walks the
// keys in blocks of BK = 16 staged in shared memory, so each K/V row is read from global
// memory once per 8 queries (attention.comp reads it once per query) and 16 threads share
// each query row (attention.comp's 64 threads per query leave most of them idle on short
// rows, and 4 threads per row left an H100 mostly idle). Online softmax per query row:
// running max m and sum l, the accumulator rescaled when the max grows.
// Thread tid = 16 r + j owns query row r: of each key block it scores key j, and it
// accumulates output dims j, j+16, j+32, ... (the 16 threads of a row read neighbouring V
// words). Shared rows are padded to D_MAX + 1 words so that threads reading different rows
// at the same column hit different banks.
// Layouts as attention.comp: q, out [n_tokens, n_heads, head_dim]; k, v [kv, n_kv_heads,
// head_dim]; query t sits at position pos0 + t and sees keys 0..=pos0+t.
layout(local_size_x = 128) in;

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
    uint pad[9];
} p;

const uint THREADS = 128;
const uint BQ = 8;
const uint BK = 16;
const uint D_MAX = 128;
const uint STRIDE = D_MAX + 1;
const uint PER = D_MAX / BK;
const float NEG_INF = -1.0 / 0.0;

shared float qs[BQ * STRIDE];
shared float ks[BK * STRIDE];
shared float vs[BK * STRIDE];
shared float scores[BQ * BK];
shared float weights[BQ * BK];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint d = p.head_dim;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok = p.n_kv_heads * d;
    uint q_tok = p.n_heads * d;
    uint r = tid / BK;
    uint j = tid % BK;
    for (uint t0 = gl_WorkGroupID.y * BQ; t0 < p.n_tokens; t0 += gl_NumWorkGroups.y * BQ) {
        uint rows = min(BQ, p.n_tokens - t0);
        for (uint i = tid; i < BQ * d; i += THREADS) {
            uint rr = i / d;
            uint c = i % d;
            qs[rr * STRIDE + c] = rr < rows ? q[(t0 + rr) * q_tok + h * d + c] : 0.0;
        }
        bool live = r < rows;
        uint t = t0 + r;
        // Keys this row sees, and keys any row of the tile sees (the last row's).
        uint n_keys = live ? p.pos0 + t + 1 : 0;
        uint tile_keys = p.pos0 + t0 + rows;
        float m = NEG_INF;
        float l = 0.0;
        float acc[PER];
        for (uint i = 0; i < PER; i++) acc[i] = 0.0;
        barrier();
        for (uint base = 0; base < tile_keys; base += BK) {
            uint nb = min(BK, tile_keys - base);
            for (uint i = tid; i < BK * d; i += THREADS) {
                uint jj = i / d;
                uint c = i % d;
                bool in_block = jj < nb;
                uint src = (base + jj) * kv_tok + g * d + c;
                ks[jj * STRIDE + c] = in_block ? k[src] : 0.0;
                vs[jj * STRIDE + c] = in_block ? v[src] : 0.0;
            }
            barrier();
            float dot = 0.0;
            for (uint c = 0; c < d; c++) dot += qs[r * STRIDE + c] * ks[j * STRIDE + c];
            // base + j < n_keys also means j < nb: n_keys <= tile_keys.
            float s = base + j < n_keys ? dot * p.scale : NEG_INF;
            scores[r * BK + j] = s;
            barrier();
            float new_m = m;
            for (uint jj = 0; jj < BK; jj++) new_m = max(new_m, scores[r * BK + jj]);
            weights[r * BK + j] = s == NEG_INF ? 0.0 : exp(s - new_m);
            barrier();
            float block_sum = 0.0;
            for (uint jj = 0; jj < BK; jj++) block_sum += weights[r * BK + jj];
            float corr = m == NEG_INF ? 0.0 : exp(m - new_m);
            l = l * corr + block_sum;
            for (uint i = 0; i < PER; i++) {
                uint c = j + BK * i;
                if (c >= d) break;
                float a = acc[i] * corr;
                for (uint jj = 0; jj < nb; jj++) a += weights[r * BK + jj] * vs[jj * STRIDE + c];
                acc[i] = a;
            }
            m = new_m;
            barrier(); // ks, vs, scores and weights are rewritten by the next block
        }
        if (live) {
            for (uint i = 0; i < PER; i++) {
                uint c = j + BK * i;
                if (c >= d) break;
                o[t * q_tok + h * d + c] = acc[i] / l;
            }
        }
        barrier(); // qs is rewritten for the next tile
    }
}
