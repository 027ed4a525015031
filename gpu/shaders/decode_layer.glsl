#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// The llama decoder layers of one token's decode step in one dispatch (up to MAX_LAYERS
// of them, which the including kernel sets; a layer's weights and caches are elements of
// descriptor arrays, 6 · MAX_LAYERS + 9 storage buffers in all): per layer
// the five stages the step otherwise runs as five dispatches (q/k/v with the norm prologue, RoPE and the
// cache write; attention over the cache; o with the residual add; gate/up with the norm
// prologue and SiLU·up; down with the residual add), separated by grid barriers instead
// of pipeline barriers. A pipeline barrier between dependent dispatches costs about 6 µs
// on an H100 (a dispatch drains before the next starts), more than most of a decode
// step's small products take; a grid barrier is one atomic add per workgroup and a spin
// on the counter in L2.
//
// The workgroups are persistent: each walks the units of a stage (a quad of output
// columns, or a (head, key run) of attention) with a stride of the grid, then meets every
// other workgroup at the barrier. A barrier can only complete if every workgroup of the
// grid runs at once, so the host sizes the grid to what the device keeps resident (a few
// workgroups per multiprocessor) and to one workgroup on a CPU implementation, where
// workgroups may run one after another. A workgroup that spins past SPIN_LIMIT gives up
// (every later barrier of the dispatch is skipped) and raises its layer's flag to 2.0, so
// a device that did not keep the grid resident yields an error, not a hang.
//
// The stages' arithmetic is that of the dispatches they replace: gemv_fused.glsl's
// one-row product (128 threads a quad of columns, partial sums met through subgroupAdd;
// the norm's weight folded into W; gemm_fused_epilogue.glsl's epilogues) and
// attention_decode.comp (online softmax over blocks of keys, runs of blocks merged by
// the last workgroup of a head to arrive), here with blocks of 128 keys. f32 weights,
// dense rows (every row stride is its k), one token; its position is positions[0].
//
// Values one workgroup writes and another reads after a barrier (the stream, q, the new
// cache row, attention's output, the gate/up product, the partials) live in `coherent`
// buffers, so their loads are not served from a stale L1; the weights are read-only.
layout(local_size_x = 128) in;
const uint THREADS = 128;
const uint MAX_D4 = 64;
const float NEG_INF = -1.0 / 0.0;
const uint SPIN_LIMIT = 1u << 24;

layout(std430, binding = 0) coherent buffer X { vec4 x[]; };
layout(std430, binding = 1) readonly buffer Wqkv { vec4 w[]; } w_qkv[MAX_LAYERS];
layout(std430, binding = 2) readonly buffer Wo { vec4 w[]; } w_o[MAX_LAYERS];
layout(std430, binding = 3) readonly buffer Wgu { vec4 w[]; } w_gu[MAX_LAYERS];
layout(std430, binding = 4) readonly buffer Wdown { vec4 w[]; } w_down[MAX_LAYERS];
layout(std430, binding = 5) readonly buffer Cs { vec2 cs[]; };
layout(std430, binding = 6) coherent buffer Kc { vec4 v[]; } kc[MAX_LAYERS];
layout(std430, binding = 7) coherent buffer Vc { vec4 v[]; } vc[MAX_LAYERS];
layout(std430, binding = 8) readonly buffer Positions { uint positions[]; };
layout(std430, binding = 9) coherent buffer Q { vec4 q[]; };
layout(std430, binding = 10) coherent buffer Attn { vec4 attn[]; };
layout(std430, binding = 11) coherent buffer Hidden { vec4 hid[]; };
layout(std430, binding = 12) buffer Flags { float flags[]; };
layout(std430, binding = 13) coherent buffer Part { uint part[]; };
layout(std430, binding = 14) coherent volatile buffer Sync { uint sync_words[]; };

