// x86 oracle for the legacy 32-element formats (Q4_0, Q5_0, Q5_1, Q8_0): calls the REAL
// kernels of this machine's llama.cpp build (libggml-cpu.so, -O3 -march=native, AVX-512 +
// VNNI, GGML_USE_LLAMAFILE, GGML_USE_CPU_REPACK) and prints JSON on stdout:
//   * ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0 / ggml_vec_dot_q5_1_q8_1 (arch/x86/quants.c),
//   * llamafile_sgemm (tinyBLAS_Q0_AVX, llamafile/sgemm.cpp) for several (m, n, k),
//   * the Q4_0 8x8 repack kernels ggml_gemv_q4_0_8x8_q8_0 / ggml_gemm_q4_0_8x8_q8_0
//     (arch/x86/repack.cpp) with weights interleaved as repack.cpp's make_block_q4_0x8 does.
// A dev tool, never built by cargo: scripts/quant_x86_fixtures_legacy.py builds and runs it.
//   gcc -O2 -I$G/include -I$G/src -I$G/src/ggml-cpu x86_oracle_legacy.c \
//       -L$B/bin -lggml-cpu -lggml-base -Wl,-rpath,$B/bin
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

struct ggml_compute_params { // ggml-cpu-impl.h
    int ith, nth;
    size_t wsize;
    void * wdata;
    void * threadpool;
    bool use_ref;
};
bool llamafile_sgemm(const struct ggml_compute_params *, int64_t, int64_t, int64_t, const void *, int64_t,
                     const void *, int64_t, void *, int64_t, int, int, int);
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_1_q8_1(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q8_0_q8_0(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_gemv_q4_0_8x8_q8_0(int, float *, size_t, const void *, const void *, int, int);
void ggml_gemm_q4_0_8x8_q8_0(int, float *, size_t, const void *, const void *, int, int);
void ggml_quantize_mat_q8_0_4x8(const float *, void *, int64_t);

// ---- deterministic generator (xorshift64*, Box-Muller), as quant/tests/common
static uint64_t rs;
static uint64_t next_u64(void) { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545F4914F6CDD1DULL; }
static float uni(void) { return ((float) (next_u64() >> 40) + 0.5f) / (float) (1u << 24); }
static float normal(void) { float u = uni(), v = uni(); return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v); }

// Realistic rows: normal * scale, one outlier block (x40) and one outlier element.
static void gen_row(float * x, int n, float scale) {
    for (int i = 0; i < n; i++) x[i] = normal() * scale;
    int nb = n / 32, ob = (int) (next_u64() % nb);
    for (int i = 0; i < 32; i++) x[ob * 32 + i] *= 40.0f;
    x[next_u64() % n] *= 25.0f;
}

static void hex(const void * p, size_t n) {
    const uint8_t * b = p;
    putchar('"');
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    putchar('"');
}
static void bits(const float * v, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) { uint32_t u; memcpy(&u, &v[i], 4); printf("%s%u", i ? "," : "", u); }
    putchar(']');
}

static enum ggml_type act_type(enum ggml_type t) { return t == GGML_TYPE_Q5_1 ? GGML_TYPE_Q8_1 : GGML_TYPE_Q8_0; }

// Quantized weight rows (ggml_quantize_chunk = the ref quantizers) and activation rows (the
// CPU from_float, i.e. x86 quantize_row_q8_0 / q8_1, as ggml_compute_forward_mul_mat does).
static void make(enum ggml_type t, int rows, int cols, int k, uint8_t ** w, uint8_t ** a) {
    float * f = malloc(sizeof(float) * (size_t) k * (rows > cols ? rows : cols));
    for (int r = 0; r < rows; r++) gen_row(f + (size_t) r * k, k, 0.02f);
    *w = malloc(ggml_row_size(t, k) * rows);
    ggml_quantize_chunk(t, f, *w, 0, rows, k, NULL);
    enum ggml_type at = act_type(t);
    *a = malloc(ggml_row_size(at, k) * cols);
    for (int c = 0; c < cols; c++) {
        gen_row(f, k, 1.0f);
        ggml_get_type_traits_cpu(at)->from_float(f, *a + ggml_row_size(at, k) * c, k);
    }
    free(f);
}

