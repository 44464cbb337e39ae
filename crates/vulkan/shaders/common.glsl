// Helpers every kernel shares: weights arrive as the GGUF file's bytes in a buffer of
// 32-bit words (any block size, no 8- or 16-bit storage feature needed), and f16 values
// are converted by hand so that the rounding is IEEE's on every device (GLSL leaves
// packHalf2x16's rounding to the implementation).

// The byte at byte offset `o` of `words`.
#define BYTE_AT(words, o) ((words[(o) >> 2] >> (((o) & 3u) * 8u)) & 0xFFu)
// The little-endian u16 at an even byte offset `o`.
#define U16_AT(words, o) ((words[(o) >> 2] >> (((o) & 2u) * 8u)) & 0xFFFFu)
// The little-endian u32 at byte offset `o` (any alignment).
#define U32_AT(words, o) ((((o) & 3u) == 0u) ? words[(o) >> 2] \
    : ((words[(o) >> 2] >> (((o) & 3u) * 8u)) | (words[((o) >> 2) + 1u] << (32u - ((o) & 3u) * 8u))))

// f16 bits to f32, exactly (subnormals included).
float f16_to_f32(uint h) {
    uint s = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1Fu;
    uint m = h & 0x3FFu;
    if (e == 0u) {
        // m * 2^-24: exact in f32.
        float v = float(m) * uintBitsToFloat(0x33800000u);
        return s != 0u ? -v : v;
    }
    if (e == 31u) {
        return uintBitsToFloat(s | 0x7F800000u | (m << 13));
    }
    return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

// f32 to f16 bits, round to nearest even (as the half crate and F16C do); NaN is 0x7E00.
uint f32_to_f16(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) {
        return 0x7E00u;
    }
    if (ax >= 0x477FF000u) {
        return sign | 0x7C00u;
    }
    if (ax < 0x38800000u) {
        // An f16 subnormal (or zero): units of 2^-24.
        if (ax < 0x33000000u) {
            return sign;
        }
        uint e = ax >> 23;
        uint m = (ax & 0x7FFFFFu) | 0x800000u;
        uint s = 126u - e;
        uint q = m >> s;
        uint rem = m & ((1u << s) - 1u);
        uint half_ = 1u << (s - 1u);
        if (rem > half_ || (rem == half_ && (q & 1u) == 1u)) {
            q += 1u;
        }
        return sign | q;
    }
    uint r = ax - 0x38000000u;
    uint h = r >> 13;
    uint rest = r & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) {
        h += 1u;
    }
    return sign | h;
}