layout(push_constant) uniform Push {
    uint hidden4;   // hidden / 4: the stream's vec4s (k of q/k/v and gate/up; o's, down's quads)
    uint ffn4;      // ffn / 4: down's k in vec4s (gate/up has 2 ffn rows)
    float eps;      // the norms' epsilon
    uint qcols;     // n_heads · head_dim
    uint kvcols;    // n_kv_heads · head_dim (= a cache row's floats)
    uint head_dim;
    uint ldcs;      // RoPE table row stride in (cos, sin) pairs
    uint flags;     // bit 1: half-split RoPE; bit 2: prefetch a later stage's weights
    uint n_heads;
    uint n_kv_heads;
    uint kv_len;    // cache rows (a bound on every position + 1)
    float scale;    // attention's 1/sqrt(head_dim)
    uint splits;    // key runs per head
    uint slot0;     // flag of the first layer's attention residual add (then its FFN's, the next layer's, ...)
    uint layers;    // layers of this dispatch
    uint sync;      // this dispatch's counter in Sync (zero when the dispatch starts)
} p;

// The layer being run (dynamically uniform: every invocation walks the layers together).
uint layer = 0u;
uint slot_o() { return p.slot0 + 2u * layer; }

shared vec4 red4[THREADS];
shared float red1[THREADS];
shared vec4 qs[MAX_D4];
shared float ps[THREADS];
shared bool last_arrival;
shared bool gave_up;

vec4 load_w_of(uint which, uint l, uint i);

// Prefetch: at the start of a stage every thread issues up to PREFETCH_LOADS loads, one
// per 128-byte line of the weight rows this workgroup will read in a later stage, and
// uses them only at the next barrier. The loads fly while the stage computes and the
// workgroup waits, and the later stage finds its weights in the cache (a load of
// weights from memory otherwise costs each stage about a microsecond before its first
// product). A NaN among them raises the flag their own stage would raise.
const uint PREFETCH_LOADS = 4u;
float prefetched[PREFETCH_LOADS];
uint prefetch_slot = 0u;

// Issues the prefetch of stage `which`'s rows of layer `l` (`quads` quads in the stage,
// k4 vec4s a row), whose residual add raises `slot`.
void prefetch(uint which, uint l, uint quads, uint k4, uint slot) {
    uint tid = gl_LocalInvocationID.x;
    uint wg = gl_WorkGroupID.x;
    uint groups = gl_NumWorkGroups.x;
    uint lines_per_row = (k4 + 7u) / 8u;
    uint my_quads = quads > wg ? (quads - wg + groups - 1u) / groups : 0u;
    uint lines = (p.flags & 4u) != 0u ? my_quads * 4u * lines_per_row : 0u;
    prefetch_slot = slot;
    [[unroll]] for (uint u = 0u; u < PREFETCH_LOADS; u++) {
        uint line = tid + u * THREADS;
        prefetched[u] = 0.0;
        if (line < lines) {
            uint r = line / lines_per_row; // which of the workgroup's rows
            uint row = 4u * (wg + (r / 4u) * groups) + r % 4u;
            prefetched[u] = load_w_of(which, l, row * k4 + (line % lines_per_row) * 8u).x;
        }
    }
}

// Uses the prefetched values (waiting for them).
void prefetch_settle() {
    float sum = 0.0;
    [[unroll]] for (uint u = 0u; u < PREFETCH_LOADS; u++) sum += prefetched[u];
    if (isnan(sum)) flags[prefetch_slot] = 1.0;
    [[unroll]] for (uint u = 0u; u < PREFETCH_LOADS; u++) prefetched[u] = 0.0;
}

// Every workgroup of the grid arrives, then waits until all have (see the header).
void grid_barrier() {
    prefetch_settle();
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0 && !gave_up) {
        uint groups = gl_NumWorkGroups.x;
        // The arrivals at one barrier are the values [b · groups, (b + 1) · groups): no
        // workgroup passes barrier b before all have arrived at it.
        uint target = (atomicAdd(sync_words[p.sync], 1u) / groups + 1u) * groups;
        uint spins = 0u;
        while (sync_words[p.sync] < target) {
            if (++spins > SPIN_LIMIT) {
                gave_up = true;
                flags[slot_o()] = 2.0;
                break;
            }
        }
    }
    barrier();
    memoryBarrierBuffer();
}

