#version 450
// Dequantizes GEMM accumulators: out[i, j] = float(acc[i, j]) * (a_scale * w_scales[j]).
// acc and out share the row stride ld (padded matrices); padding columns are written as 0.
// `precise` keeps the product order of the reference, so the result is bit-exact.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Acc { int acc[]; };
layout(std430, binding = 1) readonly buffer Ws { float w_scales[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n;
    uint ld;
    float a_scale;
    uint pad[12];
} p;

void main() {
    uint total = p.rows * p.ld;
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint j = i % p.ld;
        if (j < p.n) {
            precise float s = p.a_scale * w_scales[j];
            precise float v = float(acc[i]) * s;
            o[i] = v;
        } else {
            o[i] = 0.0;
        }
    }
}
