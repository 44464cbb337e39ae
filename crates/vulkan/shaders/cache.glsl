// The KV pool's keys and values, each split over CACHE_PARTS buffers of p.pages_per_part
// pages (a device binds a limited range per buffer: lavapipe's is 128 MiB, less than a
// serve's default pool of the smallest Gemma). Page `id` lives in buffer
// id / pages_per_part; both caches split at the same pages. The engine binds every
// part, repeating the first where a pool has fewer (src/device.rs, CACHE_PARTS).
// Words are 32-bit: an f32 value, or two f16 values.
//
// Before including: CACHE_BINDING (the first part's binding; keys take CACHE_PARTS
// bindings from there, values the next CACHE_PARTS) and CACHE_WRITE for writers.
#define CACHE_PARTS 8u
// Positions per page (the engine's kv::PAGE).
const uint PAGE = 64u;

#ifdef CACHE_WRITE
#define CACHE_ACCESS writeonly
#else
#define CACHE_ACCESS readonly
#endif
#define CACHE_BUFFER(i, name, words) \
    layout(std430, binding = CACHE_BINDING + i) CACHE_ACCESS buffer name { uint words[]; };
CACHE_BUFFER(0, K0, k0)
CACHE_BUFFER(1, K1, k1)
CACHE_BUFFER(2, K2, k2)
CACHE_BUFFER(3, K3, k3)
CACHE_BUFFER(4, K4, k4)
CACHE_BUFFER(5, K5, k5)
CACHE_BUFFER(6, K6, k6)
CACHE_BUFFER(7, K7, k7)
CACHE_BUFFER(8, V0, v0)
CACHE_BUFFER(9, V1, v1)
CACHE_BUFFER(10, V2, v2)
CACHE_BUFFER(11, V3, v3)
CACHE_BUFFER(12, V4, v4)
CACHE_BUFFER(13, V5, v5)
CACHE_BUFFER(14, V6, v6)
CACHE_BUFFER(15, V7, v7)

// A switch, not an array of bindings indexed by a value: a tile of positions may
// straddle two pages, and indexing a binding array by a non-uniform value needs a
// device feature; branching does not.
#ifdef CACHE_WRITE
void k_store(uint part, uint i, uint w) {
    switch (part) {
        case 0u: k0[i] = w; break;
        case 1u: k1[i] = w; break;
        case 2u: k2[i] = w; break;
        case 3u: k3[i] = w; break;
        case 4u: k4[i] = w; break;
        case 5u: k5[i] = w; break;
        case 6u: k6[i] = w; break;
        default: k7[i] = w; break;
    }
}
void v_store(uint part, uint i, uint w) {
    switch (part) {
        case 0u: v0[i] = w; break;
        case 1u: v1[i] = w; break;
        case 2u: v2[i] = w; break;
        case 3u: v3[i] = w; break;
        case 4u: v4[i] = w; break;
        case 5u: v5[i] = w; break;
        case 6u: v6[i] = w; break;
        default: v7[i] = w; break;
    }
}
#else
uint k_load(uint part, uint i) {
    switch (part) {
        case 0u: return k0[i];
        case 1u: return k1[i];
        case 2u: return k2[i];
        case 3u: return k3[i];
        case 4u: return k4[i];
        case 5u: return k5[i];
        case 6u: return k6[i];
        default: return k7[i];
    }
}
uint v_load(uint part, uint i) {
    switch (part) {
        case 0u: return v0[i];
        case 1u: return v1[i];
        case 2u: return v2[i];
        case 3u: return v3[i];
        case 4u: return v4[i];
        case 5u: return v5[i];
        case 6u: return v6[i];
        default: return v7[i];
    }
}
#endif

// Cache row `row` (a page's id * PAGE + its slot) as (part, row within the part).
uvec2 cache_place(uint row, uint pages_per_part) {
    uint page = row / PAGE;
    return uvec2(page / pages_per_part, (page % pages_per_part) * PAGE + row % PAGE);
}
