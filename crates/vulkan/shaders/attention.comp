#version 450
// Attention of one query head of one token over its sequence's cached positions, one
// workgroup each: the positions in tiles of 64 (each invocation one position's score,
// q.k * scale, soft-capped where the row says), then every invocation folds the tile's
// scores in order into the same online softmax (running max, running sum) and
// accumulates its own dimensions of the output (d = lane, lane + 64, ...). A sink logit
// joins the denominator at the end where the layer has sinks (gpt-oss).
// Position p of a sequence lives at cache row tables[offset + p / PAGE] * PAGE + p % PAGE,
// in the part of the caches that holds that page (cache.glsl).
// With -DKV_F16 the cache holds f16 (two to a word) and the query is rounded to f16
// for Q.K, as the CPU's f16 cache computes it; products and sums stay f32.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
#define CACHE_BINDING 1
#include "cache.glsl"
#ifdef KV_F16
float key_at(uint part, uint i) { return f16_to_f32((k_load(part, i >> 1) >> ((i & 1u) * 16u)) & 0xFFFFu); }
float value_at(uint part, uint i) { return f16_to_f32((v_load(part, i >> 1) >> ((i & 1u) * 16u)) & 0xFFFFu); }
#else
float key_at(uint part, uint i) { return uintBitsToFloat(k_load(part, i)); }
float value_at(uint part, uint i) { return uintBitsToFloat(v_load(part, i)); }
#endif
layout(std430, binding = 17) readonly buffer T { uint tables[]; };
layout(std430, binding = 18) readonly buffer S { uint slots[]; };
layout(std430, binding = 19) readonly buffer SK { float sinks[]; };
layout(std430, binding = 20) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint n;
    uint n_head;
    uint n_head_kv;
    uint hk;
    uint hv;
    float scale;
    float softcap;  // 0: none
    uint has_sinks;
    uint s_offset;  // where this layer's slots start (in values)
    uint pages_per_part;
} p;

#ifdef KV_F16
float query_at(uint i) { return f16_to_f32(f32_to_f16(q[i])); }
#else
float query_at(uint i) { return q[i]; }
#endif

const uint TILE = 64u;
// Value dimensions per invocation: heads of up to 8 * 64 = 512.
const uint PER_LANE = 8u;

shared float scores[TILE];

// Position `pos` of the sequence whose page table starts at `offset`: (part, row).
uvec2 cache_row(uint offset, uint pos) {
    return cache_place(tables[offset + pos / PAGE] * PAGE + pos % PAGE, p.pages_per_part);
}

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint lane = gl_LocalInvocationID.x;
    uint kvh = h / (p.n_head / p.n_head_kv);
    uint offset = slots[p.s_offset + 3u * t];
    uint first = slots[p.s_offset + 3u * t + 1u];
    uint end = slots[p.s_offset + 3u * t + 2u];
    uint kd = p.n_head_kv * p.hk;
    uint vd = p.n_head_kv * p.hv;
    uint qb = t * p.n_head * p.hk + h * p.hk;
    float neg_inf = uintBitsToFloat(0xFF800000u);
    float acc[PER_LANE];
    for (uint i = 0u; i < PER_LANE; i++) {
        acc[i] = 0.0;
    }
    float m = neg_inf;
    float l = 0.0;
    for (uint base = first; base < end; base += TILE) {
        uint pos = base + lane;
        float s = neg_inf;
        if (pos < end) {
            uvec2 at = cache_row(offset, pos);
            uint kb = at.y * kd + kvh * p.hk;
            s = 0.0;
            for (uint d = 0u; d < p.hk; d++) {
                s += query_at(qb + d) * key_at(at.x, kb + d);
            }
            s *= p.scale;
            if (p.softcap > 0.0) {
                s = p.softcap * tanh(s / p.softcap);
            }
        }
        scores[lane] = s;
        barrier();
        uint count = min(TILE, end - base);
        for (uint j = 0u; j < count; j++) {
            float sj = scores[j];
            float m2 = max(m, sj);
            float corr = exp(m - m2);
            float e = exp(sj - m2);
            l = l * corr + e;
            uvec2 at = cache_row(offset, base + j);
            uint vb = at.y * vd + kvh * p.hv;
            for (uint i = 0u; i < PER_LANE; i++) {
                uint d = lane + TILE * i;
                if (d < p.hv) {
                    acc[i] = acc[i] * corr + e * value_at(at.x, vb + d);
                }
            }
            m = m2;
        }
        barrier();
    }
    if (p.has_sinks == 1u) {
        float sk = sinks[h];
        float m2 = max(m, sk);
        float corr = exp(m - m2);
        l = l * corr + exp(sk - m2);
        for (uint i = 0u; i < PER_LANE; i++) {
            acc[i] *= corr;
        }
    }
    uint ob = t * p.n_head * p.hv + h * p.hv;
    for (uint i = 0u; i < PER_LANE; i++) {
        uint d = lane + TILE * i;
        if (d < p.hv) {
            o[ob + d] = acc[i] / l;
        }
    }
}
