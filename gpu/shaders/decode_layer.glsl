#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_shader_atomic_float : require
// The llama decoder layers of a decode step of up to ROWS sequences in one dispatch (up
// to MAX_LAYERS layers; the including kernel sets both; a layer's weights and caches are
// elements of descriptor arrays, 6 · MAX_LAYERS + 9 storage buffers in all): per layer
// the five stages the step otherwise runs as five dispatches (q/k/v with the norm
// prologue, RoPE and the cache write; attention over the cache; o with the residual add;
// gate/up with the norm prologue and SiLU·up; down with the residual add), or four in a
// step of one row whose keys are few (attention and o as one stage, see
// attention_unit), separated by grid barriers instead of pipeline barriers. A pipeline
// barrier between dependent dispatches costs about 6 µs on an H100 (a dispatch drains
// before the next starts), more than most of a decode step's small products take; a
// grid barrier is one atomic add per workgroup and a spin on the counter in L2.
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
// the last workgroup of a head to arrive), here with blocks of 128 keys. f32 weights (f16
// with W_F16), dense rows (every row stride is its k).
//
// Rows: a step feeds one token to each of `rows` sequences (at most ROWS), the stream,
// q, attention's output and the gate/up product one row per sequence. A product reads
// each weight once for all the rows (the GEMV becomes a GEMM of a few rows). Row r's
// token is at position positions[4r]; its keys and values live in the layer's one cache
// at rows mapped from positions: below positions[4r + 1] (a prefix the sequences share,
// such as the prompt of parallel samples) a position is its own row, from there on it
// is shifted by positions[4r + 2] (the sequence's own region). A single sequence gives
// (pos, 0, 0): every position its own row.
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
// The stream as floats, for attention with o's atomic adds.
layout(std430, binding = 0) coherent buffer Xs { float xs[]; };
// The weights: f32 (a vec4 holds 4 of a row's k), or with W_F16 f16 (a uvec2 holds 4),
// half the bytes a step streams; the products then see A rounded to f16 as the fused
// GEMMs' f16 kernels do, and sum in f32.
#ifdef W_F16
#define WEIGHT4 uvec2
#else
#define WEIGHT4 vec4
#endif
layout(std430, binding = 1) readonly buffer Wqkv { WEIGHT4 w[]; } w_qkv[MAX_LAYERS];
layout(std430, binding = 2) readonly buffer Wo { WEIGHT4 w[]; } w_o[MAX_LAYERS];
layout(std430, binding = 3) readonly buffer Wgu { WEIGHT4 w[]; } w_gu[MAX_LAYERS];
layout(std430, binding = 4) readonly buffer Wdown { WEIGHT4 w[]; } w_down[MAX_LAYERS];
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
    uint flags;     // bit 1: half-split RoPE; bit 2: prefetch a later stage's weights; bit 3: attention with o; bits 8-15: rows
    uint n_heads;
    uint n_kv_heads;
    uint kv_len;    // a bound on every row's position + 1 (the keys a row attends)
    float scale;    // attention's 1/sqrt(head_dim)
    uint splits;    // key runs per head
    uint slot0;     // flag of the first layer's attention residual add (then its FFN's, the next layer's, ...)
    uint layers;    // layers of this dispatch
    uint sync;      // this dispatch's counter in Sync (zero when the dispatch starts)
} p;

// The layer being run (dynamically uniform: every invocation walks the layers together).
uint layer = 0u;
uint slot_o() { return p.slot0 + 2u * layer; }

// Sequences stepped (1 ..= ROWS; the one-row variants know it at compile time).
uint n_rows() { return ROWS == 1u ? 1u : (p.flags >> 8) & 0xffu; }

// The cache row of position j of the sequence whose row map is (shared prefix, shift).
uint cache_row(uint j, uvec2 map) { return j < map.x ? j : j + map.y; }
uvec2 row_map(uint r) { return uvec2(positions[4u * r + 1u], positions[4u * r + 2u]); }

