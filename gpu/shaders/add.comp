#version 450
// Residual add in place: x[i] += d[i].
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer D { float d[]; };

layout(push_constant) uniform Push {
    uint len;
    uint pad[15];
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < p.len; i += stride) {
        x[i] += d[i];
    }
}
