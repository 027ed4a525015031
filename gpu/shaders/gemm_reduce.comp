#version 450
// Split-K GEMM, second pass: out[i] = sum over z of parts[z * len + i] (see gemm_f32.glsl).
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Parts { float parts[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint len;    // floats per slice (= the output's, padding included)
    uint splits;
    uint pad[14];
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < p.len; i += stride) {
        float sum = 0.0;
        for (uint z = 0; z < p.splits; z++) sum += parts[z * p.len + i];
        o[i] = sum;
    }
}