// A product's partial sums meet here, row r of subgroup s at r · gl_NumSubgroups + s
// (at most THREADS / 4 subgroups: the host runs the several-row variants only where
// subgroups have 4 invocations or more); attention's reductions use the first THREADS.
const uint RED = max(THREADS, ROWS * THREADS / 4u);
shared vec4 red4[RED];
shared float red1[RED];
shared vec4 qs[MAX_D4];
shared float ps[THREADS];
// Attention's reductions: a slot a subgroup (at most THREADS), max and sum apart.
shared float red_max[THREADS];
shared float red_sum[THREADS];
// The merge's (max, sum) of each key run (at most MAX_SPLITS = 64 of the host).
shared vec2 run_ml[THREADS];
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
// gate/up (the stream), 3 down (the gate/up product); i indexes A's rows one after
// another.
vec4 load_a(uint which, uint i) {
    if (which == 1u) return attn[i];
    if (which == 3u) return hid[i];
    return x[i];
}
vec4 unpack_w(WEIGHT4 v) {
#ifdef W_F16
    return vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y));
#else
    return v;
#endif
}
vec4 load_w_of(uint which, uint l, uint i) {
    if (which == 0u) return unpack_w(w_qkv[l].w[i]);
    if (which == 1u) return unpack_w(w_o[l].w[i]);
    if (which == 2u) return unpack_w(w_gu[l].w[i]);
    return unpack_w(w_down[l].w[i]);
}
#include "operand_f16.glsl"
vec4 load_w(uint which, uint i) { return load_w_of(which, layer, i); }

// Loop steps of a product whose weight loads are issued together before any is used:
// a loop of load-then-use waits out the memory's latency once a step, and a stage's
// products are short (SmolLM2's k of 576 is two steps of 128 threads, its down's 1536
// three), so that wait, not the bytes, is most of a stage. Fewer with several rows,
// whose sums take the registers.
const uint LOADS_AHEAD = ROWS == 1u ? 4u : 2u;

// The four sums of W rows col .. col + 3 against each row of A (k4 vec4s a row), and
// that row's sum of squares: thread r < n_rows() gets row r's (others get zeros). Each
// weight is loaded once for all the rows.
vec4 gemv_quad(uint which, uint col, uint k4, out float ss_out) {
    uint tid = gl_LocalInvocationID.x;
    uint n = n_rows();
    vec4 acc[ROWS];
    float ss[ROWS];
    [[unroll]] for (uint r = 0u; r < ROWS; r++) {
        acc[r] = vec4(0.0);
        ss[r] = 0.0;
    }
    for (uint k0 = tid; k0 < k4; k0 += LOADS_AHEAD * THREADS) {
        // Every load of the step first (the first row's operand with them), then the
        // products in the order of k, as one step at a time would add them.
        vec4 w[LOADS_AHEAD][4];
        vec4 a0[LOADS_AHEAD];
        [[unroll]] for (uint u = 0u; u < LOADS_AHEAD; u++) {
            uint kk = k0 + u * THREADS;
            bool inside = kk < k4;
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                w[u][c] = inside ? load_w(which, (col + c) * k4 + kk) : vec4(0.0);
            }
            a0[u] = inside ? load_a(which, kk) : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < LOADS_AHEAD; u++) {
            uint kk = k0 + u * THREADS;
            if (kk < k4) {
                [[unroll]] for (uint r = 0u; r < ROWS; r++) {
                    if (r < n) {
                        vec4 a = r == 0u ? a0[u] : load_a(which, r * k4 + kk);
                        vec4 b = operand_a(a);
                        acc[r] += vec4(dot(b, w[u][0]), dot(b, w[u][1]), dot(b, w[u][2]), dot(b, w[u][3]));
                        ss[r] += dot(a, a);
                    }
                }
            }
        }
    }
    uint subgroups = gl_NumSubgroups;
    [[unroll]] for (uint r = 0u; r < ROWS; r++) {
        if (r < n) {
            vec4 sum = subgroupAdd(acc[r]);
            float sum_ss = subgroupAdd(ss[r]);
            if (subgroupElect()) {
                red4[r * subgroups + gl_SubgroupID] = sum;
                red1[r * subgroups + gl_SubgroupID] = sum_ss;
            }
        }
    }
    barrier();
    vec4 total = vec4(0.0);
    float total_ss = 0.0;
    if (tid < n) {
        for (uint i = 0u; i < subgroups; i++) {
            total += red4[tid * subgroups + i];
            total_ss += red1[tid * subgroups + i];
        }
    }
    barrier(); // red4 and red1 are written again by the next quad
    ss_out = total_ss;
    return total;
}

