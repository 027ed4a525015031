#version 450
// Residual add in place, x[i] += d[i], that raises a flag when a sum is NaN or infinite:
// flags[slot] = 1.0. The flag names the block whose output broke the numbers without
// reading the activations back (the resident path keeps them on the device).
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer D { float d[]; };
layout(std430, binding = 2) buffer Flags { float flags[]; };

layout(push_constant) uniform Push {
    uint len;
    uint slot;
    uint pad[14];
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256;
    bool broken = false;
    for (uint i = gl_GlobalInvocationID.x; i < p.len; i += stride) {
        float v = x[i] + d[i];
        x[i] = v;
        broken = broken || isnan(v) || isinf(v);
    }
    if (broken) {
        flags[p.slot] = 1.0;
    }
}
