#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_atomic_float : require
// attention_flash_khr.glsl with the output projection folded in (attention_o_khr.glsl):
// the residual stream gains every head's attention output times its slice of W_o.
#define FUSE_O
#include "attention_flash_khr.glsl"
