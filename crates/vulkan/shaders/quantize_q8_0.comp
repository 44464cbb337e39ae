#version 450
// Activations to Q8_0 as ggml-cpu's x86 quantiser computes them (the bytes llama.cpp's
// CPU backend and llamay's kernels feed their dot products): per block of 32, d =
// amax/127 stored as f16, values round(v * 127/amax) half to even, saturated to i8.
// Laid out for the device, not the file: the f16-rounded scales as f32 in `ad`, the
// values four to a word in `aq`. One invocation per block.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer AD { float ad[]; };
layout(std430, binding = 2) writeonly buffer AQ { uint aq[]; };
layout(push_constant) uniform P {
    uint n_blocks;
    uint x_offset;
} p;

void main() {
    uint b = gl_GlobalInvocationID.x;
    if (b >= p.n_blocks) {
        return;
    }
    uint base = p.x_offset + b * 32u;
    float amax = 0.0;
    for (uint i = 0u; i < 32u; i++) {
        float a = abs(x[base + i]);
        amax = amax > a ? amax : a;
    }
    precise float d = amax / 127.0;
    precise float id = amax != 0.0 ? 127.0 / amax : 0.0;
    ad[b] = f16_to_f32(f32_to_f16(d));
    for (uint k = 0u; k < 8u; k++) {
        uint word = 0u;
        for (uint j = 0u; j < 4u; j++) {
            precise float v = x[base + 4u * k + j] * id;
            int q = clamp(int(roundEven(v)), -128, 127);
            word |= (uint(q) & 0xFFu) << (8u * j);
        }
        aq[b * 8u + k] = word;
    }
}
