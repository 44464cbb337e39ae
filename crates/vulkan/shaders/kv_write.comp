#version 450
// The batch's keys and values into the caches: row t of k (k_dim values) and of v
// (v_dim) to cache position targets[t] (a page's id * PAGE + its slot). The cache
// holds one row per position: f32, or with -DKV_F16 f16 rounded to nearest even as
// the CPU's f16 cache rounds them (two to a word; an invocation writes a whole word).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) readonly buffer T { uint targets[]; };
#ifdef KV_F16
layout(std430, binding = 3) writeonly buffer KC { uint kc[]; };
layout(std430, binding = 4) writeonly buffer VC { uint vc[]; };
#else
layout(std430, binding = 3) writeonly buffer KC { float kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float vc[]; };
#endif
layout(push_constant) uniform P {
    uint n;
    uint k_dim;
    uint v_dim;
    uint t_offset;  // where this layer's targets start
} p;

#ifdef KV_F16
void main() {
    // One invocation per pair of values (dimensions are even).
    uint i = gl_GlobalInvocationID.x;
    uint width = max(p.k_dim, p.v_dim) / 2u;
    if (i >= p.n * width) {
        return;
    }
    uint t = i / width;
    uint c = 2u * (i % width);
    uint row = targets[p.t_offset + t];
    if (c < p.k_dim) {
        uint a = t * p.k_dim + c;
        kc[(row * p.k_dim + c) / 2u] = f32_to_f16(k[a]) | (f32_to_f16(k[a + 1u]) << 16);
    }
    if (c < p.v_dim) {
        uint a = t * p.v_dim + c;
        vc[(row * p.v_dim + c) / 2u] = f32_to_f16(v[a]) | (f32_to_f16(v[a + 1u]) << 16);
    }
}
#else
void main() {
    uint i = gl_GlobalInvocationID.x;
    uint width = max(p.k_dim, p.v_dim);
    if (i >= p.n * width) {
        return;
    }
    uint t = i / width;
    uint c = i % width;
    uint row = targets[p.t_offset + t];
    if (c < p.k_dim) {
        kc[row * p.k_dim + c] = k[t * p.k_dim + c];
    }
    if (c < p.v_dim) {
        vc[row * p.v_dim + c] = v[t * p.v_dim + c];
    }
}
#endif
