#version 450
#extension GL_GOOGLE_include_directive : require
// decode_layer.glsl for one layer a dispatch (15 storage buffers), one sequence: devices
// that bind few storage buffers, and lavapipe, whose results went wrong with three of
// SmolLM2's layers (42 MB of weights) bound in one dispatch and stayed right with one or
// two.
const uint MAX_LAYERS = 1;
const uint ROWS = 1;
#include "decode_layer.glsl"
