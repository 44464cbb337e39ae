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
#define CACHE_CASES(c, stmt) \
    switch (part) { \
        case 0u: stmt(c##0); case 1u: stmt(c##1); case 2u: stmt(c##2); case 3u: stmt(c##3); \
        case 4u: stmt(c##4); case 5u: stmt(c##5); case 6u: stmt(c##6); default: stmt(c##7); \
    }
#ifdef CACHE_WRITE
#define CACHE_STORE(words) words[i] = w; break
void k_store(uint part, uint i, uint w) { CACHE_CASES(k, CACHE_STORE) }
void v_store(uint part, uint i, uint w) { CACHE_CASES(v, CACHE_STORE) }
#else
#define CACHE_LOAD(words) return words[i]
uint k_load(uint part, uint i) { CACHE_CASES(k, CACHE_LOAD) }
uint v_load(uint part, uint i) { CACHE_CASES(v, CACHE_LOAD) }
#endif

// Cache row `row` (a page's id * PAGE + its slot) as (part, row within the part).
uvec2 cache_place(uint row, uint pages_per_part) {
    uint page = row / PAGE;
    return uvec2(page / pages_per_part, (page % pages_per_part) * PAGE + row % PAGE);
}
