#version 450
// The queries, keys and values of a layer whose family adds a bias or normalizes q and k
// per head (Qwen2, Gemma 3), from the product of the plain q/k/v GEMM, ready for
// attention: one workgroup of 64 threads per (row, head slot), the slots being the
// n_heads query heads, then the n_kv_heads key heads, then the n_kv_heads value heads.
// A query or key head gets, in order, its bias (flags bit 2), its RMSNorm over head_dim
// with the q or k norm weight (flags bit 3), and RoPE: the pair (2i, 2i+1) (adjacent) or
// (i, i + d/2) (half-split, flags bit 1) rotated by the host's table cs[a * ldcs + i];
// a value head gets its bias. Queries go to q_out [rows, n_heads * d]; keys and values to
// row c of the layer's caches. a = row and c = pos0 + row (the table holds the chunk's
// rows), or with flags bit 0 a = c = positions[row] (a recorded decode step: the table
// holds every position). The CPU path runs the same steps in the same order
// (exec/src/family.rs, then RoPE).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
layout(std430, binding = 1) readonly buffer Bias { float bias[]; };
layout(std430, binding = 2) readonly buffer Norm { float norm_w[]; };
layout(std430, binding = 3) readonly buffer Cs { vec2 cs[]; };
layout(std430, binding = 4) writeonly buffer QOut { float q_out[]; };
layout(std430, binding = 5) writeonly buffer Kc { float kc[]; };
layout(std430, binding = 6) writeonly buffer Vc { float vc[]; };
layout(std430, binding = 7) readonly buffer Positions { uint positions[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint ld_in;    // row stride of qkv in floats
    uint ld_q;     // row stride of q_out in floats
    uint ld_kv;    // row stride of the caches in floats
    uint ldcs;     // row stride of the RoPE table in (cos, sin) pairs
    uint pos0;
    uint flags;    // bit 0 positions buffer, 1 half-split, 2 bias, 3 qk-norm
    float eps;
    uint pad[5];
} p;

const uint D_MAX = 256;
shared float xs[D_MAX];
shared float red[64];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint slot = gl_WorkGroupID.x;
    uint row = gl_WorkGroupID.y;
    uint d = p.head_dim;
    uint kv_cols = p.n_kv_heads * d;
    uint col0 = slot * d; // the head's first column of qkv (q, then k, then v)
    bool is_q = slot < p.n_heads;
    bool is_v = slot >= p.n_heads + p.n_kv_heads;
    bool from_buffer = (p.flags & 1u) != 0u;
    uint at = from_buffer ? positions[row] : p.pos0 + row;
    uint angle_row = from_buffer ? positions[row] : row;
    for (uint i = tid; i < d; i += 64) {
        float x = qkv[row * p.ld_in + col0 + i];
        if ((p.flags & 4u) != 0u) x += bias[col0 + i];
        xs[i] = x;
    }
    barrier();
    uint local = col0 - (is_q ? 0u : (is_v ? p.n_heads * d + kv_cols : p.n_heads * d));
    if (is_v) {
        for (uint i = tid; i < d; i += 64) vc[at * p.ld_kv + local + i] = xs[i];
        return;
    }
    if ((p.flags & 8u) != 0u) {
        float s = 0.0;
        for (uint i = tid; i < d; i += 64) s += xs[i] * xs[i];
        red[tid] = s;
        barrier();
        for (uint h = 32; h > 0; h >>= 1) {
            if (tid < h) red[tid] += red[tid + h];
            barrier();
        }
        float inv = 1.0 / sqrt(red[0] / float(d) + p.eps);
        uint w0 = is_q ? 0u : d; // q's weight, then k's
        for (uint i = tid; i < d; i += 64) xs[i] = xs[i] * inv * norm_w[w0 + i];
        barrier();
    }
    bool split = (p.flags & 2u) != 0u;
    uint half_ = d / 2;
    for (uint i = tid; i < half_; i += 64) {
        uint ia = split ? i : 2 * i;
        uint ib = split ? i + half_ : 2 * i + 1;
        vec2 r = cs[angle_row * p.ldcs + i];
        float x0 = xs[ia];
        float x1 = xs[ib];
        float y0 = x0 * r.x - x1 * r.y;
        float y1 = x0 * r.y + x1 * r.x;
        if (is_q) {
            q_out[row * p.ld_q + local + ia] = y0;
            q_out[row * p.ld_q + local + ib] = y1;
        } else {
            kc[at * p.ld_kv + local + ia] = y0;
            kc[at * p.ld_kv + local + ib] = y1;
        }
    }
}
