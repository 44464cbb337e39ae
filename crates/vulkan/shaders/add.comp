#version 450
// x[i] += y[i % y_len] (+ z[i]): residual adds (x + (y + z) in llama.cpp's order for a
// parallel block) and biases (y_len = a row).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer Z { float z[]; };
layout(push_constant) uniform P {
    uint n;
    uint y_len;
    uint has_z;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    precise float a = y[i % p.y_len];
    if (p.has_z == 1u) {
        a = a + z[i];
    }
    x[i] = x[i] + a;
}
