// Row-wise kernels, one 64-thread block per row: get_rows (grouped or f32 tables), rms_norm,
// softmax, argmax.

struct RowsMeta {
    u32 k, rows, group, table_rows, row0;  // table_rows, row0: this chunk of the table
};

extern "C" __global__ void get_rows_q(RowsMeta p, const int* codes, const float2* scales,
                                      const int* ids, float* out) {
    u32 m = block_index();
    if (m >= p.rows) return;
    u32 id = (u32)ids[m];
    if (id < p.row0 || id >= p.row0 + p.table_rows) return;  // another chunk's row
    u32 r = id - p.row0, kw = p.k / 4, gpr = p.k / p.group;
    for (u32 w = threadIdx.x; w < kw; w += 64) {
        int word = codes[(size_t)r * kw + w];
        float2 s = scales[(size_t)r * gpr + (w * 4) / p.group];
        // No offset: `code * scale` alone, as the reference decodes it (+ 0 would lose -0).
        for (u32 j = 0; j < 4; j++) {
            float v = (float)(signed char)((word >> (8 * j)) & 0xff) * s.x;
            out[(size_t)m * p.k + w * 4 + j] = s.y == 0.0f ? v : v + s.y;
        }
    }
}

extern "C" __global__ void get_rows_f(RowsMeta p, const float* w, const int* ids, float* out) {
    u32 m = block_index();
    if (m >= p.rows) return;
    u32 id = (u32)ids[m];
    if (id < p.row0 || id >= p.row0 + p.table_rows) return;  // another chunk's row
    u32 r = id - p.row0;
    for (u32 k = threadIdx.x; k < p.k; k += 64) out[(size_t)m * p.k + k] = w[(size_t)r * p.k + k];
}

struct NormMeta {
    u32 k, rows;
    float eps;
};

extern "C" __global__ void rms_norm(NormMeta p, const float* x, const float* w, float* out) {
    u32 r = block_index();
    if (r >= p.rows) return;
    const float* row = x + (size_t)r * p.k;
    // The reference's sum: term by term in element order, in double (ggml's `ggml_float`).
    __shared__ float scale_s;
    if (threadIdx.x == 0) {
        double s = 0;
        for (u32 k = 0; k < p.k; k++) s += (double)(row[k] * row[k]);
        scale_s = 1.0f / sqrtf((float)(s / (double)p.k) + p.eps);
    }
    __syncthreads();
    float scale = scale_s;
    for (u32 k = threadIdx.x; k < p.k; k += 64) out[(size_t)r * p.k + k] = (row[k] * scale) * w[k];
}

// The reference's steps (metal's softmax.wgsl says which); its f64 sum is a double here.
extern "C" __global__ void softmax(NormMeta p, const float* x, float* out) {
    __shared__ float shared_max, shared_inv;
    u32 r = block_index();
    if (r >= p.rows) return;
    const float* row = x + (size_t)r * p.k;
    float* o = out + (size_t)r * p.k;
    float scale = p.eps;  // the meta's float is softmax's scale
    if (threadIdx.x == 0) {
        float m = __uint_as_float(0xff800000u);
        for (u32 k = 0; k < p.k; k++) {
            float v = row[k] * scale;
            m = m > v ? m : v;
        }
        shared_max = m;
    }
    __syncthreads();
    float mx = shared_max;
    u32 full = p.k & ~15u;
    for (u32 k = threadIdx.x; k < p.k; k += 64) {
        float v = row[k] * scale - mx;
        o[k] = k < full ? v_expf(v) : expf(v);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (u32 b = 0; b < full; b += 16) s += (double)reduce16(o + b);
        for (u32 k = full; k < p.k; k++) s += (double)o[k];
        shared_inv = (float)(1.0 / s);
    }
    __syncthreads();
    float inv = shared_inv;
    for (u32 k = threadIdx.x; k < p.k; k += 64) o[k] *= inv;
}

// NaN is never chosen (by its bits), the first index wins ties, a row of NaN gives 0.
__device__ __forceinline__ bool beats(float v, u32 i, float bv, u32 bi) {
    if (i == 0xffffffffu) return false;
    if (bi == 0xffffffffu) return true;
    return v > bv || (v == bv && i < bi);
}

extern "C" __global__ void argmax(NormMeta p, const float* x, int* out) {
    __shared__ float bv[64];
    __shared__ u32 bi[64];
    u32 r = block_index(), li = threadIdx.x;
    if (r >= p.rows) return;
    float v0 = 0;
    u32 i0 = 0xffffffffu;
    for (u32 k = li; k < p.k; k += 64) {
        float v = x[(size_t)r * p.k + k];
        bool nan = (__float_as_uint(v) & 0x7fffffffu) > 0x7f800000u;
        if (!nan && beats(v, k, v0, i0)) { v0 = v; i0 = k; }
    }
    bv[li] = v0;
    bi[li] = i0;
    __syncthreads();
    for (u32 h = 32; h > 0; h >>= 1) {
        if (li < h && beats(bv[li + h], bi[li + h], bv[li], bi[li])) {
            bv[li] = bv[li + h];
            bi[li] = bi[li + h];
        }
        __syncthreads();
    }
    if (li == 0) out[r] = bi[0] == 0xffffffffu ? 0 : (int)bi[0];
}
