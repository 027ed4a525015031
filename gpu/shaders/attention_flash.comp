#version 450
#extension GL_GOOGLE_include_directive : require
// Causal GQA flash attention in f32 (head_dim <= 64); see attention_flash.glsl.
#include "attention_flash.glsl"
