#version 450
// Greedy sampling on the device: for each row r of x [rows, cols] (row stride ld), the
// column of its largest value, the lower column on a tie, NaN never chosen (the host
// sampler's rule); out[r] = that column, or 0xffffffff when the row has no number. One
// workgroup per row; each thread scans a stride of the row, then a shared-memory tree.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { uint o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint ld;
    uint pad[13];
} p;

const uint T = 256;
const uint NONE = 0xffffffffu;
shared float best_v[T];
shared uint best_i[T];

// Whether (v, i) beats (bv, bi): larger, or equal and lower; NaN and NONE never win.
bool beats(float v, uint i, float bv, uint bi) {
    if (i == NONE || isnan(v)) return false;
    if (bi == NONE) return true;
    return v > bv || (v == bv && i < bi);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r = gl_WorkGroupID.x;
    float bv = 0.0;
    uint bi = NONE;
    for (uint c = tid; c < p.cols; c += T) {
        float v = x[r * p.ld + c];
        if (beats(v, c, bv, bi)) {
            bv = v;
            bi = c;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint s = T / 2; s > 0; s >>= 1) {
        if (tid < s && beats(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
            best_v[tid] = best_v[tid + s];
            best_i[tid] = best_i[tid + s];
        }
        barrier();
    }
    if (tid == 0) o[r] = best_i[0];
}