// Row r's SiLU(gate) · up of gate/up quad `quad` (columns gate j, up j, gate j + 1, up
// j + 1), v its sums scaled by the norm.
void store_silu_mul(uint r, uint quad, vec4 v) {
    uint h = r * 4u * p.ffn4 + 2u * quad; // the quad's first of two outputs
    hid[h >> 2][h & 3u] = v.x / (1.0 + exp(-v.x)) * v.y;
    hid[(h + 1u) >> 2][(h + 1u) & 3u] = v.z / (1.0 + exp(-v.z)) * v.w;
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

// gemm_fused_epilogue.glsl's store_qkv for row r's token: the rotated pair (x0, x1) of
// q/k/v columns (col, col + 1), q to the row's q, k and v to the caches' row of the
// token's position.
void store_qkv(uint r, uint col, float x0, float x1) {
    uint d = p.head_dim;
    uint pos = positions[4u * r];
    uint region = col < p.qcols ? 0u : (col < p.qcols + p.kvcols ? 1u : 2u);
    uint local = col - (region == 0u ? 0u : (region == 1u ? p.qcols : p.qcols + p.kvcols));
    uint base = region == 0u ? r * p.qcols : cache_row(pos, row_map(r)) * p.kvcols;
    if (region == 2u) {
        put(2u, base + local, x0);
        put(2u, base + local + 1u, x1);
        return;
    }
    uint head = local / d;
    uint i = (local % d) / 2u;
    vec2 rot = cs[pos * p.ldcs + i];
    bool split = (p.flags & 2u) != 0u;
    put(region, base + head * d + (split ? i : 2u * i), x0 * rot.x - x1 * rot.y);
    put(region, base + head * d + (split ? i + d / 2u : 2u * i + 1u), x0 * rot.y + x1 * rot.x);
}

// Adds the quad's sums into row r of the stream and raises `slot` when a sum is not
// finite.
void residual(uint r, uint quad, vec4 v, uint slot) {
    uint i = r * p.hidden4 + quad;
    vec4 y = x[i] + v;
    x[i] = y;
    if (any(isnan(y)) || any(isinf(y))) flags[slot] = 1.0;
}

// The maximum, or the sum, of every invocation's v, to every invocation: each subgroup
// reduces its own, the subgroups' results meet in red_max or red_sum (one barrier).
// Attention alternates the two, so a reduction may write its array while the other
// one's is still being read, and needs no barrier after it.
float max_of_workgroup(float v) {
    float s = subgroupMax(v);
    if (subgroupElect()) red_max[gl_SubgroupID] = s;
    barrier();
    float total = red_max[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) total = max(total, red_max[i]);
    return total;
}
float sum_of_workgroup(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) red_sum[gl_SubgroupID] = s;
    barrier();
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) total += red_sum[i];
    return total;
}

// The layer's region of part, in vec4s: a counter per (row, head), then the records.
uint part_base() {
    uint d4 = p.head_dim / 4u;
    uint row_heads = n_rows() * p.n_heads;
    return layer * ((row_heads + 3u) / 4u + row_heads * p.splits * (d4 + 1u));
}
uint counter(uint rh) { return 4u * part_base() + rh; }
// part as vec4s past the layer's counters.
uint records_base() { return part_base() + (n_rows() * p.n_heads + 3u) / 4u; }
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

