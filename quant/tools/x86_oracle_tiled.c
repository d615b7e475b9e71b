// Oracle for llama.cpp's tiled K-quant matmul (ggml-cpu/tiled/, dev tool; not built by cargo
// or CI). Links this machine's llama.cpp build and runs REAL ggml graphs: one GGML_OP_MUL_MAT
// of a K-quant weight [k, rows] (plain CPU context, so tensor->extra == NULL: never the repack
// buffer) with f32 activations [k, cols]. ggml_compute_forward_mul_mat hands the whole op to
// ggml_compute_forward_mul_mat_tiled when src1->ne[1] >= 8 (ggml_tiled_min_batch); with fewer
// columns it falls through to the stock vec_dot path (recorded as a control). Every case runs
// with 1, 2 and 3 threads (different chunking: 256-row windows vs the narrow num_k path) and
// the oracle aborts unless all three results are bit-identical. Prints a JSON fixture.
// Built and run by scripts/quant_x86_fixtures_tiled.py.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

typedef void (*quant_fn)(const float *, void *, int64_t);
void quantize_row_q2_K_ref(const float *, void *, int64_t);
void quantize_row_q3_K_ref(const float *, void *, int64_t);
void quantize_row_q4_K_ref(const float *, void *, int64_t);
void quantize_row_q5_K_ref(const float *, void *, int64_t);
void quantize_row_q6_K_ref(const float *, void *, int64_t);

#define QK_K 256

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static double uni(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
}
static float gauss(void) { return (float) (sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni())); }

