// Oracle for the quant crate, built from llama.cpp's own C sources (not shipped, not linked
// into mollm): K-quant reference quantizers (ggml-quants.c) and the generic scalar dot
// products (ggml-cpu/quants.c compiled with GGML_CPU_GENERIC). Prints JSON on stdout.
// Built and run by scripts/quant_fixtures.py:
//   gcc -O2 -ffp-contract=off -DGGML_CPU_GENERIC -I$G/include -I$G/src -I$G/src/ggml-cpu \
//       ggml_oracle.c $G/src/ggml-quants.c $G/src/ggml-cpu/quants.c -lm
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-quants.h"

// ---- stubs for the few ggml symbols these two files use
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d %s\n", file, line, fmt); abort(); }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void) t; (void) n; abort(); }
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }

typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_1_q8_1(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_1_q8_1(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q8_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q2_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q3_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q6_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);

typedef void (*quant_fn)(const float *, void *, int64_t);

static uint64_t rng_state = 0x1234567887654321ull;
static float uniform(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) + 0.5f) / 16777216.0f;
}
static float normal(void) {
    float u = uniform(), v = uniform();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}
static void fill(float * x, int n, float scale, int variant) {
    for (int i = 0; i < n; i++) x[i] = normal() * scale;
    if (variant == 1) {                      // zero sub-blocks, an outlier, coarse values
        for (int i = 0; i < 32; i++) x[i] = 0.0f;
        x[40] = 8.0f * scale;
        for (int i = 64; i < 96; i++) x[i] = roundf(x[i] * 8.0f) / 8.0f;
    }
    if (variant == 2) for (int i = 0; i < n; i++) x[i] = fabsf(x[i]) + 0.5f * scale;   // all positive
}
static void hex(const void * p, size_t n) {
    const uint8_t * b = p;
    putchar('"');
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    putchar('"');
}
static void f32hex(const float * x, int n) {
    putchar('"');
    for (int i = 0; i < n; i++) { uint32_t u; memcpy(&u, &x[i], 4); printf("%08x", u); }
    putchar('"');
}

struct qt { const char * name; quant_fn q; int blen; int bbytes; };
static const struct qt QTS[] = {
    {"q4_0", (quant_fn) quantize_row_q4_0_ref, 32, 18}, {"q4_1", (quant_fn) quantize_row_q4_1_ref, 32, 20},
    {"q5_0", (quant_fn) quantize_row_q5_0_ref, 32, 22}, {"q5_1", (quant_fn) quantize_row_q5_1_ref, 32, 24},
    {"q8_0", (quant_fn) quantize_row_q8_0_ref, 32, 34}, {"q8_1", (quant_fn) quantize_row_q8_1_ref, 32, 36},
    {"q2_K", (quant_fn) quantize_row_q2_K_ref, 256, 84}, {"q3_K", (quant_fn) quantize_row_q3_K_ref, 256, 110},
    {"q4_K", (quant_fn) quantize_row_q4_K_ref, 256, 144}, {"q5_K", (quant_fn) quantize_row_q5_K_ref, 256, 176},
    {"q6_K", (quant_fn) quantize_row_q6_K_ref, 256, 210}, {"q8_K", (quant_fn) quantize_row_q8_K_ref, 256, 292},
};
static const struct qt * find(const char * name) {
    for (size_t i = 0; i < sizeof(QTS) / sizeof(QTS[0]); i++) if (!strcmp(QTS[i].name, name)) return &QTS[i];
    abort();
}

int main(void) {
    for (int i = 0; i < 65536; i++) { _Float16 h; uint16_t u = i; memcpy(&h, &u, 2); ggml_table_f32_f16[i] = (float) h; }
    enum { N = 256 };
    static float x[N], a[N];
    static uint8_t qb[N * 2], ab[N * 2];
    printf("{\"oracle\": \"llama.cpp ggml-quants.c *_ref and ggml-cpu/quants.c generic vec_dot, gcc -O2 -ffp-contract=off\",\n");
    printf(" \"quantize\": [\n");
    int first = 1;
    for (size_t t = 0; t < sizeof(QTS) / sizeof(QTS[0]); t++) {
        if (QTS[t].blen == 32 && strcmp(QTS[t].name, "q8_1")) continue;  // gguf's numpy covers these
        for (int variant = 0; variant < 2; variant++) {
            fill(x, N, 0.05f, variant);
            QTS[t].q(x, qb, N);
            printf(first ? "  " : ",\n  "); first = 0;
            printf("{\"dtype\": \"%s\", \"n\": %d, \"input\": ", QTS[t].name, N); f32hex(x, N);
            printf(", \"bytes\": "); hex(qb, N / QTS[t].blen * QTS[t].bbytes); printf("}");
        }
    }
    printf("\n ],\n \"vec_dot\": [\n");
    struct { const char * w; const char * a; dot_fn f; } DOTS[] = {
        {"q4_0", "q8_0", ggml_vec_dot_q4_0_q8_0}, {"q4_1", "q8_1", ggml_vec_dot_q4_1_q8_1},
        {"q5_0", "q8_0", ggml_vec_dot_q5_0_q8_0}, {"q5_1", "q8_1", ggml_vec_dot_q5_1_q8_1},
        {"q8_0", "q8_0", ggml_vec_dot_q8_0_q8_0}, {"q2_K", "q8_K", ggml_vec_dot_q2_K_q8_K},
        {"q3_K", "q8_K", ggml_vec_dot_q3_K_q8_K}, {"q4_K", "q8_K", ggml_vec_dot_q4_K_q8_K},
        {"q5_K", "q8_K", ggml_vec_dot_q5_K_q8_K}, {"q6_K", "q8_K", ggml_vec_dot_q6_K_q8_K},
    };
    first = 1;
    for (size_t t = 0; t < sizeof(DOTS) / sizeof(DOTS[0]); t++) {
        const struct qt * wq = find(DOTS[t].w), * aq = find(DOTS[t].a);
        for (int rep = 0; rep < 2; rep++) {
            fill(x, N, 0.05f, rep == 1);
            fill(a, N, 1.0f, rep == 1 ? 2 : 0);
            wq->q(x, qb, N);
            aq->q(a, ab, N);
            float s = 0;
            DOTS[t].f(N, &s, 0, qb, 0, ab, 0, 1);
            printf(first ? "  " : ",\n  "); first = 0;
            printf("{\"dtype\": \"%s\", \"act_dtype\": \"%s\", \"n\": %d, \"w\": ", DOTS[t].w, DOTS[t].a, N);
            hex(qb, N / wq->blen * wq->bbytes);
            printf(", \"act\": "); hex(ab, N / aq->blen * aq->bbytes);
            printf(", \"result\": "); f32hex(&s, 1); printf("}");
        }
    }
    printf("\n ]\n}\n");
    return 0;
}
