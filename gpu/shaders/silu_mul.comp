#version 450
// Gated FFN activation: out = silu(gate) * up, silu(x) = x / (1 + e^-x).
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    uint len;
    uint pad[15];
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < p.len; i += stride) {
        float x = g[i];
        o[i] = x / (1.0 + exp(-x)) * u[i];
    }
}
