#version 450
#extension GL_ARB_gpu_shader_fp64 : require
// Per-tensor symmetric INT8 quantization: q = clamp(roundEven(x / scale), -127, 127), NaN -> 0,
// four results packed per 32-bit word (little-endian), so no 8-bit storage is needed.
//
// mode 0: scale from push constants. mode 1: scale = max|x| / 127 (1 when all zero) from the
// absmax pass's word 0 of `sc`, written back as float bits to sc[1] for the caller.
//
// Vulkan allows 2.5 ulp for division, which can move a quotient across a rounding tie;
// correctly_rounded_div recovers the IEEE quotient, so results match the reference exactly.
#define RESIDUAL_T double
#define RESIDUAL(c) abs(double(v) - double(c) * double(s))
#include "quantize_common.glsl"
