#version 450
#extension GL_GOOGLE_include_directive : require
// decode_layer_1.comp with f16 weights (W_F16): half the bytes a step streams.
#define W_F16
const uint MAX_LAYERS = 1;
const uint ROWS = 1;
#include "decode_layer.glsl"
