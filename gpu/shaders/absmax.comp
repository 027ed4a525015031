#version 450
// max |x| over a tensor into word 0 of `result` (which must start at 0), for the per-tensor
// INT8 scale. Non-negative floats order like their bit patterns, so an integer atomicMax on
// the bits is a float max. NaNs are skipped, as the reference's f32::max skips them.
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer R { uint result[]; };

layout(push_constant) uniform Push {
    uint len;
    uint pad[15];
} p;

shared uint best[256];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint m = 0;
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint i = gl_GlobalInvocationID.x; i < p.len; i += stride) {
        float v = x[i];
        if (!isnan(v)) m = max(m, floatBitsToUint(abs(v)));
    }
    best[tid] = m;
    barrier();
    for (uint h = 128; h > 0; h >>= 1) {
        if (tid < h) best[tid] = max(best[tid], best[tid + h]);
        barrier();
    }
    if (tid == 0) atomicMax(result[0], best[0]);
}