// Stage `which`'s operands: 0 q/k/v (A = the stream), 1 o (attention's output), 2
// gate/up (the stream), 3 down (the gate/up product).
vec4 load_a(uint which, uint i) {
    if (which == 1u) return attn[i];
    if (which == 3u) return hid[i];
    return x[i];
}
vec4 load_w_of(uint which, uint l, uint i) {
    if (which == 0u) return w_qkv[l].w[i];
    if (which == 1u) return w_o[l].w[i];
    if (which == 2u) return w_gu[l].w[i];
    return w_down[l].w[i];
}
vec4 load_w(uint which, uint i) { return load_w_of(which, layer, i); }

// The four sums of W rows col .. col + 3 against A (k4 vec4s), and A's sum of squares,
// in every thread.
vec4 gemv_quad(uint which, uint col, uint k4, out float ss_out) {
    uint tid = gl_LocalInvocationID.x;
    vec4 acc = vec4(0.0);
    float ss = 0.0;
    for (uint kk = tid; kk < k4; kk += THREADS) {
        vec4 a = load_a(which, kk);
        vec4 w0 = load_w(which, col * k4 + kk);
        vec4 w1 = load_w(which, (col + 1u) * k4 + kk);
        vec4 w2 = load_w(which, (col + 2u) * k4 + kk);
        vec4 w3 = load_w(which, (col + 3u) * k4 + kk);
        acc += vec4(dot(a, w0), dot(a, w1), dot(a, w2), dot(a, w3));
        ss += dot(a, a);
    }
    vec4 sum = subgroupAdd(acc);
    float sum_ss = subgroupAdd(ss);
    if (subgroupElect()) {
        red4[gl_SubgroupID] = sum;
        red1[gl_SubgroupID] = sum_ss;
    }
    barrier();
    vec4 total = red4[0];
    float total_ss = red1[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) {
        total += red4[i];
        total_ss += red1[i];
    }
    barrier(); // red4 and red1 are written again by the next quad
    ss_out = total_ss;
    return total;
}

// The norm prologue's scale of a stream row with sum of squares ss.
float norm_scale(float ss) {
    return inversesqrt(ss / float(4u * p.hidden4) + p.eps);
}

// One float of q (region 0), the key cache (1) or the value cache (2).
void put(uint region, uint i, float v) {
    if (region == 0u) q[i >> 2][i & 3u] = v;
    else if (region == 1u) kc[layer].v[i >> 2][i & 3u] = v;
    else vc[layer].v[i >> 2][i & 3u] = v;
}

// gemm_fused_epilogue.glsl's store_qkv for the token at `pos`: the rotated pair (x0, x1)
// of q/k/v columns (col, col + 1).
void store_qkv(uint pos, uint col, float x0, float x1) {
    uint d = p.head_dim;
    uint region = col < p.qcols ? 0u : (col < p.qcols + p.kvcols ? 1u : 2u);
    uint local = col - (region == 0u ? 0u : (region == 1u ? p.qcols : p.qcols + p.kvcols));
    uint base = region == 0u ? 0u : pos * p.kvcols;
    if (region == 2u) {
        put(2u, base + local, x0);
        put(2u, base + local + 1u, x1);
        return;
    }
    uint head = local / d;
    uint i = (local % d) / 2u;
    vec2 r = cs[pos * p.ldcs + i];
    bool split = (p.flags & 2u) != 0u;
    put(region, base + head * d + (split ? i : 2u * i), x0 * r.x - x1 * r.y);
    put(region, base + head * d + (split ? i + d / 2u : 2u * i + 1u), x0 * r.y + x1 * r.x);
}

// Adds the quad's sums into the stream and raises `slot` when a sum is not finite.
void residual(uint quad, vec4 v, uint slot) {
    vec4 y = x[quad] + v;
    x[quad] = y;
    if (any(isnan(y)) || any(isinf(y))) flags[slot] = 1.0;
}

// Reduces red1[0 .. THREADS) into red1[0]: max when `is_max`, else the sum.
void reduce(bool is_max) {
    uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint s = THREADS / 2u; s > 0u; s >>= 1u) {
        if (tid < s) red1[tid] = is_max ? max(red1[tid], red1[tid + s]) : red1[tid] + red1[tid + s];
        barrier();
    }
}

