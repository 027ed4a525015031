#version 450
// Merges the per-split results of attention_decode.comp (flash decoding): for each
// (head, token), with M the largest of the splits' running maxima m_s,
// out = sum_s exp(m_s - M) * o_s / sum_s exp(m_s - M) * l_s. A split that saw no key has
// m_s = -inf and l_s = 0 and adds nothing; split 0 always holds key 0.
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Part { vec4 part[]; };
layout(std430, binding = 1) writeonly buffer O { vec4 o[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_heads;
    uint head_dim;
    uint splits;
    uint pad[12];
} p;

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint d4 = p.head_dim / 4;
    if (lane >= d4) return;
    uint base = (t * p.n_heads + h) * p.splits * (d4 + 1);
    float mx = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; s++) mx = max(mx, part[base + s * (d4 + 1)].x);
    float l = 0.0;
    vec4 acc = vec4(0.0);
    for (uint s = 0; s < p.splits; s++) {
        uint rec = base + s * (d4 + 1);
        vec2 ml = part[rec].xy;
        if (ml.y == 0.0) continue;
        float w = exp(ml.x - mx);
        l += w * ml.y;
        acc += w * part[rec + 1 + lane];
    }
    o[t * p.n_heads * d4 + h * d4 + lane] = acc / l;
}
