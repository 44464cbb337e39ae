#version 450
// out[t][r] = W[r] · x[t] for float weights (-DW_F32, -DW_F16, -DW_BF16) and the f32
// activation rows themselves, rounded first to the weight's dot type as the CPU rounds
// them (f16 to nearest even; bf16 as ggml rounds), products summed in f32 in column
// order (the CPU's portable kernel sums in f64: not its bits, a bound). One invocation
// per (row, token); rows `rows` of a matrix whose output rows are `o_stride` long.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint rows;
    uint cols;
    uint n;
    uint w_offset;  // unused: the quantised kernels' push layout, shared
    uint o_offset;
    uint o_stride;
} p;

float weight(uint i) {
#if defined(W_F32)
    return uintBitsToFloat(w[i]);
#elif defined(W_F16)
    return f16_to_f32(U16_AT(w, 2u * i));
#elif defined(W_BF16)
    return uintBitsToFloat(U16_AT(w, 2u * i) << 16);
#else
#error "a float format: -DW_F32, -DW_F16 or -DW_BF16"
#endif
}

float act(float v) {
#if defined(W_F16)
    return f16_to_f32(f32_to_f16(v));
#elif defined(W_BF16)
    uint u = floatBitsToUint(v);
    return uintBitsToFloat(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
#else
    return v;
#endif
}

void main() {
    uint r = gl_GlobalInvocationID.x;
    uint t = gl_GlobalInvocationID.y;
    if (r >= p.rows || t >= p.n) {
        return;
    }
    float acc = 0.0;
    for (uint c = 0u; c < p.cols; c++) {
        acc += weight(r * p.cols + c) * act(x[t * p.cols + c]);
    }
    o[p.o_offset + t * p.o_stride + r] = acc;
}
