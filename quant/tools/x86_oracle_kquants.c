// Oracle for the x86-exact K-quant matmul kernels (dev tool; not built by cargo or CI).
// Links against this machine's llama.cpp build and calls the REAL compiled kernels:
//   ggml_vec_dot_q{2,3,4,5,6}_K_q8_K       (ggml-cpu/arch/x86/quants.c, AVX2 branch)
//   ggml_gemv_q{2,4}_K_8x8_q8_K / ggml_gemm_q{2,4}_K_8x8_q8_K   (ggml-cpu/arch/x86/repack.cpp)
//   ggml::cpu::repack::repack<block_q{2,4}_K, 8, 8>              (ggml-cpu/repack.cpp)
//   quantize_row_q8_K, ggml_quantize_mat_q8_K_4x8
// and replays forward_mul_mat_one_chunk (repack.cpp) for the repacked formats: columns in
// groups of four through gemm (activations from ggml_quantize_mat_q8_K_4x8), the rest one by
// one through gemv (activations from quantize_row_q8_K). Other cases replay
// ggml_compute_forward_mul_mat's vec_dot path. Prints a JSON fixture on stdout.
// Built and run by scripts/quant_x86_fixtures_kquants.py.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

typedef void (*vec_dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef void (*gemx_fn)(int, float *, size_t, const void *, const void *, int, int);
typedef void (*quant_fn)(const float *, void *, int64_t);
typedef int (*repack_fn)(struct ggml_tensor *, const void *, size_t);

void ggml_vec_dot_q2_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q3_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q4_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q5_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_vec_dot_q6_K_q8_K(int, float *, size_t, const void *, size_t, const void *, size_t, int);
void ggml_gemv_q4_K_8x8_q8_K(int, float *, size_t, const void *, const void *, int, int);
void ggml_gemm_q4_K_8x8_q8_K(int, float *, size_t, const void *, const void *, int, int);
void ggml_gemv_q2_K_8x8_q8_K(int, float *, size_t, const void *, const void *, int, int);
void ggml_gemm_q2_K_8x8_q8_K(int, float *, size_t, const void *, const void *, int, int);
void quantize_row_q8_K(const float *, void *, int64_t);
void ggml_quantize_mat_q8_K_4x8(const float *, void *, int64_t);
void quantize_row_q2_K_ref(const float *, void *, int64_t);
void quantize_row_q3_K_ref(const float *, void *, int64_t);
void quantize_row_q4_K_ref(const float *, void *, int64_t);
void quantize_row_q5_K_ref(const float *, void *, int64_t);
void quantize_row_q6_K_ref(const float *, void *, int64_t);
int _ZN4ggml3cpu6repack6repackI10block_q4_KLl8ELl8EEEiP11ggml_tensorPKvm(struct ggml_tensor *, const void *, size_t);
int _ZN4ggml3cpu6repack6repackI10block_q2_KLl8ELl8EEEiP11ggml_tensorPKvm(struct ggml_tensor *, const void *, size_t);

#define QK_K 256
#define Q8K_BYTES 292

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uni(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
}
static float gauss(void) { return (float) (sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni())); }

struct fmt {
    const char * name; enum ggml_type type; size_t bytes; quant_fn quant; vec_dot_fn dot;
    repack_fn repack; gemx_fn gemv, gemm;
};
static const struct fmt FMTS[] = {
    {"q2_K", GGML_TYPE_Q2_K, 84, quantize_row_q2_K_ref, ggml_vec_dot_q2_K_q8_K,
     _ZN4ggml3cpu6repack6repackI10block_q2_KLl8ELl8EEEiP11ggml_tensorPKvm, ggml_gemv_q2_K_8x8_q8_K, ggml_gemm_q2_K_8x8_q8_K},
    {"q3_K", GGML_TYPE_Q3_K, 110, quantize_row_q3_K_ref, ggml_vec_dot_q3_K_q8_K, NULL, NULL, NULL},
    {"q4_K", GGML_TYPE_Q4_K, 144, quantize_row_q4_K_ref, ggml_vec_dot_q4_K_q8_K,
     _ZN4ggml3cpu6repack6repackI10block_q4_KLl8ELl8EEEiP11ggml_tensorPKvm, ggml_gemv_q4_K_8x8_q8_K, ggml_gemm_q4_K_8x8_q8_K},
    {"q5_K", GGML_TYPE_Q5_K, 176, quantize_row_q5_K_ref, ggml_vec_dot_q5_K_q8_K, NULL, NULL, NULL},
    {"q6_K", GGML_TYPE_Q6_K, 210, quantize_row_q6_K_ref, ggml_vec_dot_q6_K_q8_K, NULL, NULL, NULL},
};

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static void b64(const void * p, size_t n) {
    const uint8_t * b = p;
    putchar('"');
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t) b[i] << 16 | (i + 1 < n ? (uint32_t) b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        putchar(B64[v >> 18 & 63]); putchar(B64[v >> 12 & 63]);
        putchar(i + 1 < n ? B64[v >> 6 & 63] : '='); putchar(i + 2 < n ? B64[v & 63] : '=');
    }
    putchar('"');
}

// Activation sets shared by all formats: k, columns, whether even columns hold +M and -M.
struct acts { int k, cols, tie; float * x; };
static struct acts ACTS[] = {{256, 1, 0}, {512, 5, 1}, {256, 9, 0}, {256, 17, 1}, {256, 3, 0}, {4096, 1, 0}};
#define NACTS (int) (sizeof ACTS / sizeof ACTS[0])

