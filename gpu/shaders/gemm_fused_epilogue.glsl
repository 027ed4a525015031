// What the fused GEMMs (gemm_fused_tiles.glsl on CUDA cores, f32 or f16 weights, and
// gemm_f16_coopmat_khr_fused.comp on tensor cores) do around the product: the push
// constants, the bindings past A and W, and the epilogue of one aligned quad of columns.
//
// - prologue NORM (flags bit 0): RMSNorm of A's rows. The norm's weight is folded into W
//   on the host (W' = W · diag(g)); a kernel sums each row's squares from the A slices
//   it stages anyway and scales row i of the product by 1 / sqrt(mean(a_i²) + eps). Needs
//   the whole of k in one workgroup (no split-K).
// - epilogue by mode:
//   0 PLAIN: C = acc.
//   1 RESIDUAL: C += acc (C is the residual stream, read and written by the same thread);
//     a non-finite sum sets flags[slot] = 1.0 (add_checked.comp's rule).
//   2 SILU_MUL: W's rows interleave gate and up (row 2j = gate j, 2j + 1 = up j), so each
//     quad holds (g0, u0, g1, u1); C [m, n/2] = silu(g) · u.
//   3 QKV_ROPE: W = [Wq; Wk; Wv] (n = qcols + 2 kvcols). Within each head of q and k the
//     rows are ordered so that RoPE's rotated pairs sit at columns (2i, 2i+1) (identity for
//     adjacent pairs, (i, i + d/2) interleaved for half-split); the pair is rotated with
//     the host's f64 table cs[t * d/2 + i] and stored at its own dims. q goes to C
//     [m, qcols]; k and v go straight into the layer's caches at row pos0 + t.
//   4 GELU_MUL: as SILU_MUL with GELU(tanh) (Gemma): gelu(g) = g / (1 + exp(-2y)),
//     y = sqrt(2/pi) g (1 + 0.044715 g^2), the form of the CPU's gelu_tanh_mul_fast.

layout(std430, binding = 2) buffer C { float c[]; };
layout(std430, binding = 3) readonly buffer Cs { vec2 cs[]; };
layout(std430, binding = 4) buffer Kc { float kc[]; };
layout(std430, binding = 5) buffer Vc { float vc[]; };
layout(std430, binding = 6) buffer Flags { float flags[]; };

layout(push_constant) uniform Push {
    uint M;        // rows of A and C
    uint N;        // rows of W (GEMM columns)
    uint K4;       // padded k of A in vec4 units (= A's row stride)
    uint ldcs;     // mode 3: row stride of the RoPE table in (cos, sin) pairs
    uint ldw4;     // W row stride in 16-byte units (4 f32 or 8 f16)
    uint ldc;      // C row stride in floats
    uint mode;     // 0 plain, 1 residual, 2 silu-mul, 3 qkv + rope + cache, 4 gelu-mul
    uint flags;    // bit 0: norm prologue; bit 1: half-split RoPE
    float eps;     // norm epsilon
    uint kdim;     // true k (the norm's mean)
    uint qcols;    // mode 3: q columns (n_heads · d)
    uint kvcols;   // mode 3: k (= v) columns (n_kv_heads · d)
    uint head_dim; // mode 3
    uint pos0;     // mode 3: cache row of A's row 0
    uint slot;     // mode 1: flag index
    uint ldkv;     // mode 3: row stride of the caches in floats
} p;

// Row `row`'s RoPE table row and cache row: row and pos0 + row here; the small-m kernel
// (gemv_fused.glsl) can take both from a positions buffer instead.
#ifndef ANGLE_ROW
#define ANGLE_ROW(row) (row)
#define CACHE_ROW(row) (p.pos0 + (row))
#endif

// Stores the rotated pair (x0, x1) of GEMM columns (col, col + 1) of row `row` (mode 3).
void store_qkv(uint row, uint col, float x0, float x1) {
    uint d = p.head_dim;
    uint half_ = d / 2;
    uint region = col < p.qcols ? 0 : (col < p.qcols + p.kvcols ? 1 : 2);
    uint local = col - (region == 0 ? 0 : (region == 1 ? p.qcols : p.qcols + p.kvcols));
    if (region == 2) {
        uint dst = CACHE_ROW(row) * p.ldkv + local;
        vc[dst] = x0;
        vc[dst + 1] = x1;
        return;
    }
    uint head = local / d;
    uint i = (local % d) / 2;
    vec2 r = cs[ANGLE_ROW(row) * p.ldcs + i];
    float y0 = x0 * r.x - x1 * r.y;
    float y1 = x0 * r.y + x1 * r.x;
    bool split = (p.flags & 2u) != 0u;
    uint ia = head * d + (split ? i : 2 * i);
    uint ib = head * d + (split ? i + half_ : 2 * i + 1);
    if (region == 0) {
        c[row * p.ldc + ia] = y0;
        c[row * p.ldc + ib] = y1;
    } else {
        uint base = CACHE_ROW(row) * p.ldkv;
        kc[base + ia] = y0;
        kc[base + ib] = y1;
    }
}

// GELU(tanh)(g) * u (mode 4).
float gelu_mul(float g, float u) {
    float y = 0.7978846 * g * (1.0 + 0.044715 * g * g);
    return g / (1.0 + exp(-2.0 * y)) * u;
}

// The epilogue of product columns col .. col + 3 (col a multiple of 4) of row `row`, the
// row's norm scale already applied; returns whether a residual sum is not finite. Callers
// index their accumulators with constants only (a run-time index made NVIDIA's compiler
// keep them in local memory, 10x slower).
bool epilogue_quad(uint row, uint col, vec4 v) {
    if (row >= p.M || col >= p.N) return false;
    uint at = row * p.ldc + col;
    if (p.mode == 0u) {
        c[at] = v.x;
        if (col + 1 < p.N) c[at + 1] = v.y;
        if (col + 2 < p.N) c[at + 2] = v.z;
        if (col + 3 < p.N) c[at + 3] = v.w;
    } else if (p.mode == 1u) {
        vec4 y = vec4(c[at], 0.0, 0.0, 0.0);
        y.x += v.x;
        c[at] = y.x;
        if (col + 1 < p.N) { y.y = c[at + 1] + v.y; c[at + 1] = y.y; }
        if (col + 2 < p.N) { y.z = c[at + 2] + v.z; c[at + 2] = y.z; }
        if (col + 3 < p.N) { y.w = c[at + 3] + v.w; c[at + 3] = y.w; }
        return any(isnan(y)) || any(isinf(y));
    } else if (p.mode == 2u) {
        // N is even and col a multiple of 4: whole (gate, up) pairs.
        uint h = row * p.ldc + col / 2;
        c[h] = v.x / (1.0 + exp(-v.x)) * v.y;
        if (col + 2 < p.N) c[h + 1] = v.z / (1.0 + exp(-v.z)) * v.w;
    } else if (p.mode == 4u) {
        uint h = row * p.ldc + col / 2;
        c[h] = gelu_mul(v.x, v.y);
        if (col + 2 < p.N) c[h + 1] = gelu_mul(v.z, v.w);
    } else {
        store_qkv(row, col, v.x, v.y);
        if (col + 2 < p.N) store_qkv(row, col + 2, v.z, v.w);
    }
    return false;
}
