#version 450
// The batch's keys and values into the caches: row t of k (k_dim values) and of v
// (v_dim) to cache position targets[t] (a page's id * PAGE + its slot), in the part
// of the caches that holds that page (cache.glsl). The cache holds one row per
// position: f32, or with -DKV_F16 f16 rounded to nearest even as the CPU's f16 cache
// rounds them (two to a word; an invocation writes a whole word).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) readonly buffer T { uint targets[]; };
#define CACHE_BINDING 3
#define CACHE_WRITE
#include "cache.glsl"
layout(push_constant) uniform P {
    uint n;
    uint k_dim;
    uint v_dim;
    uint t_offset;  // where this layer's targets start
    uint pages_per_part;
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
    uvec2 at = cache_place(targets[p.t_offset + t], p.pages_per_part);
    if (c < p.k_dim) {
        uint a = t * p.k_dim + c;
        k_store(at.x, (at.y * p.k_dim + c) / 2u, f32_to_f16(k[a]) | (f32_to_f16(k[a + 1u]) << 16));
    }
    if (c < p.v_dim) {
        uint a = t * p.v_dim + c;
        v_store(at.x, (at.y * p.v_dim + c) / 2u, f32_to_f16(v[a]) | (f32_to_f16(v[a + 1u]) << 16));
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
    uvec2 at = cache_place(targets[p.t_offset + t], p.pages_per_part);
    if (c < p.k_dim) {
        k_store(at.x, at.y * p.k_dim + c, floatBitsToUint(k[t * p.k_dim + c]));
    }
    if (c < p.v_dim) {
        v_store(at.x, at.y * p.v_dim + c, floatBitsToUint(v[t * p.v_dim + c]));
    }
}
#endif
