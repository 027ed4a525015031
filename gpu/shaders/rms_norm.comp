#version 450
// RMSNorm over each row: out = x / sqrt(mean(x²) + eps) * weight.
// One workgroup per row (grid-stride over rows past the workgroup-count limit); the sum of
// squares is reduced in shared memory in f32 (the reference uses f64; for rows of a few
// thousand values the difference stays near 1e-7 relative).
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float weight[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    float eps;
    uint pad[13];
} p;

shared float partial[256];

void main() {
    uint tid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < p.rows; r += gl_NumWorkGroups.x) {
        uint base = r * p.cols;
        float s = 0.0;
        for (uint c = tid; c < p.cols; c += 256) {
            float v = x[base + c];
            s += v * v;
        }
        partial[tid] = s;
        barrier();
        for (uint half_ = 128; half_ > 0; half_ >>= 1) {
            if (tid < half_) partial[tid] += partial[tid + half_];
            barrier();
        }
        float inv = 1.0 / sqrt(partial[0] / float(p.cols) + p.eps);
        barrier(); // everyone has read partial[0] before the next row overwrites it
        for (uint c = tid; c < p.cols; c += 256) {
            o[base + c] = x[base + c] * inv * weight[c];
        }
    }
}
