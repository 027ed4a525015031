// The output projection folded into attention_flash.glsl (FUSE_O), on CUDA cores: the twin
// of attention_o_khr.glsl (see there for why float atomics), for devices without
// cooperative matrices. The block's output tile goes to vs ([row][dim / 4]: BQ = BK rows
// of D dims), then thread t takes W_o rows (x columns) t, t + 128, ..., dots each with the
// tile's 32 rows and adds the sums into x.

layout(std430, binding = 4) readonly buffer Wo { uint wo[]; };
layout(std430, binding = 5) buffer X { float x[]; };
layout(std430, binding = 6) buffer Flags { float flags[]; };

// W_o[col, k], f32 or f16 (two halves per word).
float wo_at(uint col, uint k) {
    if ((p.flags & 1u) == 0u) return uintBitsToFloat(wo[col * p.ldwo + k]);
    vec2 two = unpackHalf2x16(wo[col * p.ldwo + k / 2]);
    return (k & 1u) == 0u ? two.x : two.y;
}

// x[t0 + r, :] += tile[r, :] · W_o[:, h * d ..]ᵀ for the rows r < rows; `tile` is this
// thread's 4 rows x 4 dims (rows 4 ty .., dims 4 tx ..), already normalised (zeros past the
// chunk). Every thread of the workgroup calls it.
void project_out(vec4 tile[4], uint t0, uint rows, uint h) {
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16 + tx;
    uint d = p.head_dim;
    bool f16 = (p.flags & 1u) != 0u;
    barrier(); // every thread is done with vs (the last key block)
    [[unroll]] for (uint i = 0; i < 4; i++) {
        vec4 v = tile[i];
        if (f16) v = vec4(unpackHalf2x16(packHalf2x16(v.xy)), unpackHalf2x16(packHalf2x16(v.zw)));
        vs[ty * 4 + i][tx] = v;
    }
    barrier();
    bool bad = false;
    for (uint col = tid; col < p.o_cols; col += 128) {
        float sums[BQ];
        [[unroll]] for (uint r = 0; r < BQ; r++) sums[r] = 0.0;
        for (uint c4 = 0; c4 < D / 4; c4++) {
            vec4 w = vec4(0.0);
            [[unroll]] for (uint e = 0; e < 4; e++) {
                uint dim = c4 * 4 + e;
                if (dim < d) w[e] = wo_at(col, h * d + dim);
            }
            [[unroll]] for (uint r = 0; r < BQ; r++) sums[r] += dot(vs[r][c4], w);
        }
        for (uint r = 0; r < rows; r++) {
            bad = bad || isnan(sums[r]) || isinf(sums[r]);
            atomicAdd(x[(t0 + r) * p.ldx + col], sums[r]);
        }
    }
    if (bad) flags[p.slot] = 1.0;
}