// The last run of (row, head) rh to arrive merges every run's record into attention's
// output (the workgroup together: the runs' max and sum first, one load each, then each
// slice the outputs of every slices-th run, their loads together).
void merge_runs(uint rh) {
    const uint T = THREADS;
    const uint RECORD_LOADS = 4u;
    uint tid = gl_LocalInvocationID.x;
    uint d4 = p.head_dim / 4u;
    uint slices = T / d4;
    uint lane = tid % d4;
    uint slice = tid / d4;
    uint base = records_base() + rh * p.splits * (d4 + 1u);
    memoryBarrierBuffer();
    if (tid == 0u) part[counter(rh)] = 0u; // every run has counted in: ready for the next step
    if (tid < p.splits) run_ml[tid] = load4(base + tid * (d4 + 1u)).xy;
    barrier();
    float mx = NEG_INF;
    for (uint s = 0u; s < p.splits; s++) mx = max(mx, run_ml[s].x);
    vec4 out_acc = vec4(0.0);
    float l_all = 0.0;
    for (uint s = 0u; s < p.splits; s++) {
        vec2 ml = run_ml[s];
        if (ml.y != 0.0) l_all += exp(ml.x - mx) * ml.y; // a run that saw no key adds nothing
    }
    if (slice < slices) {
        for (uint s0 = slice; s0 < p.splits; s0 += RECORD_LOADS * slices) {
            vec4 o[RECORD_LOADS];
            [[unroll]] for (uint u = 0u; u < RECORD_LOADS; u++) {
                uint s = s0 + u * slices;
                o[u] = s < p.splits && run_ml[s].y != 0.0 ? load4(base + s * (d4 + 1u) + 1u + lane) : vec4(0.0);
            }
            [[unroll]] for (uint u = 0u; u < RECORD_LOADS; u++) {
                uint s = s0 + u * slices;
                if (s < p.splits && run_ml[s].y != 0.0) out_acc += exp(run_ml[s].x - mx) * o[u];
            }
        }
    }
    red4[tid] = slice < slices ? out_acc : vec4(0.0);
    barrier();
    if (slice == 0u && tid < d4) {
        vec4 sum = vec4(0.0);
        for (uint s = 0u; s < slices; s++) sum += red4[s * d4 + lane];
        attn[rh * d4 + lane] = sum / l_all;
    }
}

// Row r's head h over its keys first .. end (attention_decode.comp's online softmax with
// T = THREADS keys a block): returns the output's sum (not yet divided by l) to the
// threads tid < d4, and the run's max m and sum l to every thread. The time is a chain
// of waits (q, the keys, the values), so each step issues its loads together and
// reduces through subgroups: one barrier a reduction.
vec4 attend(uint r, uint h, uint first, uint end, out float m, out float l) {
    const uint T = THREADS;
    const uint KEY_LOADS = 16u; // a key's vec4s loaded together (SmolLM2's head: all 16)
    const uint VALUE_LOADS = 8u; // values loaded together by a slice
    uint tid = gl_LocalInvocationID.x;
    uint d4 = p.head_dim / 4u;
    uint g = h / (p.n_heads / p.n_kv_heads);
    uint kv_tok4 = p.kvcols / 4u;
    uvec2 map = row_map(r);
    uint rh = r * p.n_heads + h;
    if (tid < d4) qs[tid] = q[rh * d4 + tid];
    uint slices = T / d4;
    uint lane = tid % d4;
    uint slice = tid / d4;
    vec4 acc = vec4(0.0);
    m = NEG_INF;
    l = 0.0;
    barrier();
    for (uint k0 = first; k0 < end; k0 += T) {
        uint j = k0 + tid;
        float s = NEG_INF;
        if (j < end) {
            // The sum in the order of dims.
            uint base = cache_row(j, map) * kv_tok4 + g * d4;
            float dotp = 0.0;
            for (uint c0 = 0u; c0 < d4; c0 += KEY_LOADS) {
                vec4 kv[KEY_LOADS];
                [[unroll]] for (uint u = 0u; u < KEY_LOADS; u++) {
                    kv[u] = c0 + u < d4 ? kc[layer].v[base + c0 + u] : vec4(0.0);
                }
                [[unroll]] for (uint u = 0u; u < KEY_LOADS; u++) {
                    if (c0 + u < d4) dotp += dot(qs[c0 + u], kv[u]);
                }
            }
            s = dotp * p.scale;
        }
        // ps and the slot arrays are free here: every invocation read them before the
        // last block's sum barrier or this block's max barrier.
        float m_new = max(m, max_of_workgroup(s));
        float e = j < end ? exp(s - m_new) : 0.0;
        ps[tid] = e;
        float corr = exp(m - m_new);
        l = l * corr + sum_of_workgroup(e);
        m = m_new;
        acc *= corr;
        if (slice < slices) {
            uint block = min(T, end - k0);
            // The slice's keys slice, slice + slices, ...: loads together, added in key order.
            for (uint jj = slice; jj < block; jj += VALUE_LOADS * slices) {
                vec4 vv[VALUE_LOADS];
                [[unroll]] for (uint u = 0u; u < VALUE_LOADS; u++) {
                    uint key = jj + u * slices;
                    uint row = cache_row(k0 + key, map);
                    vv[u] = key < block ? vc[layer].v[row * kv_tok4 + g * d4 + lane] : vec4(0.0);
                }
                [[unroll]] for (uint u = 0u; u < VALUE_LOADS; u++) {
                    uint key = jj + u * slices;
                    if (key < block) acc += ps[key] * vv[u];
                }
            }
        }
    }
    red4[tid] = slice < slices ? acc : vec4(0.0);
    barrier();
    vec4 sum = vec4(0.0);
    if (tid < d4) {
        for (uint s = 0u; s < slices; s++) sum += red4[s * d4 + lane];
    }
    return sum;
}

