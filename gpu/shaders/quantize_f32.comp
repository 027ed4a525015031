#version 450
// quantize.comp for devices without shaderFloat64; see quantize_common.glsl.
#define RESIDUAL_T float
#define RESIDUAL(c) abs(fma(-(c), s, v))
#include "quantize_common.glsl"
