#version 450
// out[t][r] = W[r] · A[t] for a K-quant weight (-DW_Q2_K, -DW_Q3_K, -DW_Q4_K, -DW_Q5_K,
// -DW_Q6_K) and Q8_K activations: per super-block of 256 the exact integer sums of
// llamay's portable kernel (scales x quants x activations, and the mins' sum over the
// 16-value groups), folded acc = acc + d*isum, then acc = acc - dmin*summs, in order and
// without contraction: the CPU kernels' bits. One invocation per (row, token).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#if defined(W_Q2_K)
#define BLOCK_BYTES 84u
#elif defined(W_Q3_K)
#define BLOCK_BYTES 110u
#elif defined(W_Q4_K)
#define BLOCK_BYTES 144u
#elif defined(W_Q5_K)
#define BLOCK_BYTES 176u
#elif defined(W_Q6_K)
#define BLOCK_BYTES 210u
#else
#error "a K-quant: -DW_Q2_K ... -DW_Q6_K"
#endif

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer AD { float ad[]; };
layout(std430, binding = 2) readonly buffer AQ { uint aq[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint rows;
    uint cols;
    uint n;
    uint w_offset; // bytes
    uint o_offset;
    uint o_stride;
} p;

// Activation value e of super-block `ab`.
int act(uint ab, uint e) {
    return int(aq[ab * 64u + e / 4u] << (24u - 8u * (e & 3u))) >> 24;
}

// ggml's get_scale_min_k4 for sub-block j of the 12 scale bytes at `s`.
uvec2 scale_min_k4(uint s, uint j) {
    if (j < 4u) {
        return uvec2(BYTE_AT(w, s + j) & 63u, BYTE_AT(w, s + j + 4u) & 63u);
    }
    uint q = BYTE_AT(w, s + j + 4u);
    return uvec2((q & 0xFu) | ((BYTE_AT(w, s + j - 4u) >> 6) << 4),
                 (q >> 4) | ((BYTE_AT(w, s + j) >> 6) << 4));
}

void main() {
    uint r = gl_GlobalInvocationID.x;
    uint t = gl_GlobalInvocationID.y;
    if (r >= p.rows || t >= p.n) {
        return;
    }
    uint nb = p.cols / 256u;
    precise float acc = 0.0;
    for (uint b = 0u; b < nb; b++) {
        uint x = p.w_offset + (r * nb + b) * BLOCK_BYTES;
        uint ab = t * nb + b;
        float dy = ad[ab];
        int isum = 0;
        int summs = 0;
        float d;
        float dmin = 0.0;
#if defined(W_Q2_K)
        for (uint j = 0u; j < 16u; j++) {
            int bsum = 0;
            for (uint i = 0u; i < 16u; i++) {
                bsum += act(ab, 16u * j + i);
            }
            summs += bsum * int(BYTE_AT(w, x + j) >> 4);
        }
        for (uint e = 0u; e < 256u; e++) {
            uint h = e / 128u;
            uint rr = e % 128u;
            int q = int((BYTE_AT(w, x + 16u + 32u * h + rr % 32u) >> (2u * (rr / 32u))) & 3u);
            isum += int(BYTE_AT(w, x + e / 16u) & 0xFu) * q * act(ab, e);
        }
        d = dy * f16_to_f32(U16_AT(w, x + 80u));
        dmin = dy * f16_to_f32(U16_AT(w, x + 82u));
#elif defined(W_Q3_K)
        for (uint e = 0u; e < 256u; e++) {
            uint h = e / 128u;
            uint rr = e % 128u;
            uint l = rr % 32u;
            int low = int((BYTE_AT(w, x + 32u + 32u * h + l) >> (2u * (rr / 32u))) & 3u);
            uint m = 1u << (e / 32u);
            int q = low - ((BYTE_AT(w, x + l) & m) != 0u ? 0 : 4);
            uint j = e / 16u;
            uint lo = j < 8u ? (BYTE_AT(w, x + 96u + j) & 0xFu) : (BYTE_AT(w, x + 96u + j - 8u) >> 4);
            uint hi = (BYTE_AT(w, x + 104u + j % 4u) >> (2u * (j / 4u))) & 3u;
            int sc = int(lo | (hi << 4)) - 32;
            isum += sc * q * act(ab, e);
        }
        d = f16_to_f32(U16_AT(w, x + 108u)) * dy;
#elif defined(W_Q4_K) || defined(W_Q5_K)
        for (uint j = 0u; j < 16u; j++) {
            int bsum = 0;
            for (uint i = 0u; i < 16u; i++) {
                bsum += act(ab, 16u * j + i);
            }
            summs += bsum * int(scale_min_k4(x + 4u, j / 2u).y);
        }
        for (uint e = 0u; e < 256u; e++) {
            uint c = e / 64u;
            uint rr = e % 64u;
            uint l = rr % 32u;
#if defined(W_Q4_K)
            uint bq = BYTE_AT(w, x + 16u + 32u * c + l);
            int q = int(rr < 32u ? (bq & 0xFu) : (bq >> 4));
#else
            uint bq = BYTE_AT(w, x + 48u + 32u * c + l);
            int low = int(rr < 32u ? (bq & 0xFu) : (bq >> 4));
            int high = (BYTE_AT(w, x + 16u + l) & (1u << (e / 32u))) != 0u ? 16 : 0;
            int q = low + high;
#endif
            isum += int(scale_min_k4(x + 4u, e / 32u).x) * q * act(ab, e);
        }
        d = f16_to_f32(U16_AT(w, x)) * dy;
        dmin = f16_to_f32(U16_AT(w, x + 2u)) * dy;
#else
        for (uint e = 0u; e < 256u; e++) {
            uint h = e / 128u;
            uint rr = e % 128u;
            uint k = rr / 32u;
            uint l = rr % 32u;
            uint ql = BYTE_AT(w, x + 64u * h + l + 32u * (k & 1u));
            uint low = k < 2u ? (ql & 0xFu) : (ql >> 4);
            uint high = (BYTE_AT(w, x + 128u + 32u * h + l) >> (2u * k)) & 3u;
            int q = int(low | (high << 4)) - 32;
            int sc = int(BYTE_AT(w, x + 192u + e / 16u) << 24) >> 24;
            isum += sc * q * act(ab, e);
        }
        d = f16_to_f32(U16_AT(w, x + 208u)) * dy;
#endif
        precise float di = d * float(isum);
        acc = acc + di;
        precise float dm = dmin * float(summs);
        acc = acc - dm;
    }
    o[p.o_offset + t * p.o_stride + r] = acc;
}
