#version 450
// The batch's keys and values into the caches: row t of k (k_dim values) and of v
// (v_dim) to cache position targets[t] (a page's id * PAGE + its slot). The device's
// cache holds f32 rows, one per position.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) readonly buffer T { uint targets[]; };
layout(std430, binding = 3) writeonly buffer KC { float kc[]; };
layout(std430, binding = 4) writeonly buffer VC { float vc[]; };
layout(push_constant) uniform P {
    uint n;
    uint k_dim;
    uint v_dim;
    uint t_offset;  // where this layer's targets start
} p;

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
