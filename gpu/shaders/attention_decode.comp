#version 450
#extension GL_EXT_control_flow_attributes : require
// Causal grouped-query attention for few query tokens (decode): one workgroup of 64
// threads per (head, token) walks the token's keys in blocks of 64, one key per thread:
// its score q·k, the block's max and sum (shared-memory trees), an online softmax across
// blocks (running max m and sum l), then O = corr·O + P·V with each thread owning one
// vec4 of the head's dims over a slice of the block's keys (reads of V rows coalesced),
// the slices summed at the end. The prefill kernels (attention_flash.comp) give one token
// one workgroup per head that walks 32 keys at a time with 32-row tiles almost empty.
//
// Token t sits at position pos0 + t and sees keys 0 ..= pos0 + t; with flags bit 0 its
// position is positions[t] instead, so a recorded decode step attends over however many
// keys the cache holds when it is replayed. With a sliding window w > 0 it sees only its
// last w keys (the walk of every split starts at pos + 1 - w at the earliest; 0: all
// keys). Layouts as attention_flash.comp: q, out
// [n_tokens, n_heads, head_dim]; k, v [kv, n_kv_heads, head_dim]; head_dim a multiple of
// 4, at most 256.
//
// Split over keys (flash decoding): with splits > 1 the workgroups of z = 0 .. splits
// each walk their own run of blocks (the runs fixed by kv_len, so a recording replays at
// any position) and write their running max, sum and unnormalized output to part, then
// count themselves in on their (token, head)'s counter; the last to arrive merges the
// splits into out and sets the counter back to 0 for the next replay (the
// threadfence-reduction pattern of attention_flash_khr.glsl: the partials are `coherent`
// and a buffer barrier orders them before the atomic). The merge in the same dispatch
// spares a second dispatch and the barrier before it. part holds
// [n_tokens * n_heads counters, padded to a multiple of 4 words] then
// [n_tokens, n_heads, splits] records of head_dim + 4 floats (m, l, two unused, the
// output); the counters start at zero. One (head, token) alone is a handful of workgroups
// on a GPU with a hundred cores, each walking every block.
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 1) readonly buffer K { vec4 k[]; };
layout(std430, binding = 2) readonly buffer V { vec4 v[]; };
layout(std430, binding = 3) writeonly buffer O { vec4 o[]; };
layout(std430, binding = 4) readonly buffer Positions { uint positions[]; };
layout(std430, binding = 5) coherent buffer Part { uint part[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint pos0;
    uint kv_len;   // keys the caches hold (a bound on every position + 1)
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    float scale;
    uint flags;    // bit 0: positions from the buffer
    uint splits;   // workgroups along z, each over its own run of key blocks
    uint pad[5];
    uint window;   // keys a token sees at most; 0: all
    uint pad2;
} p;

const uint T = 64;
const uint MAX_D4 = 64;
const float NEG_INF = -1.0 / 0.0;

shared vec4 qs[MAX_D4];
shared float ps[T];
shared float red[T];
shared vec4 acc_red[T];
shared bool last_arrival;

// part as vec4s past the counters: vec4 i at words 4 * i ..
uint records_base() { return (p.n_tokens * p.n_heads + 3u) / 4u; }
void store4(uint i, vec4 x) {
    uvec4 w = floatBitsToUint(x);
    part[4 * i] = w.x;
    part[4 * i + 1] = w.y;
    part[4 * i + 2] = w.z;
    part[4 * i + 3] = w.w;
}
vec4 load4(uint i) {
    return uintBitsToFloat(uvec4(part[4 * i], part[4 * i + 1], part[4 * i + 2], part[4 * i + 3]));
}

// Reduces red[0 .. T) into red[0]: max when `is_max`, else the sum.
void reduce(bool is_max) {
    [[unroll]] for (uint s = T / 2; s > 0; s >>= 1) {
        uint tid = gl_LocalInvocationID.x;
        if (tid < s) red[tid] = is_max ? max(red[tid], red[tid + s]) : red[tid] + red[tid + s];
        barrier();
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint d4 = p.head_dim / 4;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok4 = p.n_kv_heads * d4;
    uint q_tok4 = p.n_heads * d4;
    uint pos = (p.flags & 1u) != 0u ? positions[t] : p.pos0 + t;
    uint keys = min(pos + 1, p.kv_len);
    if (tid < d4) qs[tid] = q[t * q_tok4 + h * d4 + tid];
    // PV layout: lane = dims vec4, slice = which keys of a block.
    uint slices = T / d4;
    uint lane = tid % d4;
    uint slice = tid / d4;
    vec4 acc = vec4(0.0);
    float m = NEG_INF;
    float l = 0.0;
    uint split = gl_WorkGroupID.z;
    uint run = ((p.kv_len + T - 1) / T + p.splits - 1) / p.splits * T;
    uint first = split * run;
    uint end = min(keys, first + run);
    if (p.window != 0u && keys > p.window) first = max(first, keys - p.window);
    barrier();
    for (uint k0 = first; k0 < end; k0 += T) {
        uint j = k0 + tid;
        float s = NEG_INF;
        if (j < end) {
            uint base = j * kv_tok4 + g * d4;
            float dotp = 0.0;
            for (uint c = 0; c < d4; c++) dotp += dot(qs[c], k[base + c]);
            s = dotp * p.scale;
        }
        red[tid] = s;
        barrier();
        reduce(true);
        float m_new = max(m, red[0]);
        barrier();
        float e = j < end ? exp(s - m_new) : 0.0;
        ps[tid] = e;
        red[tid] = e;
        barrier();
        reduce(false);
        float corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        acc *= corr;
        if (slice < slices) {
            uint block = min(T, end - k0);
            for (uint jj = slice; jj < block; jj += slices) {
                acc += ps[jj] * v[(k0 + jj) * kv_tok4 + g * d4 + lane];
            }
        }
        barrier();
    }
    acc_red[tid] = slice < slices ? acc : vec4(0.0);
    barrier();
    if (slice == 0 && tid < d4) {
        vec4 sum = vec4(0.0);
        for (uint s = 0; s < slices; s++) sum += acc_red[s * d4 + lane];
        if (p.splits == 1) {
            o[t * q_tok4 + h * d4 + lane] = sum / l;
        } else {
            uint rec = records_base() + ((t * p.n_heads + h) * p.splits + split) * (d4 + 1);
            if (tid == 0) store4(rec, vec4(m, l, 0.0, 0.0));
            store4(rec + 1 + lane, sum);
        }
    }
    if (p.splits == 1) return;
    memoryBarrierBuffer();
    barrier();
    uint counter = t * p.n_heads + h;
    if (tid == 0) last_arrival = atomicAdd(part[counter], 1u) == p.splits - 1;
    barrier();
    if (!last_arrival) return;
    memoryBarrierBuffer();
    if (tid == 0) part[counter] = 0u; // every split has counted in: ready for the next replay
    if (tid >= d4) return;
    uint base = records_base() + (t * p.n_heads + h) * p.splits * (d4 + 1);
    float mx = NEG_INF;
    for (uint s = 0; s < p.splits; s++) mx = max(mx, load4(base + s * (d4 + 1)).x);
    float l_all = 0.0;
    vec4 out_acc = vec4(0.0);
    for (uint s = 0; s < p.splits; s++) {
        uint r = base + s * (d4 + 1);
        vec2 ml = load4(r).xy;
        if (ml.y == 0.0) continue; // a split that saw no key (m = -inf, l = 0)
        float w = exp(ml.x - mx);
        l_all += w * ml.y;
        out_acc += w * load4(r + 1 + tid);
    }
    o[t * q_tok4 + h * d4 + tid] = out_acc / l_all;
}
