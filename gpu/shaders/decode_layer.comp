#version 450
#extension GL_GOOGLE_include_directive : require
// decode_layer.glsl for up to 64 layers a dispatch (393 storage buffers: GPUs), one sequence.
const uint MAX_LAYERS = 64;
const uint ROWS = 1;
#include "decode_layer.glsl"
