#version 450
// out[r] = x[index[index_offset + r]] for rows of `cols` values; one invocation per value.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer I { uint index[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint rows;
    uint cols;
    uint index_offset;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.rows * p.cols) {
        return;
    }
    uint r = i / p.cols;
    o[i] = x[index[p.index_offset + r] * p.cols + i % p.cols];
}