// The keys row r attends: positions 0 ..= its position.
uint keys_of(uint r) { return min(positions[4u * r] + 1u, p.kv_len); }

// Attention with o (flag bit 3; the one-row variants only: steps of several rows keep o
// a stage of its own, their kernels as measured), where the keys fit a few blocks: unit
// (r, h, b) runs row r's head h over all its keys, then multiplies W_o's rows b · O_ROWS
// .. (b + 1) · O_ROWS - 1 in head h's columns by that output and adds the products into
// the stream with float atomics (every head's unit adds into the same rows, in no fixed
// order). That is one stage and one grid barrier a layer fewer than attention, then o;
// each head's attention runs once per block of rows, which is cheap only while the keys
// are few. The weights are loaded after the attention, a few at a time: held in
// registers through it (an early start to their wait), they made lavapipe compute wrong
// streams, and more registers a thread can keep fewer workgroups resident, which the
// grid barrier needs.
const uint O_ROWS = 32u;
const uint O_LANES = THREADS / O_ROWS; // threads a W_o row: each a share of its columns
const uint O_LOADS = 4u; // W_o's vec4s a thread loads together

// Attention's units of a head: its key runs, or with o its blocks of o's rows.
uint attention_parts(bool with_o) {
    return with_o ? (4u * p.hidden4 + O_ROWS - 1u) / O_ROWS : p.splits;
}

