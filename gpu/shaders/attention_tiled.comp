#version 450
// Causal grouped-query attention, tiled (FlashAttention-style) for head_dim <= 128: a
// workgroup of 64 threads takes BQ = 16 consecutive query tokens of one head and walks the
// keys in blocks of BK = 16 staged in shared memory, so each K/V row is read from global
// memory once per 16 queries (attention.comp reads it once per query). Online softmax per
// query row: running max m and sum l, the accumulator rescaled when the max grows.
// Thread tid owns query row r = tid / 4; of each key block it scores keys part*4 ..
// part*4+3 (part = tid % 4) and accumulates output dims part, part+4, part+8, ... (the 4
// threads of a row read neighbouring V words). Shared rows are padded to D_MAX + 1 words so
// that threads reading different rows at the same column hit different banks.
// Layouts as attention.comp: q, out [n_tokens, n_heads, head_dim]; k, v [kv, n_kv_heads,
// head_dim]; query t sits at position pos0 + t and sees keys 0..=pos0+t.
layout(local_size_x = 64) in;

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

const uint BQ = 16;
const uint BK = 16;
const uint D_MAX = 128;
const uint STRIDE = D_MAX + 1;
const uint PER = D_MAX / 4;
const float NEG_INF = -1.0 / 0.0;

shared float qs[BQ * STRIDE];
shared float ks[BK * STRIDE];
shared float vs[BK * STRIDE];
shared float ps[BQ * BK];
shared float row_max_part[64];
shared float row_sum_part[64];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint d = p.head_dim;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok = p.n_kv_heads * d;
    uint q_tok = p.n_heads * d;
    uint r = tid / 4;
    uint part = tid % 4;
    for (uint t0 = gl_WorkGroupID.y * BQ; t0 < p.n_tokens; t0 += gl_NumWorkGroups.y * BQ) {
        uint rows = min(BQ, p.n_tokens - t0);
        for (uint i = tid; i < BQ * d; i += 64) {
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
            for (uint i = tid; i < BK * d; i += 64) {
                uint j = i / d;
                uint c = i % d;
                bool in_block = j < nb;
                uint src = (base + j) * kv_tok + g * d + c;
                ks[j * STRIDE + c] = in_block ? k[src] : 0.0;
                vs[j * STRIDE + c] = in_block ? v[src] : 0.0;
            }
            barrier();
            float s[4];
            float block_max = NEG_INF;
            for (uint jj = 0; jj < 4; jj++) {
                uint j = part * 4 + jj;
                float dot = 0.0;
                for (uint c = 0; c < d; c++) dot += qs[r * STRIDE + c] * ks[j * STRIDE + c];
                // base + j < n_keys also means j < nb: n_keys <= tile_keys.
                s[jj] = base + j < n_keys ? dot * p.scale : NEG_INF;
                block_max = max(block_max, s[jj]);
            }
            row_max_part[tid] = block_max;
            barrier();
            uint q4 = r * 4;
            float new_m = max(max(m, max(row_max_part[q4], row_max_part[q4 + 1])),
                              max(row_max_part[q4 + 2], row_max_part[q4 + 3]));
            float part_sum = 0.0;
            for (uint jj = 0; jj < 4; jj++) {
                float w = s[jj] == NEG_INF ? 0.0 : exp(s[jj] - new_m);
                ps[r * BK + part * 4 + jj] = w;
                part_sum += w;
            }
            row_sum_part[tid] = part_sum;
            barrier();
            float corr = m == NEG_INF ? 0.0 : exp(m - new_m);
            l = l * corr + (row_sum_part[q4] + row_sum_part[q4 + 1])
                         + (row_sum_part[q4 + 2] + row_sum_part[q4 + 3]);
            for (uint i = 0; i < PER; i++) {
                uint c = part + 4 * i;
                if (c >= d) break;
                float a = acc[i] * corr;
                for (uint j = 0; j < nb; j++) a += ps[r * BK + j] * vs[j * STRIDE + c];
                acc[i] = a;
            }
            m = new_m;
            barrier(); // ks, vs, ps and the partials are rewritten by the next block
        }
        if (live) {
            for (uint i = 0; i < PER; i++) {
                uint c = part + 4 * i;
                if (c >= d) break;
                o[t * q_tok + h * d + c] = acc[i] / l;
            }
        }
        barrier(); // qs is rewritten for the next tile
    }
}
