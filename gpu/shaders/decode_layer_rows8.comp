#version 450
#extension GL_GOOGLE_include_directive : require
// decode_layer.glsl for up to 64 layers a dispatch and up to 8 sequences (batched decode).
const uint MAX_LAYERS = 64;
const uint ROWS = 8;
#include "decode_layer.glsl"
