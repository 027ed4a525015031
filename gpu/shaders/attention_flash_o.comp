#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_atomic_float : require
// attention_flash.glsl with the output projection folded in (attention_o.glsl).
#define FUSE_O
#include "attention_flash.glsl"