// Attention of row r's head h: over key run `piece` of p.splits, to attention's output
// (one run) or to the run's record, the last run of the head to arrive merging them;
// or, with o, over all its keys, times block `piece` of W_o's rows into the stream.
void attention_unit(uint r, uint h, uint piece, bool with_o) {
    uint tid = gl_LocalInvocationID.x;
    uint d4 = p.head_dim / 4u;
    uint rh = r * p.n_heads + h; // the (row, head) of this unit: its q, output and records
    uint first = 0u;
    uint end = keys_of(r);
    if (!with_o) {
        uint run = ((p.kv_len + THREADS - 1u) / THREADS + p.splits - 1u) / p.splits * THREADS;
        first = piece * run;
        end = min(end, first + run);
    }
    float m, l;
    vec4 sum = attend(r, h, first, end, m, l);
    if (with_o) {
        if (tid < d4) qs[tid] = sum / l; // q is read: qs holds the output
        barrier();
        // Row o_row of W_o, a share of head h's columns a thread.
        uint k4 = p.qcols / 4u;
        uint o_row = piece * O_ROWS + tid / O_LANES;
        bool inside = o_row < 4u * p.hidden4;
        float y = 0.0;
        for (uint c0 = tid % O_LANES; c0 < d4; c0 += O_LANES * O_LOADS) {
            vec4 w[O_LOADS];
            [[unroll]] for (uint u = 0u; u < O_LOADS; u++) {
                uint c = c0 + u * O_LANES;
                w[u] = inside && c < d4 ? load_w(1u, o_row * k4 + h * d4 + c) : vec4(0.0);
            }
            [[unroll]] for (uint u = 0u; u < O_LOADS; u++) {
                uint c = c0 + u * O_LANES;
                if (c < d4) y += dot(operand_a(qs[c]), w[u]);
            }
        }
        red1[tid] = y;
        barrier();
        if (tid < O_ROWS && piece * O_ROWS + tid < 4u * p.hidden4) {
            float total = 0.0;
            for (uint i = 0u; i < O_LANES; i++) total += red1[tid * O_LANES + i];
            float before = atomicAdd(xs[r * 4u * p.hidden4 + piece * O_ROWS + tid], total);
            if (isnan(before + total) || isinf(before + total)) flags[slot_o()] = 1.0;
        }
    } else {
        if (tid < d4) {
            if (p.splits == 1u) {
                attn[rh * d4 + tid] = sum / l;
            } else {
                uint rec = records_base() + (rh * p.splits + piece) * (d4 + 1u);
                if (tid == 0u) store4(rec, vec4(m, l, 0.0, 0.0));
                store4(rec + 1u + tid, sum);
            }
        }
        if (p.splits > 1u) {
            memoryBarrierBuffer();
            barrier();
            if (tid == 0u) last_arrival = atomicAdd(part[counter(rh)], 1u) == p.splits - 1u;
            barrier();
            if (last_arrival) merge_runs(rh);
        }
    }
    barrier(); // qs, ps, red4, red1 and last_arrival are written again by the next unit
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint groups = gl_NumWorkGroups.x;
    uint wg = gl_WorkGroupID.x;
    if (tid == 0u) gave_up = false;
    barrier();
    uint n = n_rows();
    float ss;

    for (layer = 0u; layer < p.layers; layer++) {
        uint qkv_quads = (p.qcols + 2u * p.kvcols) / 4u;
        if (layer > 0u) grid_barrier(); // the stream the last layer's down wrote
        bool with_o = ROWS == 1u && (p.flags & 8u) != 0u; // attention and o as one stage
        // o's rows as the o stage's quads assign them: no use to attention with o.
        if (!with_o) prefetch(1u, layer, p.hidden4, p.qcols / 4u, slot_o());

        // 1. q/k/v: the norm prologue, RoPE, q to Q and k, v to the caches' row of each
        // token's position (thread r the epilogue of row r).
        for (uint quad = wg; quad < qkv_quads; quad += groups) {
            vec4 v = gemv_quad(0u, 4u * quad, p.hidden4, ss);
            if (tid < n) {
                v *= norm_scale(ss);
                store_qkv(tid, 4u * quad, v.x, v.y);
                store_qkv(tid, 4u * quad + 2u, v.z, v.w);
            }
        }
        grid_barrier();
        prefetch(2u, layer, 2u * p.ffn4, p.hidden4, slot_o() + 1u);

        // 2. attention over each row's keys, one unit per (row, head, key run); then 3. o,
        // added into the stream. Or both as one stage (see attention_unit).
        uint parts = attention_parts(with_o);
        uint head_parts = p.n_heads * parts;
        for (uint unit = wg; unit < n * head_parts; unit += groups) {
            uint within = unit % head_parts;
            attention_unit(unit / head_parts, within / parts, within % parts, with_o);
        }
        if (!with_o) {
            grid_barrier();
            prefetch(3u, layer, p.hidden4, p.ffn4, slot_o() + 1u);
            for (uint quad = wg; quad < p.hidden4; quad += groups) {
                vec4 v = gemv_quad(1u, 4u * quad, p.qcols / 4u, ss);
                if (tid < n) residual(tid, quad, v, slot_o());
            }
        }
        grid_barrier();
        if (layer + 1u < p.layers) prefetch(0u, layer + 1u, qkv_quads, p.hidden4, slot_o() + 2u);

        // 4. gate/up (rows interleaved gate j, up j) with the norm prologue: silu(g) · u.
        for (uint quad = wg; quad < 2u * p.ffn4; quad += groups) {
            vec4 v = gemv_quad(2u, 4u * quad, p.hidden4, ss);
            if (tid < n) store_silu_mul(tid, quad, v * norm_scale(ss));
        }
        grid_barrier();

        // 5. down, added into the stream.
        for (uint quad = wg; quad < p.hidden4; quad += groups) {
            vec4 v = gemv_quad(3u, 4u * quad, p.ffn4, ss);
            if (tid < n) residual(tid, quad, v, slot_o() + 1u);
        }
    }
}
