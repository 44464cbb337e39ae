#version 450
// Activations to Q8_K as ggml quantises them for the K-quant dot products: per block of
// 256, max = the value of largest magnitude (the first, sign kept), iscale = -127/max,
// q = min(round-half-even(iscale * v), 127), d = 1/iscale (f32). Laid out for the
// device: d in `ad`, the values four to a word in `aq` (64 words a block); the
// matmuls sum the 16-value groups themselves (ggml's bsums: exact integers).
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
    uint base = p.x_offset + b * 256u;
    float amax = 0.0;
    float mx = 0.0;
    for (uint i = 0u; i < 256u; i++) {
        float v = x[base + i];
        if (abs(v) > amax) {
            amax = abs(v);
            mx = v;
        }
    }
    if (amax == 0.0) {
        ad[b] = 0.0;
        for (uint k = 0u; k < 64u; k++) {
            aq[b * 64u + k] = 0u;
        }
        return;
    }
    precise float iscale = -127.0 / mx;
    for (uint k = 0u; k < 64u; k++) {
        uint word = 0u;
        for (uint j = 0u; j < 4u; j++) {
            precise float v = iscale * x[base + 4u * k + j];
            int q = min(int(roundEven(v)), 127);
            word |= (uint(q) & 0xFFu) << (8u * j);
        }
        aq[b * 64u + k] = word;
    }
    precise float d = 1.0 / iscale;
    ad[b] = d;
}
