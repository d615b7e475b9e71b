// out[m, row0 + n] = sum_k w[n, k] x[m, k] (the metal backend's matmul_q/matmul_f, one warp per
// row, two rows per 64-thread block). Grouped weights: i8 codes, (scale, offset) per group,
// a group contributing scale * sum(code x) + offset * S (S: the activations' own group sum,
// ggml's `s` for Q8_1). Dense weights: f32.

struct MatMeta {
    u32 k, rows, cols, group, out_rows, row0;
};

extern "C" __global__ void matmul_q(MatMeta p, const int* codes, const float2* scales,
                                    const float4* x, const float* sums, float* out) {
    u32 n = block_index() * 2 + threadIdx.x / 32;
    u32 lane = threadIdx.x % 32;
    if (n >= p.rows) return;
    u32 kw = p.k / 4, gpr = p.k / p.group;
    for (u32 m0 = 0; m0 < p.cols; m0 += 4) {
        float acc[4] = {0, 0, 0, 0};
        for (u32 w = lane; w < kw; w += 32) {
            int word = codes[(size_t)n * kw + w];
            float2 s = scales[(size_t)n * gpr + (w * 4) / p.group];
            float q0 = (float)(signed char)(word & 0xff), q1 = (float)(signed char)((word >> 8) & 0xff);
            float q2 = (float)(signed char)((word >> 16) & 0xff), q3 = (float)(signed char)(word >> 24);
            u32 g = (w * 4) / p.group;
            bool first = (w * 4) % p.group == 0 && s.y != 0.0f;
            for (u32 c = 0; c < 4; c++) {
                if (m0 + c < p.cols) {
                    float4 xv = x[(size_t)(m0 + c) * kw + w];
                    acc[c] += s.x * (q0 * xv.x + q1 * xv.y + q2 * xv.z + q3 * xv.w);
                    if (first) acc[c] += s.y * sums[(size_t)(m0 + c) * gpr + g];
                }
            }
        }
        for (u32 c = 0; c < 4; c++) {
            float t = warp_sum(acc[c]);
            if (lane == 0 && m0 + c < p.cols) out[(size_t)(m0 + c) * p.out_rows + p.row0 + n] = t;
        }
    }
}

extern "C" __global__ void matmul_f(MatMeta p, const float* w, const float* x, float* out) {
    u32 n = block_index() * 2 + threadIdx.x / 32;
    u32 lane = threadIdx.x % 32;
    if (n >= p.rows) return;
    for (u32 m0 = 0; m0 < p.cols; m0 += 4) {
        float acc[4] = {0, 0, 0, 0};
        for (u32 k = lane; k < p.k; k += 32) {
            float wv = w[(size_t)n * p.k + k];
            for (u32 c = 0; c < 4; c++)
                if (m0 + c < p.cols) acc[c] += wv * x[(size_t)(m0 + c) * p.k + k];
        }
        for (u32 c = 0; c < 4; c++) {
            float t = warp_sum(acc[c]);
            if (lane == 0 && m0 + c < p.cols) out[(size_t)(m0 + c) * p.out_rows + p.row0 + n] = t;
        }
    }
}
