// How a CUDA-core product sees a value of A: as it is with f32 weights, rounded to f16
// with f16 weights (W_F16), its sums f32 either way. Shared by the fused GEMMs
// (gemm_fused_operands.glsl) and the one-dispatch decode layers (decode_layer.glsl), so
// the two round alike.
vec4 operand_a(vec4 v) {
#ifdef W_F16
    return vec4(unpackHalf2x16(packHalf2x16(v.xy)), unpackHalf2x16(packHalf2x16(v.zw)));
#else
    return v;
#endif
}
