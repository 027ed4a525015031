layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };
layout(std430, binding = 2) buffer S { uint sc[]; };

layout(push_constant) uniform Push {
    uint len;
    uint mode;
    float scale;
    uint pad[13];
} p;

// The correctly rounded quotient is the float c nearest v / s, i.e. with the smallest
// |v - c·s|. Division is only accurate to 2.5 ulp in Vulkan, so try the quotient and its
// three neighbours on each side. With f64 (quantize.comp) each residual is exact: c·s has 48
// significant bits and v - c·s cancels exactly, so the result is the IEEE quotient. Without
// f64 (quantize_f32.comp) residuals come from fma, which Vulkan need not fuse, so a quotient
// within an ulp of a rounding tie may round the other way (results off by one there).
float correctly_rounded_div(float v, float s) {
    float r = v / s;
    if (isinf(r) || r == 0.0) return r;
    uint bits = floatBitsToUint(r);
    float best = r;
    RESIDUAL_T best_err = RESIDUAL(r);
    for (int d = -3; d <= 3; d++) {
        if (d == 0) continue;
        float c = uintBitsToFloat(uint(int(bits) + d));
        RESIDUAL_T err = RESIDUAL(c);
        // On an exact tie between two neighbours, IEEE picks the even mantissa.
        if (err < best_err || (err == best_err && (floatBitsToUint(c) & 1u) == 0u)) {
            best = c;
            best_err = err;
        }
    }
    return best;
}

int quant(float v, float s) {
    if (isnan(v)) return 0;
    return int(clamp(roundEven(correctly_rounded_div(v, s)), -127.0, 127.0));
}

void main() {
    float s = p.scale;
    if (p.mode == 1) {
        float mx = uintBitsToFloat(sc[0]);
        s = mx > 0.0 ? correctly_rounded_div(mx, 127.0) : 1.0;
        if (gl_GlobalInvocationID.x == 0) sc[1] = floatBitsToUint(s);
    }
    uint words = (p.len + 3) / 4;
    uint stride = gl_NumWorkGroups.x * 256;
    for (uint wi = gl_GlobalInvocationID.x; wi < words; wi += stride) {
        uint packed = 0;
        for (uint e = 0; e < 4; e++) {
            uint i = wi * 4 + e;
            int v = i < p.len ? quant(x[i], s) : 0;
            packed |= (uint(v) & 0xffu) << (8 * e);
        }
        q[wi] = packed;
    }
}
