#version 450
// Attention of one query head of one token over its sequence's cached positions, one
// invocation each: scores q.k * scale (soft-capped where the row says), an online
// softmax (running max, running sum, output rescaled when the max grows), a sink
// logit joining the denominator at the end where the layer has sinks (gpt-oss).
// Position p of a sequence lives at cache row tables[offset + p / PAGE] * PAGE + p % PAGE.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer KC { float kc[]; };
layout(std430, binding = 2) readonly buffer VC { float vc[]; };
layout(std430, binding = 3) readonly buffer T { uint tables[]; };
layout(std430, binding = 4) readonly buffer S { uint slots[]; };
layout(std430, binding = 5) readonly buffer SK { float sinks[]; };
layout(std430, binding = 6) writeonly buffer O { float o[]; };
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
} p;

const uint PAGE = 64u;
const uint MAX_HV = 512u;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n * p.n_head) {
        return;
    }
    uint t = i / p.n_head;
    uint h = i % p.n_head;
    uint kvh = h / (p.n_head / p.n_head_kv);
    uint offset = slots[p.s_offset + 3u * t];
    uint first = slots[p.s_offset + 3u * t + 1u];
    uint end = slots[p.s_offset + 3u * t + 2u];
    uint kd = p.n_head_kv * p.hk;
    uint vd = p.n_head_kv * p.hv;
    uint qb = t * p.n_head * p.hk + h * p.hk;
    float acc[MAX_HV];
    for (uint d = 0u; d < p.hv; d++) {
        acc[d] = 0.0;
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    for (uint pos = first; pos < end; pos++) {
        uint row = tables[offset + pos / PAGE] * PAGE + pos % PAGE;
        uint kb = row * kd + kvh * p.hk;
        float s = 0.0;
        for (uint d = 0u; d < p.hk; d++) {
            s += q[qb + d] * kc[kb + d];
        }
        s *= p.scale;
        if (p.softcap > 0.0) {
            s = p.softcap * tanh(s / p.softcap);
        }
        float m2 = max(m, s);
        float corr = exp(m - m2);
        float e = exp(s - m2);
        l = l * corr + e;
        uint vb = row * vd + kvh * p.hv;
        for (uint d = 0u; d < p.hv; d++) {
            acc[d] = acc[d] * corr + e * vc[vb + d];
        }
        m = m2;
    }
    if (p.has_sinks == 1u) {
        float sk = sinks[h];
        float m2 = max(m, sk);
        float corr = exp(m - m2);
        l = l * corr + exp(sk - m2);
        for (uint d = 0u; d < p.hv; d++) {
            acc[d] *= corr;
        }
    }
    uint ob = t * p.n_head * p.hv + h * p.hv;
    for (uint d = 0u; d < p.hv; d++) {
        o[ob + d] = acc[d] / l;
    }
}
