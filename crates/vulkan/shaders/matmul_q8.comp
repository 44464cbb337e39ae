#version 450
// out[t][r] = W[r] · A[t] (rows `rows` of a matrix whose output rows are `o_stride`
// long: a matrix larger than one binding runs in parts) for a weight format paired with Q8_0 activations (Q8_0,
// Q4_0, Q5_0; the format is chosen at compile time: -DW_Q8_0, -DW_Q4_0, -DW_Q5_0).
// W stays in the file's block layout. Per block the integer sum is exact; the blocks
// are folded in order, acc += (dw * da) * sumi without contraction, as llamay's
// portable kernel folds them: one invocation per (row, token) gives the CPU's bits.
// With -DDOT4 each four products are one packed 4x8-bit signed dot product
// (VK_KHR_shader_integer_dot_product's OpSDot, written through GL_EXT_spirv_intrinsics:
// Debian's glslc has no GL_EXT_integer_dot_product): the same integers, so the same bits.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#if defined(DOT4)
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450) on two 32-bit words of four signed bytes (packed format 0),
// capabilities DotProduct (6019) and DotProductInput4x8BitPacked (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(int a, int b, spirv_literal int packed_format);
#endif

#if defined(W_Q8_0)
#define BLOCK_BYTES 34u
#elif defined(W_Q4_0)
#define BLOCK_BYTES 18u
#elif defined(W_Q5_0)
#define BLOCK_BYTES 22u
#else
#error "a weight format: -DW_Q8_0, -DW_Q4_0 or -DW_Q5_0"
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
    uint o_offset; // floats: where row 0 of token 0 goes
    uint o_stride; // floats between tokens' outputs (all the matrix's rows)
} p;

// The signed integer weight of element j of the block at byte offset `blk`.
int weight(uint blk, uint j) {
#if defined(W_Q8_0)
    return int(BYTE_AT(w, blk + 2u + j) << 24) >> 24;
#elif defined(W_Q4_0)
    uint q = BYTE_AT(w, blk + 2u + (j & 15u));
    return int(j < 16u ? (q & 15u) : (q >> 4)) - 8;
#else
    uint qh = U32_AT(w, blk + 2u);
    uint q = BYTE_AT(w, blk + 6u + (j & 15u));
    uint lo = j < 16u ? (q & 15u) : (q >> 4);
    return int(lo | (((qh >> j) & 1u) << 4)) - 16;
#endif
}

#if defined(DOT4)
// Weights 4k..4k+3 of the block as four signed bytes.
int weights4(uint blk, uint k) {
#if defined(W_Q8_0)
    return int(U32_AT(w, blk + 2u + 4u * k));
#else
    uint packed = 0u;
    for (uint j = 0u; j < 4u; j++) {
        packed |= (uint(weight(blk, 4u * k + j)) & 0xFFu) << (8u * j);
    }
    return int(packed);
#endif
}
#endif

void main() {
    uint r = gl_GlobalInvocationID.x;
    uint t = gl_GlobalInvocationID.y;
    if (r >= p.rows || t >= p.n) {
        return;
    }
    uint nb = p.cols / 32u;
    precise float acc = 0.0;
    for (uint b = 0u; b < nb; b++) {
        uint blk = p.w_offset + (r * nb + b) * BLOCK_BYTES;
        uint ab = t * nb + b;
        int sumi = 0;
        for (uint k = 0u; k < 8u; k++) {
            uint a4 = aq[ab * 8u + k];
#if defined(DOT4)
            sumi += sdot4(weights4(blk, k), int(a4), 0);
#else
            for (uint j = 0u; j < 4u; j++) {
                int a = int(a4 << (24u - 8u * j)) >> 24;
                sumi += weight(blk, 4u * k + j) * a;
            }
#endif
        }
        precise float scale = f16_to_f32(U16_AT(w, blk)) * ad[ab];
        precise float prod = scale * float(sumi);
        acc = acc + prod;
    }
    o[p.o_offset + t * p.o_stride + r] = acc;
}