int main(void) {
    ggml_cpu_init();
    rs = 0x9E3779B97F4A7C15ULL * 20240531ULL | 1;
    const enum ggml_type types[4] = { GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0 };
    const dot_fn dots[4] = { ggml_vec_dot_q4_0_q8_0, ggml_vec_dot_q5_0_q8_0, ggml_vec_dot_q5_1_q8_1, ggml_vec_dot_q8_0_q8_0 };
    const int ns[] = { 32, 64, 96, 160, 224, 544, 1056, 4096 };
    printf("{\"vec_dot\":[");
    int first = 1;
    for (int ti = 0; ti < 4; ti++) {
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            int n = ns[ni];
            uint8_t *w, *a;
            make(types[ti], 1, 1, n, &w, &a);
            float s = 0;
            dots[ti](n, &s, 0, w, 0, a, 0, 1);
            printf("%s\n{\"type\":\"%s\",\"n\":%d,\"w\":", first ? "" : ",", ggml_type_name(types[ti]), n);
            hex(w, ggml_row_size(types[ti], n));
            printf(",\"act\":");
            hex(a, ggml_row_size(act_type(types[ti]), n));
            printf(",\"out\":");
            bits(&s, 1);
            printf("}");
            first = 0;
            free(w); free(a);
        }
    }
    // tinyBLAS: C[j*m + i] = row i of A . column j of B; shapes hit the 4xN, Mx4 and generic
    // gemm<RM,RN> tiles of tinyBLAS_Q0_AVX::mnpack and their remainders.
    const int shapes[][3] = { { 4, 4, 64 }, { 11, 7, 96 }, { 5, 2, 32 }, { 3, 3, 160 }, { 9, 6, 64 }, { 2, 13, 32 }, { 1, 2, 96 } };
    printf("],\"tinyblas\":[");
    first = 1;
    for (int ti = 0; ti < 4; ti++) {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int m = shapes[si][0], nn = shapes[si][1], k = shapes[si][2];
            uint8_t *w, *a;
            make(types[ti], m, nn, k, &w, &a);
            float * c = calloc((size_t) m * nn, sizeof(float));
            struct ggml_compute_params p = { 0, 1, 0, NULL, NULL, false };
            bool ok = llamafile_sgemm(&p, m, nn, k / 32, w, k / 32, a, k / 32, c, m, types[ti], act_type(types[ti]), GGML_TYPE_F32);
            printf("%s\n{\"type\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"taken\":%s", first ? "" : ",", ggml_type_name(types[ti]), m, nn, k, ok ? "true" : "false");
            first = 0;
            if (ok) {
                printf(",\"w\":"); hex(w, ggml_row_size(types[ti], k) * m);
                printf(",\"act\":"); hex(a, ggml_row_size(act_type(types[ti]), k) * nn);
                printf(",\"out\":"); bits(c, m * nn);
            }
            printf("}");
            free(w); free(a); free(c);
        }
    }
    // Q4_0 repack (8 rows interleaved, block_q4_0x8 = { d[8]; qs[128] }).
    // gemv: one activation column; gemm: 4 columns, activations from ggml_quantize_mat_q8_0_4x8.
    const int rshapes[][3] = { { 8, 4, 64 }, { 24, 8, 96 }, { 16, 4, 32 }, { 40, 4, 160 } }; // rows, cols, k
    printf("],\"repack_q4_0\":[");
    first = 1;
    for (size_t si = 0; si < sizeof rshapes / sizeof rshapes[0]; si++) {
        int rows = rshapes[si][0], cols = rshapes[si][1], k = rshapes[si][2], nb = k / 32;
        float * wf = malloc(sizeof(float) * rows * k);
        float * af = malloc(sizeof(float) * cols * k);
        for (int r = 0; r < rows; r++) gen_row(wf + r * k, k, 0.02f);
        for (int c = 0; c < cols; c++) gen_row(af + c * k, k, 1.0f);
        uint8_t * w = malloc(18 * rows * nb);
        ggml_quantize_chunk(GGML_TYPE_Q4_0, wf, w, 0, rows, k, NULL);
        uint8_t * wr = malloc(144 * rows / 8 * nb);
        for (int g = 0; g < rows / 8; g++)
            for (int x = 0; x < nb; x++) {
                uint8_t * o = wr + 144 * (g * nb + x);
                for (int i = 0; i < 8; i++) memcpy(o + 2 * i, w + 18 * ((g * 8 + i) * nb + x), 2);
                for (int i = 0; i < 16; i++) {
                    const uint8_t * src = w + 18 * ((g * 8 + i % 8) * nb + x) + 2 + (i / 8) * 8;
                    for (int b = 0; b < 8; b++) o[16 + i * 8 + b] = src[b] ^ 0x88;
                }
            }
        // per-row activations (from_float) for gemv and to compare with the 4x8 layout
        uint8_t * a = malloc(34 * nb * cols);
        for (int c = 0; c < cols; c++) ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float(af + c * k, a + 34 * nb * c, k);
        uint8_t * a4 = malloc(34 * nb * cols);
        for (int c = 0; c < cols; c += 4) ggml_quantize_mat_q8_0_4x8(af + c * k, a4 + 34 * nb * c, k);
        // de-interleave block_q8_0x4 { d[4]; qs[128] } (8-byte chunks, row = chunk % 4)
        int same = 1;
        for (int c = 0; c < cols; c += 4)
            for (int x = 0; x < nb; x++) {
                const uint8_t * in = a4 + 34 * nb * c + 136 * x;
                for (int r = 0; r < 4; r++) {
                    const uint8_t * ref = a + 34 * (nb * (c + r) + x);
                    if (memcmp(in + 2 * r, ref, 2)) same = 0;
                    for (int ch = 0; ch < 4; ch++)
                        if (memcmp(in + 8 + (ch * 4 + r) * 8, ref + 2 + ch * 8, 8)) same = 0;
                }
            }
        float * gv = calloc(rows * cols, sizeof(float));
        float * gm = calloc(rows * cols, sizeof(float));
        for (int c = 0; c < cols; c++) ggml_gemv_q4_0_8x8_q8_0(k, gv + c * rows, rows, wr, a + 34 * nb * c, 1, rows);
        ggml_gemm_q4_0_8x8_q8_0(k, gm, rows, wr, a4, cols, rows);
        printf("%s\n{\"rows\":%d,\"cols\":%d,\"k\":%d,\"mat_q8_0_4x8_equals_rows\":%s,\"w\":", first ? "" : ",", rows, cols, k, same ? "true" : "false");
        first = 0;
        hex(w, 18 * rows * nb);
        printf(",\"act\":"); hex(a, 34 * nb * cols);
        printf(",\"gemv\":"); bits(gv, rows * cols);
        printf(",\"gemm\":"); bits(gm, rows * cols);
        printf("}");
        free(wf); free(af); free(w); free(wr); free(a); free(a4); free(gv); free(gm);
    }
    printf("]}\n");
    return 0;
}
