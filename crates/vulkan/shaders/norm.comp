#version 450
// out = norm(x) * w (+ b), one invocation per row. RMSNorm: x / sqrt(mean(x^2) + eps);
// LayerNorm: (x - mean) / sqrt(var + eps). Sums in f32 in order (the CPU sums in f64:
// the difference is a rounding of the scale, bounded in the tests). `out` may alias x:
// an invocation reads its row before it writes it.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer O { float o[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 3) readonly buffer B { float b[]; };
layout(push_constant) uniform P {
    uint rows;
    uint cols;
    uint layer;   // 0: RMS, 1: LayerNorm
    uint has_w;
    uint w_rows;  // the weight row of row r is r % w_rows
    uint has_b;
    float eps;
} p;

void main() {
    uint r = gl_GlobalInvocationID.x;
    if (r >= p.rows) {
        return;
    }
    uint base = r * p.cols;
    float mean = 0.0;
    if (p.layer == 1u) {
        float s = 0.0;
        for (uint i = 0u; i < p.cols; i++) {
            s += x[base + i];
        }
        mean = s / float(p.cols);
    }
    float s2 = 0.0;
    for (uint i = 0u; i < p.cols; i++) {
        float v = x[base + i] - mean;
        s2 += v * v;
    }
    float scale = 1.0 / sqrt(s2 / float(p.cols) + p.eps);
    uint wb = (r % max(p.w_rows, 1u)) * p.cols;
    for (uint i = 0u; i < p.cols; i++) {
        float v = (x[base + i] - mean) * scale;
        if (p.has_w == 1u) {
            v = v * w[wb + i];
        }
        if (p.has_b == 1u) {
            v = v + b[i];
        }
        o[base + i] = v;
    }
}
