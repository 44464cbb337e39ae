// Calls llama.cpp's own reference (de)quantisers from the b11434 tree, for the test
// vectors in crates/formats/tests/data. Built and driven by scripts/gen-format-vectors.
//
//   ref_quantize quant   TYPE IN.f32 OUT.bin   quantize_row_*_ref over the whole input
//   ref_quantize dequant TYPE IN.bin OUT.f32   dequantize_row_* over the whole input
//   ref_quantize chunk   TYPE IN.f32 OUT.bin N_PER_ROW [WEIGHTS.f32]
//                                              quantize_<type>(src, dst, nrows, n_per_row,
//                                              weights or NULL), as ggml_quantize_chunk
//                                              calls it (llama-quantize's path), one row
//                                              at a time: a row where ggml aborts
//                                              (GGML_ASSERT/GGML_ABORT: the i-quant grid
//                                              searches on extreme values) is written as
//                                              all 0xFF bytes, which no quantiser writes
//                                              (its first block's f16 d would be -NaN)
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-impl.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*dequant_fn)(const void *, float *, int64_t);
typedef size_t (*chunk_fn)(const float *, void *, int64_t, int64_t, const float *);

struct row {
    const char * name;
    int block, size;
    quant_fn q;
    dequant_fn d;
    enum ggml_type type;
    chunk_fn c; // ggml_quantize_chunk's quantize_<type>, or NULL
};

static const struct row * find_type(enum ggml_type type);

// The few ggml.c symbols ggml-quants.c links against, so that the build stays one
// translation unit of the reference tree. ggml_row_size is reached by the quantize_<type>
// functions; it is ggml.c's `ggml_type_size(type)*ne/ggml_blck_size(type)`.
static jmp_buf row_abort; // set while chunk mode quantises a row
static int catching = 0;
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt);
    if (catching) longjmp(row_abort, 1);
    abort();
}
size_t ggml_type_size(enum ggml_type type) { return find_type(type)->size; }
size_t ggml_row_size(enum ggml_type type, int64_t ne) {
    const struct row * r = find_type(type);
    if (ne % r->block != 0) abort();
    return r->size * ne / r->block;
}
const char * ggml_type_name(enum ggml_type type) { (void) type; return "?"; }

static void q_f16(const float * x, void * y, int64_t k) {
    for (int64_t i = 0; i < k; i++) ((ggml_fp16_t *) y)[i] = GGML_FP32_TO_FP16(x[i]);
}
static void q_bf16(const float * x, void * y, int64_t k) {
    for (int64_t i = 0; i < k; i++) ((ggml_bf16_t *) y)[i] = GGML_FP32_TO_BF16(x[i]);
}
static void d_f16(const void * x, float * y, int64_t k) {
    for (int64_t i = 0; i < k; i++) y[i] = GGML_FP16_TO_FP32(((const ggml_fp16_t *) x)[i]);
}
static void d_bf16(const void * x, float * y, int64_t k) {
    for (int64_t i = 0; i < k; i++) y[i] = GGML_BF16_TO_FP32(((const ggml_bf16_t *) x)[i]);
}

#define Q(f) ((quant_fn) (f))
#define D(f) ((dequant_fn) (f))
#define T(t) GGML_TYPE_##t

static const struct row rows[] = {
    {"F16", 1, 2, q_f16, d_f16, T(F16), NULL},
    {"BF16", 1, 2, q_bf16, d_bf16, T(BF16), NULL},
    {"Q4_0", 32, 18, Q(quantize_row_q4_0_ref), D(dequantize_row_q4_0), T(Q4_0), quantize_q4_0},
    {"Q4_1", 32, 20, Q(quantize_row_q4_1_ref), D(dequantize_row_q4_1), T(Q4_1), quantize_q4_1},
    {"Q5_0", 32, 22, Q(quantize_row_q5_0_ref), D(dequantize_row_q5_0), T(Q5_0), quantize_q5_0},
    {"Q5_1", 32, 24, Q(quantize_row_q5_1_ref), D(dequantize_row_q5_1), T(Q5_1), quantize_q5_1},
    {"Q8_0", 32, 34, Q(quantize_row_q8_0_ref), D(dequantize_row_q8_0), T(Q8_0), quantize_q8_0},
    {"Q8_1", 32, 36, Q(quantize_row_q8_1_ref), NULL, T(Q8_1), NULL},
    {"Q2_K", 256, 84, Q(quantize_row_q2_K_ref), D(dequantize_row_q2_K), T(Q2_K), quantize_q2_K},
    {"Q3_K", 256, 110, Q(quantize_row_q3_K_ref), D(dequantize_row_q3_K), T(Q3_K), quantize_q3_K},
    {"Q4_K", 256, 144, Q(quantize_row_q4_K_ref), D(dequantize_row_q4_K), T(Q4_K), quantize_q4_K},
    {"Q5_K", 256, 176, Q(quantize_row_q5_K_ref), D(dequantize_row_q5_K), T(Q5_K), quantize_q5_K},
    {"Q6_K", 256, 210, Q(quantize_row_q6_K_ref), D(dequantize_row_q6_K), T(Q6_K), quantize_q6_K},
    {"Q8_K", 256, 292, Q(quantize_row_q8_K_ref), D(dequantize_row_q8_K), T(Q8_K), NULL},
    {"MXFP4", 32, 17, Q(quantize_row_mxfp4_ref), D(dequantize_row_mxfp4), T(MXFP4), quantize_mxfp4},
    {"IQ4_NL", 32, 18, NULL, D(dequantize_row_iq4_nl), T(IQ4_NL), quantize_iq4_nl},
    {"IQ4_XS", 256, 136, NULL, D(dequantize_row_iq4_xs), T(IQ4_XS), quantize_iq4_xs},
    {"IQ2_XXS", 256, 66, NULL, D(dequantize_row_iq2_xxs), T(IQ2_XXS), quantize_iq2_xxs},
    {"IQ2_XS", 256, 74, NULL, D(dequantize_row_iq2_xs), T(IQ2_XS), quantize_iq2_xs},
    {"IQ2_S", 256, 82, NULL, D(dequantize_row_iq2_s), T(IQ2_S), quantize_iq2_s},
    {"IQ3_XXS", 256, 98, NULL, D(dequantize_row_iq3_xxs), T(IQ3_XXS), quantize_iq3_xxs},
    {"IQ3_S", 256, 110, NULL, D(dequantize_row_iq3_s), T(IQ3_S), quantize_iq3_s},
};

