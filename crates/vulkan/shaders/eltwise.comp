#version 450
// Element-wise steps: GELU (ggml's f16 table, looked up), soft-cap, and the gated
// ones up <- f(up, gate): SwiGLU, GeGLU, gpt-oss's clipped SwiGLU.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
// ggml's GELU table: f16(gelu(h)) for every f16 h, two to a word (the CPU's values).
layout(std430, binding = 2) readonly buffer T { uint table[]; };
layout(push_constant) uniform P {
    uint n;
    uint op;  // 0 gelu, 1 softcap, 2 swiglu, 3 geglu, 4 swiglu_oai
    float c;
} p;

float gelu_f16(float v) {
    if (v <= -10.0) {
        return 0.0;
    }
    if (v >= 10.0) {
        return v;
    }
    uint h = f32_to_f16(v);
    return f16_to_f32((table[h >> 1] >> ((h & 1u) * 16u)) & 0xFFFFu);
}

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    float v = x[i];
    if (p.op == 0u) {
        x[i] = gelu_f16(v);
    } else if (p.op == 1u) {
        x[i] = tanh(v / p.c) * p.c;
    } else if (p.op == 2u) {
        float s = g[i];
        x[i] = v * (s / (1.0 + exp(-s)));
    } else if (p.op == 3u) {
        x[i] = v * gelu_f16(g[i]);
    } else {
        float a = min(g[i], 7.0);
        float u = clamp(v, -7.0, 7.0);
        x[i] = a / (1.0 + exp(1.702 * -a)) * (u + 1.0);
    }
}
