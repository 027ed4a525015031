#version 450
#extension GL_GOOGLE_include_directive : require
// decode_layer.glsl for one layer a dispatch and up to 8 sequences (batched decode on
// devices that bind few storage buffers, and lavapipe).
const uint MAX_LAYERS = 1;
const uint ROWS = 8;
#include "decode_layer.glsl"
