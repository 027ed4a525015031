// GL_KHR_cooperative_matrix spelling of the fragment operations gemm_f16_coopmat.glsl uses.
// Needs glslang 13 or newer (build.rs compiles the kernels that include this with
// glslangValidator; Debian's glslc, glslang 11.13, predates the extension).
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_A(f, buf, offset, stride) coopMatLoad(f, buf, offset, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(f, buf, offset, stride) coopMatLoad(f, buf, offset, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_C(f, buf, offset, stride) coopMatStore(f, buf, offset, stride, gl_CooperativeMatrixLayoutRowMajor)
#define MMA(a, b, c) coopMatMulAdd(a, b, c)
