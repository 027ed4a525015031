#version 450
#extension GL_GOOGLE_include_directive : require
// Causal GQA flash attention on tensor cores; see attention_flash_khr.glsl.
#include "attention_flash_khr.glsl"
