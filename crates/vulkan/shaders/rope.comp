#version 450
// Rotary position embedding in place: one invocation per (row, head, pair). Pairs are
// neighbours (2i, 2i+1) or halves (i, i + n_rot/2, GPT-NeoX); angles are the host's
// (cos, sin) per row and pair, computed as ggml computes them.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer A { vec2 angles[]; };
layout(push_constant) uniform P {
    uint n;
    uint dim;
    uint hd;
    uint half_rot;
    uint neox;
} p;

void main() {
    uint heads = p.dim / p.hd;
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n * heads * p.half_rot) {
        return;
    }
    uint pair = i % p.half_rot;
    uint head = (i / p.half_rot) % heads;
    uint t = i / (p.half_rot * heads);
    uint base = t * p.dim + head * p.hd;
    uint a = p.neox == 1u ? pair : 2u * pair;
    uint b = p.neox == 1u ? pair + p.half_rot : 2u * pair + 1u;
    vec2 cs = angles[t * p.half_rot + pair];
    float x0 = x[base + a];
    float x1 = x[base + b];
    precise float y0 = x0 * cs.x - x1 * cs.y;
    precise float y1 = x0 * cs.y + x1 * cs.x;
    x[base + a] = y0;
    x[base + b] = y1;
}