struct fmt { const char * name; enum ggml_type type; size_t bytes; quant_fn quant; };
static const struct fmt FMTS[] = {
    {"q6_K", GGML_TYPE_Q6_K, 210, quantize_row_q6_K_ref},
    {"q4_K", GGML_TYPE_Q4_K, 144, quantize_row_q4_K_ref},
    {"q5_K", GGML_TYPE_Q5_K, 176, quantize_row_q5_K_ref},
    {"q2_K", GGML_TYPE_Q2_K, 84, quantize_row_q2_K_ref},
    {"q3_K", GGML_TYPE_Q3_K, 110, quantize_row_q3_K_ref},
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

// Activation sets shared by all formats. Values are f16-representable (the fixture stores them
// as f16 to stay small); column c has an outlier, even columns of `tie` sets hold +M and -M.
struct acts { int k, cols, tie; float * x; uint16_t * h; };
static struct acts ACTS[] = {
    {256, 8, 0}, {512, 9, 1}, {256, 17, 0}, {256, 33, 1}, {4864, 8, 0}, {512, 5, 0},
};
#define NACTS (int) (sizeof ACTS / sizeof ACTS[0])

static void make_acts(struct acts * a) {
    const int k = a->k;
    a->x = malloc(sizeof(float) * k * a->cols);
    a->h = malloc(sizeof(uint16_t) * k * a->cols);
    for (int c = 0; c < a->cols; c++) {
        float * xc = a->x + (size_t) c * k;
        for (int i = 0; i < k; i++) xc[i] = gauss() * (0.5f + c * 0.25f);
        xc[(c * 101 + 5) % k] = 30.0f;   // outlier
        if (a->tie && (c % 2 == 0)) { xc[(c * 101 + 5) % k] = 1.0f; xc[3] = -30.0f; xc[200] = 30.0f; }
        for (int i = 0; i < k; i++) {
            a->h[(size_t) c * k + i] = ggml_fp32_to_fp16(xc[i]);
            xc[i] = ggml_fp16_to_fp32(a->h[(size_t) c * k + i]);
        }
    }
}

// One MUL_MAT graph; out is [cols][rows] (dst row index fastest).
static void mul_mat(const struct fmt * f, const uint8_t * w, int k, int rows, const float * x, int cols, int nth, float * out) {
    const size_t rb = (size_t) (k / QK_K) * f->bytes;
    struct ggml_init_params ip = { (size_t) 256 << 20, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * a = ggml_new_tensor_2d(ctx, f->type, k, rows);
    struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, cols);
    memcpy(a->data, w, rb * rows);
    memcpy(b->data, x, sizeof(float) * (size_t) k * cols);
    struct ggml_tensor * d = ggml_mul_mat(ctx, a, b);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, d);
    if (ggml_graph_compute_with_ctx(ctx, gf, nth) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
    if (d->ne[0] != rows || d->ne[1] != cols || d->nb[1] != sizeof(float) * rows) { fprintf(stderr, "bad dst\n"); exit(1); }
    memcpy(out, d->data, sizeof(float) * (size_t) rows * cols);
    ggml_free(ctx);
}

static int first = 1;
static void run_case(const struct fmt * f, int ai, int rows) {
    const int k = ACTS[ai].k, cols = ACTS[ai].cols;
    const size_t rb = (size_t) (k / QK_K) * f->bytes;
    uint8_t * w = malloc(rb * rows);
    float * wf = malloc(sizeof(float) * k);
    for (int r = 0; r < rows; r++) {
        float s = 0.02f * (1.0f + 0.5f * (float) uni());
        for (int i = 0; i < k; i++) wf[i] = gauss() * s;
        wf[(r * 37) % k] = 0.4f;  // outlier
        if (r % 5 == 3) for (int i = 0; i < k; i++) wf[i] += 0.03f;  // shifted rows (mins matter)
        f->quant(wf, w + r * rb, k);
    }
    float * out = calloc((size_t) rows * cols, sizeof(float));
    float * other = calloc((size_t) rows * cols, sizeof(float));
    mul_mat(f, w, k, rows, ACTS[ai].x, cols, 1, out);
    for (int nth = 2; nth <= 3; nth++) {
        mul_mat(f, w, k, rows, ACTS[ai].x, cols, nth, other);
        if (memcmp(out, other, sizeof(float) * (size_t) rows * cols) != 0) {
            fprintf(stderr, "%s k=%d rows=%d cols=%d: %d threads differ from 1\n", f->name, k, rows, cols, nth);
            exit(1);
        }
    }
    printf("%s\n  {\"dtype\": \"%s\", \"acts\": %d, \"k\": %d, \"rows\": %d, \"cols\": %d, \"kernel\": \"%s\", \"w\": ",
           first ? "" : ",", f->name, ai, k, rows, cols, cols >= 8 ? "tiled" : "vec_dot");
    first = 0;
    b64(w, rb * rows);
    printf(", \"out\": ");
    b64(out, sizeof(float) * rows * cols);
    printf("}");
    free(w); free(wf); free(out); free(other);
}

int main(void) {
    if (getenv("GGML_CPU_TILED_MM") || getenv("GGML_CPU_TILED_MM_FORCE")) { fprintf(stderr, "unset GGML_CPU_TILED_MM*\n"); return 1; }
    ggml_cpu_init();
    for (int i = 0; i < NACTS; i++) make_acts(&ACTS[i]);
    printf("{\"note\": \"generated by scripts/quant_x86_fixtures_tiled.py from quant/tools/x86_oracle_tiled.c; base64, little-endian; acts x are f16\",\n \"acts\": [");
    for (int i = 0; i < NACTS; i++) {
        printf("%s\n  {\"k\": %d, \"cols\": %d, \"x\": ", i ? "," : "", ACTS[i].k, ACTS[i].cols);
        b64(ACTS[i].h, sizeof(uint16_t) * ACTS[i].k * ACTS[i].cols);
        printf("}");
    }
    printf("],\n \"cases\": [");
    for (size_t i = 0; i < sizeof FMTS / sizeof FMTS[0]; i++) {
        const struct fmt * f = &FMTS[i];
        const int big = f->type == GGML_TYPE_Q6_K || f->type == GGML_TYPE_Q4_K;
        run_case(f, 0, 8);              // 8 columns: the smallest tiled batch
        run_case(f, 1, 13);             // ragged 16-row microtile, 9 columns
        run_case(f, 2, big ? 64 : 13);  // 17 columns
        run_case(f, 3, 13);             // 33 columns: three 16-column bands
        if (f->type == GGML_TYPE_Q6_K) run_case(f, 4, 8);  // K = 4864 (Qwen2.5-0.5B ffn_down)
        run_case(f, 5, 13);             // 5 columns: vec_dot control
    }
    printf("\n]}\n");
    return 0;
}
