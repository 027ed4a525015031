#version 450
// Causal grouped-query attention over a KV cache, one workgroup of 64 threads per
// (query token, head). Query t sits at absolute position pos0 + t and sees keys 0..=pos0+t;
// head h reads KV head h / (n_heads / n_kv_heads). Keys are taken 64 at a time (one per
// thread for the q·k score), with an online softmax (running max and sum, rescaled per
// block) so any cache length works in one pass; each thread owns output dims tid, tid+64, ...
// Layouts: q, out [n_tokens, n_heads, head_dim]; k, v [kv_len, n_kv_heads, head_dim].
// With a sliding window w > 0 (push word 14) query t sees only its last w keys,
// pos0 + t + 1 - w ..= pos0 + t: the walk starts there (0 = no window, the walk from key 0).
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
    uint pad[7];
    uint window;  // keys a query sees at most; 0: all
    uint pad2;
} p;

const uint D_MAX = 256;
shared float qs[D_MAX];
shared float wts[64];
shared float red[64];

float reduce_max(uint tid, float x) {
    red[tid] = x;
    barrier();
    for (uint h = 32; h > 0; h >>= 1) {
        if (tid < h) red[tid] = max(red[tid], red[tid + h]);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

float reduce_sum(uint tid, float x) {
    red[tid] = x;
    barrier();
    for (uint h = 32; h > 0; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint d = p.head_dim;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok = p.n_kv_heads * d;
    for (uint t = gl_WorkGroupID.y; t < p.n_tokens; t += gl_NumWorkGroups.y) {
        uint qbase = (t * p.n_heads + h) * d;
        for (uint i = tid; i < d; i += 64) qs[i] = q[qbase + i];
        barrier();
        uint n_keys = p.pos0 + t + 1;
        uint first = p.window != 0u && n_keys > p.window ? n_keys - p.window : 0u;
        float m = -1.0 / 0.0;
        float l = 0.0;
        float acc[D_MAX / 64];
        for (uint i = 0; i < D_MAX / 64; i++) acc[i] = 0.0;
        for (uint base = first; base < n_keys; base += 64) {
            uint j = base + tid;
            float s = -1.0 / 0.0;
            if (j < n_keys) {
                uint kb = j * kv_tok + g * d;
                float dot = 0.0;
                for (uint i = 0; i < d; i++) dot += qs[i] * k[kb + i];
                s = dot * p.scale;
            }
            float new_m = max(m, reduce_max(tid, s));
            float wgt = j < n_keys ? exp(s - new_m) : 0.0;
            wts[tid] = wgt;
            float corr = exp(m - new_m);
            l = l * corr + reduce_sum(tid, wgt); // reduce_sum's barriers publish wts too
            uint nb = min(64u, n_keys - base);
            for (uint i = 0; i < D_MAX / 64; i++) {
                uint di = tid + 64 * i;
                if (di >= d) break;
                float a = acc[i] * corr;
                for (uint jj = 0; jj < nb; jj++) a += wts[jj] * v[(base + jj) * kv_tok + g * d + di];
                acc[i] = a;
            }
            m = new_m;
            barrier(); // wts is rewritten by the next block
        }
        for (uint i = 0; i < D_MAX / 64; i++) {
            uint di = tid + 64 * i;
            if (di < d) o[qbase + di] = acc[i] / l;
        }
        barrier(); // qs is rewritten for the next token
    }
}