static const struct row * find_type(enum ggml_type type) {
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        if (rows[i].type == type) return &rows[i];
    }
    fprintf(stderr, "type %d not in the table\n", (int) type);
    abort();
}

static void * slurp(const char * path, long * n) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void * buf = malloc(*n + 1);
    if (fread(buf, 1, *n, f) != (size_t) *n) { perror(path); exit(1); }
    fclose(f);
    return buf;
}

static void spit(const char * path, const void * buf, long n) {
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != (size_t) n) { perror(path); exit(1); }
    fclose(f);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s quant|dequant TYPE IN OUT | chunk TYPE IN OUT N_PER_ROW [WEIGHTS]\n", argv[0]);
        return 2;
    }
    const struct row * r = NULL;
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        if (strcmp(rows[i].name, argv[2]) == 0) r = &rows[i];
    }
    if (!r) { fprintf(stderr, "unknown type %s\n", argv[2]); return 2; }
    long n;
    void * in = slurp(argv[3], &n);
    if (strcmp(argv[1], "quant") == 0 && r->q) {
        long k = n / 4;
        long bytes = k / r->block * r->size;
        void * out = calloc(bytes + 1, 1); // zeroed: Q8_K leaves bsums unset for zero blocks
        r->q((const float *) in, out, k);
        spit(argv[4], out, bytes);
    } else if (strcmp(argv[1], "chunk") == 0 && r->c && (argc == 6 || argc == 7)) {
        long n_per_row = atol(argv[5]);
        long k = n / 4;
        if (n_per_row <= 0 || k % n_per_row != 0) { fprintf(stderr, "bad N_PER_ROW\n"); return 2; }
        const float * qw = NULL;
        if (argc == 7) {
            long nw;
            qw = slurp(argv[6], &nw);
            if (nw != n_per_row * 4) { fprintf(stderr, "weights: %ld bytes, want %ld\n", nw, n_per_row * 4); return 2; }
        }
        long bytes = k / r->block * r->size;
        void * out = calloc(bytes + 1, 1);
        // ggml_quantize_init: the lattice tables of the grid quantisers
        switch (r->type) {
            case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS: case GGML_TYPE_IQ2_S:
                iq2xs_init_impl(r->type); break;
            case GGML_TYPE_IQ3_XXS: iq3xs_init_impl(256); break;
            case GGML_TYPE_IQ3_S: iq3xs_init_impl(512); break;
            default: break;
        }
        long row_bytes = bytes / (k / n_per_row);
        for (long row = 0; row < k / n_per_row; row++) {
            char * dst = (char *) out + row * row_bytes;
            catching = 1;
            if (setjmp(row_abort)) {
                catching = 0;
                fprintf(stderr, "%s: ggml aborts on row %ld\n", r->name, row);
                memset(dst, 0xFF, row_bytes);
                continue;
            }
            size_t got = r->c((const float *) in + row * n_per_row, dst, 1, n_per_row, qw);
            catching = 0;
            if ((long) got != row_bytes) { fprintf(stderr, "%s: %zu bytes, want %ld\n", r->name, got, row_bytes); return 1; }
        }
        spit(argv[4], out, bytes);
    } else if (strcmp(argv[1], "dequant") == 0 && r->d) {
        long k = n / r->size * r->block;
        float * out = calloc(k + 1, sizeof(float));
        r->d(in, out, k);
        spit(argv[4], out, k * 4);
    } else {
        fprintf(stderr, "%s %s: not available\n", argv[1], argv[2]);
        return 2;
    }
    return 0;
}
