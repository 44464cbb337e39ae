// ggml-cpu's own activation quantisers (the `from_float` of its type traits: for Q8_0
// and Q8_1 the SIMD `quantize_row_q8_0` / `quantize_row_q8_1` of the CPU it was built
// for), linked against the libggml-cpu that scripts/build-ref builds. Driven by
// scripts/gen-q8-cpu-vectors.
//
//   ref_q8_cpu q8_0|q8_1 IN.f32 OUT.bin
#include "ggml.h"
#include "ggml-cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: ref_q8_cpu q8_0|q8_1 IN.f32 OUT.bin\n");
        return 2;
    }
    enum ggml_type ty;
    if (strcmp(argv[1], "q8_0") == 0) {
        ty = GGML_TYPE_Q8_0;
    } else if (strcmp(argv[1], "q8_1") == 0) {
        ty = GGML_TYPE_Q8_1;
    } else {
        fprintf(stderr, "unknown type %s\n", argv[1]);
        return 2;
    }
    FILE * f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int64_t n = bytes / 4;
    float * x = malloc(bytes);
    if (fread(x, 4, n, f) != (size_t) n) { perror("read"); return 1; }
    fclose(f);
    ggml_cpu_init();
    size_t out_bytes = ggml_row_size(ty, n);
    void * y = malloc(out_bytes);
    ggml_get_type_traits_cpu(ty)->from_float(x, y, n);
    FILE * o = fopen(argv[3], "wb");
    if (!o || fwrite(y, 1, out_bytes, o) != out_bytes) { perror(argv[3]); return 1; }
    fclose(o);
    return 0;
}