// The layer's region of part, in vec4s: its counters, then its records.
uint part_base() {
    uint d4 = p.head_dim / 4u;
    return layer * ((p.n_heads + 3u) / 4u + p.n_heads * p.splits * (d4 + 1u));
}
uint counter(uint h) { return 4u * part_base() + h; }
// part as vec4s past the layer's counters.
uint records_base() { return part_base() + (p.n_heads + 3u) / 4u; }
void store4(uint i, vec4 v) {
    uvec4 w = floatBitsToUint(v);
    part[4u * i] = w.x;
    part[4u * i + 1u] = w.y;
    part[4u * i + 2u] = w.z;
    part[4u * i + 3u] = w.w;
}
vec4 load4(uint i) {
    return uintBitsToFloat(uvec4(part[4u * i], part[4u * i + 1u], part[4u * i + 2u], part[4u * i + 3u]));
}

// Attention of head h over key run `split` (attention_decode.comp with T = THREADS).
void attention_unit(uint h, uint split, uint pos) {
    const uint T = THREADS;
    uint tid = gl_LocalInvocationID.x;
    uint d4 = p.head_dim / 4u;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok4 = p.kvcols / 4u;
    uint keys = min(pos + 1u, p.kv_len);
    if (tid < d4) qs[tid] = q[h * d4 + tid];
    uint slices = T / d4;
    uint lane = tid % d4;
    uint slice = tid / d4;
    vec4 acc = vec4(0.0);
    float m = NEG_INF;
    float l = 0.0;
    uint run = ((p.kv_len + T - 1u) / T + p.splits - 1u) / p.splits * T;
    uint first = split * run;
    uint end = min(keys, first + run);
    barrier();
    for (uint k0 = first; k0 < end; k0 += T) {
        uint j = k0 + tid;
        float s = NEG_INF;
        if (j < end) {
            // Eight loads in flight before the first product (a loop of load-then-use
            // waits out the cache's latency once per vec4); the sum in the order of dims.
            uint base = j * kv_tok4 + g * d4;
            float dotp = 0.0;
            for (uint c0 = 0u; c0 < d4; c0 += 8u) {
                vec4 kv[8];
                [[unroll]] for (uint u = 0u; u < 8u; u++) {
                    kv[u] = c0 + u < d4 ? kc[layer].v[base + c0 + u] : vec4(0.0);
                }
                [[unroll]] for (uint u = 0u; u < 8u; u++) {
                    if (c0 + u < d4) dotp += dot(qs[c0 + u], kv[u]);
                }
            }
            s = dotp * p.scale;
        }
        red1[tid] = s;
        barrier();
        reduce(true);
        float m_new = max(m, red1[0]);
        barrier();
        float e = j < end ? exp(s - m_new) : 0.0;
        ps[tid] = e;
        red1[tid] = e;
        barrier();
        reduce(false);
        float corr = exp(m - m_new);
        l = l * corr + red1[0];
        m = m_new;
        acc *= corr;
        if (slice < slices) {
            uint block = min(T, end - k0);
            // Four keys' loads in flight at once, added in key order.
            for (uint jj = slice; jj < block; jj += 4u * slices) {
                vec4 vv[4];
                [[unroll]] for (uint u = 0u; u < 4u; u++) {
                    uint key = jj + u * slices;
                    vv[u] = key < block ? vc[layer].v[(k0 + key) * kv_tok4 + g * d4 + lane] : vec4(0.0);
                }
                [[unroll]] for (uint u = 0u; u < 4u; u++) {
                    uint key = jj + u * slices;
                    if (key < block) acc += ps[key] * vv[u];
                }
            }
        }
        barrier();
    }
    red4[tid] = slice < slices ? acc : vec4(0.0);
    barrier();
    if (slice == 0u && tid < d4) {
        vec4 sum = vec4(0.0);
        for (uint s = 0u; s < slices; s++) sum += red4[s * d4 + lane];
        if (p.splits == 1u) {
            attn[h * d4 + lane] = sum / l;
        } else {
            uint rec = records_base() + (h * p.splits + split) * (d4 + 1u);
            if (tid == 0u) store4(rec, vec4(m, l, 0.0, 0.0));
            store4(rec + 1u + lane, sum);
        }
    }
    if (p.splits > 1u) {
        memoryBarrierBuffer();
        barrier();
        if (tid == 0u) last_arrival = atomicAdd(part[counter(h)], 1u) == p.splits - 1u;
        barrier();
        if (last_arrival) {
            memoryBarrierBuffer();
            if (tid == 0u) part[counter(h)] = 0u; // every run has counted in: ready for the next step
            if (tid < d4) {
                uint base = records_base() + h * p.splits * (d4 + 1u);
                float mx = NEG_INF;
                for (uint s = 0u; s < p.splits; s++) mx = max(mx, load4(base + s * (d4 + 1u)).x);
                float l_all = 0.0;
                vec4 out_acc = vec4(0.0);
                for (uint s = 0u; s < p.splits; s++) {
                    uint r = base + s * (d4 + 1u);
                    vec2 ml = load4(r).xy;
                    if (ml.y == 0.0) continue; // a run that saw no key
                    float w = exp(ml.x - mx);
                    l_all += w * ml.y;
                    out_acc += w * load4(r + 1u + tid);
                }
                attn[h * d4 + tid] = out_acc / l_all;
            }
        }
    }
    barrier(); // qs, ps, red1, red4 and last_arrival are written again by the next unit
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint groups = gl_NumWorkGroups.x;
    uint wg = gl_WorkGroupID.x;
    if (tid == 0u) gave_up = false;
    barrier();
    uint pos = positions[0];
    float ss;

    for (layer = 0u; layer < p.layers; layer++) {
        uint qkv_quads = (p.qcols + 2u * p.kvcols) / 4u;
        if (layer > 0u) grid_barrier(); // the stream the last layer's down wrote
        prefetch(1u, layer, p.hidden4, p.qcols / 4u, slot_o());

        // 1. q/k/v: the norm prologue, RoPE, q to Q and k, v to the caches' row pos.
        for (uint quad = wg; quad < qkv_quads; quad += groups) {
            vec4 v = gemv_quad(0u, 4u * quad, p.hidden4, ss);
            if (tid == 0u) {
                v *= norm_scale(ss);
                store_qkv(pos, 4u * quad, v.x, v.y);
                store_qkv(pos, 4u * quad + 2u, v.z, v.w);
            }
        }
        grid_barrier();
        prefetch(2u, layer, 2u * p.ffn4, p.hidden4, slot_o() + 1u);

        // 2. attention over keys 0 ..= pos, one unit per (head, key run).
        for (uint unit = wg; unit < p.n_heads * p.splits; unit += groups) {
            attention_unit(unit / p.splits, unit % p.splits, pos);
        }
        grid_barrier();
        prefetch(3u, layer, p.hidden4, p.ffn4, slot_o() + 1u);

        // 3. o, added into the stream.
        for (uint quad = wg; quad < p.hidden4; quad += groups) {
            vec4 v = gemv_quad(1u, 4u * quad, p.qcols / 4u, ss);
            if (tid == 0u) residual(quad, v, slot_o());
        }
        grid_barrier();
        if (layer + 1u < p.layers) prefetch(0u, layer + 1u, qkv_quads, p.hidden4, slot_o() + 2u);

        // 4. gate/up (rows interleaved gate j, up j) with the norm prologue: silu(g) · u.
        for (uint quad = wg; quad < 2u * p.ffn4; quad += groups) {
            vec4 v = gemv_quad(2u, 4u * quad, p.hidden4, ss);
            if (tid == 0u) {
                v *= norm_scale(ss);
                uint h = 2u * quad; // the quad's first of two outputs
                hid[h >> 2][h & 3u] = v.x / (1.0 + exp(-v.x)) * v.y;
                hid[(h + 1u) >> 2][(h + 1u) & 3u] = v.z / (1.0 + exp(-v.z)) * v.w;
            }
        }
        grid_barrier();

        // 5. down, added into the stream.
        for (uint quad = wg; quad < p.hidden4; quad += groups) {
            vec4 v = gemv_quad(3u, 4u * quad, p.ffn4, ss);
            if (tid == 0u) residual(quad, v, slot_o() + 1u);
        }
    }
}