static void make_acts(struct acts * a) {
    const int k = a->k;
    a->x = malloc(sizeof(float) * k * a->cols);
    for (int c = 0; c < a->cols; c++) {
        float * xc = a->x + (size_t) c * k;
        for (int i = 0; i < k; i++) xc[i] = gauss() * (0.5f + c * 0.25f);
        xc[(c * 101 + 5) % k] = 30.0f;   // outlier
        if (a->tie && (c % 2 == 0)) {    // +M and -M in one super block: the sign rule of the max
            xc[(c * 101 + 5) % k] = 1.0f; xc[3] = -30.0f; xc[200] = 30.0f; xc[5] = 30.0f;
        }
    }
}

static int first = 1;
static void run_case(const struct fmt * f, int ai, int rows) {
    const int k = ACTS[ai].k, cols = ACTS[ai].cols;
    const float * x = ACTS[ai].x;
    const int nb = k / QK_K;
    const size_t rb = nb * f->bytes;
    uint8_t * w = malloc(rb * rows);
    float * wf = malloc(sizeof(float) * k);
    for (int r = 0; r < rows; r++) {
        float s = 0.02f * (1.0f + 0.5f * (float) uni());
        for (int i = 0; i < k; i++) wf[i] = gauss() * s;
        wf[(r * 37) % k] = 0.4f;  // outlier
        f->quant(wf, w + r * rb, k);
    }
    float * out = calloc((size_t) rows * cols, sizeof(float));
    uint8_t * act = malloc((size_t) Q8K_BYTES * nb * cols);
    const size_t ab = (size_t) Q8K_BYTES * nb;
    const int repacked = f->repack && rows % 8 == 0;
    if (repacked) {
        uint8_t * packed = malloc(rb * rows);
        struct ggml_tensor t;
        memset(&t, 0, sizeof t);
        t.type = f->type; t.ne[0] = k; t.ne[1] = rows; t.ne[2] = 1; t.ne[3] = 1;
        t.nb[0] = f->bytes; t.nb[1] = rb; t.nb[2] = rb * rows; t.nb[3] = rb * rows;
        t.data = packed;
        if (f->repack(&t, w, rb * rows) != 0) { fprintf(stderr, "repack failed\n"); exit(1); }
        // forward_mul_mat: groups of 4 columns via quantize_mat (block_q8_Kx4 layout), rest via from_float
        const int c4 = cols - cols % 4;
        for (int c = 0; c < c4; c += 4) ggml_quantize_mat_q8_K_4x8(x + (size_t) c * k, act + ab * c, k);
        for (int c = c4; c < cols; c++) quantize_row_q8_K(x + (size_t) c * k, act + ab * c, k);
        // forward_mul_mat_one_chunk: dst is [cols][rows], bs = row stride in floats
        if (cols > 3) f->gemm(k, out, rows, packed, act, c4, rows);
        for (int c = c4; c < cols; c++) f->gemv(k, out + (size_t) c * rows, rows, packed, act + ab * c, 1, rows);
        free(packed);
    } else {
        for (int c = 0; c < cols; c++) {
            quantize_row_q8_K(x + (size_t) c * k, act + ab * c, k);
            for (int r = 0; r < rows; r++) f->dot(k, out + (size_t) c * rows + r, 0, w + r * rb, 0, act + ab * c, 0, 1);
        }
    }
    printf("%s\n  {\"dtype\": \"%s\", \"acts\": %d, \"k\": %d, \"rows\": %d, \"cols\": %d, \"kernel\": \"%s\", \"w\": ",
           first ? "" : ",", f->name, ai, k, rows, cols, repacked ? "repack" : "vec_dot");
    first = 0;
    b64(w, rb * rows);
    printf(", \"out\": ");
    b64(out, sizeof(float) * rows * cols);
    printf("}");
    free(w); free(wf); free(out); free(act);
}

int main(void) {
    ggml_cpu_init();
    for (int i = 0; i < NACTS; i++) make_acts(&ACTS[i]);
    printf("{\"note\": \"generated by scripts/quant_x86_fixtures_kquants.py from quant/tools/x86_oracle_kquants.c; base64, little-endian\",\n \"acts\": [");
    for (int i = 0; i < NACTS; i++) {
        printf("%s\n  {\"k\": %d, \"cols\": %d, \"x\": ", i ? "," : "", ACTS[i].k, ACTS[i].cols);
        b64(ACTS[i].x, sizeof(float) * ACTS[i].k * ACTS[i].cols);
        printf("}");
    }
    printf("],\n \"cases\": [");
    for (size_t i = 0; i < sizeof FMTS / sizeof FMTS[0]; i++) {
        const struct fmt * f = &FMTS[i];
        run_case(f, 0, 8);
        run_case(f, 1, 16);
        run_case(f, 2, 16);
        run_case(f, 3, 24);   // 17 columns: gemm's 16-column AVX-512 block + 16 rows AVX-512 + 8 rows AVX2
        run_case(f, 4, 12);   // rows % 8 != 0: never repacked
        if (f->type == GGML_TYPE_Q4_K) run_case(f, 5, 8);
        if (f->type == GGML_TYPE_Q6_K) run_case(f, 5, 4);
    }
    printf("\n]}\n");
    return 0;
}
