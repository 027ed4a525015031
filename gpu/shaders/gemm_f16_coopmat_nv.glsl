// GL_NV_cooperative_matrix spelling of the fragment operations gemm_f16_coopmat.glsl uses
// (Debian's glslc compiles it; NVIDIA drivers offer VK_NV_cooperative_matrix beside the KHR one).
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define FRAG_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_A(f, buf, offset, stride) coopMatLoadNV(f, buf, offset, stride, false)
#define LOAD_B(f, buf, offset, stride) coopMatLoadNV(f, buf, offset, stride, true)
#define STORE_C(f, buf, offset, stride) coopMatStoreNV(f, buf, offset, stride, false)
#define MMA(a, b, c) coopMatMulAddNV(a, b, c)
