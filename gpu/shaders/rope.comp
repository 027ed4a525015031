#version 450
// RoPE in place on x [tokens, n_heads, head_dim]. The host computes the cos/sin table
// [tokens, head_dim / 2] in f64 (as the reference does): GLSL sin/cos are only accurate to
// about 2^-11 absolute in Vulkan, and an f32 angle pos * freq loses digits at large positions.
// style 0 = Adjacent pairs (2i, 2i+1); 1 = HalfSplit pairs (i, i + head_dim/2).
layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Cs { vec2 cs[]; }; // (cos, sin)

layout(push_constant) uniform Push {
    uint tokens;
    uint n_heads;
    uint head_dim;
    uint style;
    uint pad[12];
} p;

void main() {
    uint half_ = p.head_dim / 2;
    uint total = p.tokens * p.n_heads * half_;
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint idx = gl_GlobalInvocationID.x; idx < total; idx += stride) {
        uint i = idx % half_;
        uint th = idx / half_;         // token * n_heads + head
        uint t = th / p.n_heads;
        uint base = th * p.head_dim;
        uint ia = p.style == 0 ? 2 * i : i;
        uint ib = p.style == 0 ? 2 * i + 1 : i + half_;
        vec2 c = cs[t * half_ + i];
        float a = x[base + ia];
        float b = x[base + ib];
        x[base + ia] = a * c.x - b * c.y;
        x[base + ib] = a * c.y + b * c.x;
    }
}
