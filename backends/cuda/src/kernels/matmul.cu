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

// The legacy block formats in the reference's float order (metal's matmul_x.wgsl): one
// thread per row of up to `tile` (at most 8) columns, the row's weight words read once for
// them all; per output, exact integer sums of four products, then ggml's x86 chain (`lanes`
// 8: eight accumulators and `hsum_float_8`, plus the `m * s` terms for Q4_1 / Q5_1; `lanes`
// 1: Q4_0's repack order).
struct XMeta {
    u32 k, rows, cols, out_rows, row0, lanes, has_m, tile;
};

extern "C" __global__ void matmul_x(XMeta p, const int* codes, const float2* scales,
                                    const int* xq, const float2* xs, float* out) {
    u32 per_col = (p.rows + 63) / 64, g = block_index();
    u32 m0 = g / per_col * p.tile, n = (g % per_col) * 64 + threadIdx.x;
    if (m0 >= p.cols || n >= p.rows) return;
    u32 tc = min(p.tile, p.cols - m0), nb = p.k / 32, kw = p.k / 4;
    float acc[8][8] = {}, summs[8] = {};
    for (u32 b = 0; b < nb; b++) {
        float2 ws = scales[(size_t)n * nb + b];
        const int* wq = codes + (size_t)n * kw + b * 8;
        int w[8];
        for (int l = 0; l < 8; l++) w[l] = wq[l];
        for (u32 c = 0; c < tc; c++) {
            u32 m = m0 + c;
            float2 as = xs[(size_t)m * nb + b];
            float d = ws.x * as.x;
            const int* aq = xq + (size_t)m * kw + b * 8;
            if (p.lanes == 8) {
                for (int l = 0; l < 8; l++)
                    acc[c][l] = fmaf(d, (float)__dp4a(w[l], aq[l], 0), acc[c][l]);
            } else {
                int s = 0;
                for (int l = 0; l < 8; l++) s = __dp4a(w[l], aq[l], s);
                acc[c][0] = fmaf((float)s, d, acc[c][0]);
            }
            if (p.has_m) summs[c] = fmaf(ws.y, as.y, summs[c]);
        }
    }
    for (u32 c = 0; c < tc; c++) {
        const float* a = acc[c];
        float r = p.lanes == 8
            ? ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))
            : a[0];
        if (p.has_m) r = r + summs[c];
        out[(size_t)(m0 + c) * p.out_rows + p.row0 + n] = r;
    }
}

// Q4_K and Q6_K in the reference's chains (metal's matmul_k.wgsl says which `modes` are
// which): codes four to a word, per super block the `ks` words (weights.rs `k_scales`), Q8_K
// activations as codes and `[d, bsums 0..16]` (`xk`, 17 words a super block).
struct KMeta {
    u32 k, rows, cols, out_rows, row0, tile;
};

__device__ __forceinline__ int kbyte(const u32* ks, u32 i, bool sign) {
    u32 w = ks[i / 4] >> (8 * (i % 4));
    return sign ? (int)(signed char)(w & 0xff) : (int)(w & 0xff);
}

struct KState {
    float acc[8], accm[4], a1, am;
};

// Super block `b` of row `n` times column `m` (whose chain is `mode`) into `st`.
__device__ void k_block(KState& st, const KMeta& p, const int* codes, const u32* ks,
                        const int* xq, const u32* xk, u32 mode, u32 n, u32 m, u32 b) {
    u32 nsb = p.k / 256, kw = p.k / 4;
    const u32* k0 = ks + ((size_t)n * nsb + b) * 8;
    float xd = __uint_as_float(k0[0]), xdmin = __uint_as_float(k0[1]);
    const u32* x0 = xk + ((size_t)m * nsb + b) * 17;
    float yd = __uint_as_float(x0[0]);
    const int* bs = (const int*)(x0 + 1);
    const int* wq = codes + (size_t)n * kw + b * 64;
    const int* aq = xq + (size_t)m * kw + b * 64;
    if (mode <= 3) {
        if (mode == 0) {
            float d = yd * xd, dmin = -yd * xdmin;
            for (int j = 0; j < 4; j++) {
                int prod = 0;
                for (int h = 0; h < 2; h++) {
                    int s = 2 * j + h;
                    int q8s = (int)(short)(bs[2 * s] + bs[2 * s + 1]);
                    prod += kbyte(k0 + 2, 8 + s, false) * q8s;
                }
                st.accm[j] = fmaf(dmin, (float)prod, st.accm[j]);
            }
            int sumi[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int s = 0; s < 8; s++) {
                int sc = kbyte(k0 + 2, s, false);
                for (int l = 0; l < 8; l++) sumi[l] += sc * __dp4a(wq[8 * s + l], aq[8 * s + l], 0);
            }
            for (int l = 0; l < 8; l++) st.acc[l] = fmaf(d, (float)sumi[l], st.acc[l]);
        } else {
            int isum[8], imin[8];
            for (int s = 0; s < 8; s++) {
                int raw = 0;
                for (int l = 0; l < 8; l++) raw = __dp4a(wq[8 * s + l], aq[8 * s + l], raw);
                isum[s] = kbyte(k0 + 2, s, false) * raw;
                imin[s] = kbyte(k0 + 2, 8 + s, false) * (bs[2 * s] + bs[2 * s + 1]);
            }
            if (mode == 3) {
                unsigned s1 = 0, s2 = 0;  // wrapping, as ggml's vpaddd
                for (int s = 0; s < 8; s++) { s1 += (unsigned)isum[s]; s2 += (unsigned)imin[s]; }
                float res = fmaf(-xdmin, (float)(int)s2, (float)(int)s1 * xd);
                st.a1 = fmaf(res, yd, st.a1);
            } else {
                float dw = xd * yd, dm = xdmin * yd;
                if (mode == 1) {
                    int s1 = 0, s2 = 0;
                    for (int s = 0; s < 8; s++) { s1 += isum[s]; s2 += imin[s]; }
                    st.a1 = fmaf((float)s1, dw, st.a1);
                    st.am = fmaf((float)s2, dm, st.am);
                } else {
                    for (int sb = 0; sb < 4; sb++) {
                        st.a1 = fmaf((float)(isum[2 * sb] + isum[2 * sb + 1]), dw, st.a1);
                        st.am = fmaf((float)(imin[2 * sb] + imin[2 * sb + 1]), dm, st.am);
                    }
                }
            }
        }
    } else if (mode == 4) {
        float d = yd * xd;
        int sumi[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int gi = 0; gi < 8; gi++) {
            for (int l = 0; l < 8; l++) {
                int sc = kbyte(k0 + 2, 2 * gi + (l >= 4), true);
                int a = aq[8 * gi + l];
                sumi[l] += sc * (__dp4a(wq[8 * gi + l], a, 0) + 32 * __dp4a(0x01010101, a, 0));
            }
        }
        for (int l = 0; l < 8; l++) {
            int sub = (bs[2 * l] * kbyte(k0 + 2, 2 * l, true) + bs[2 * l + 1] * kbyte(k0 + 2, 2 * l + 1, true)) << 5;
            st.acc[l] = fmaf(d, (float)(sumi[l] - sub), st.acc[l]);
        }
    } else {
        unsigned s1 = 0;
        for (int s = 0; s < 16; s++) {
            int raw = 0;
            for (int l = 0; l < 4; l++) raw = __dp4a(wq[4 * s + l], aq[4 * s + l], raw);
            s1 += (unsigned)(raw * kbyte(k0 + 2, s, true));
        }
        st.a1 = fmaf((float)(int)s1 * xd, yd, st.a1);
    }
}

extern "C" __global__ void matmul_k(KMeta p, const int* codes, const u32* ks, const int* xq,
                                    const u32* xk, const u32* modes, float* out) {
    u32 per_col = (p.rows + 63) / 64, g = block_index();
    u32 m0 = g / per_col * p.tile, n = (g % per_col) * 64 + threadIdx.x;
    if (m0 >= p.cols || n >= p.rows) return;
    u32 tc = min(p.tile, p.cols - m0), nsb = p.k / 256;
    KState sts[4] = {};
    for (u32 b = 0; b < nsb; b++)
        for (u32 c = 0; c < tc; c++) k_block(sts[c], p, codes, ks, xq, xk, modes[m0 + c], n, m0 + c, b);
    for (u32 c = 0; c < tc; c++) {
        u32 m = m0 + c, mode = modes[m];
        const KState& st = sts[c];
        float r;
        if (mode == 0 || mode == 4) {
            r = ((st.acc[4] + st.acc[0]) + (st.acc[6] + st.acc[2])) + ((st.acc[5] + st.acc[1]) + (st.acc[7] + st.acc[3]));
            if (mode == 0) r = r + ((st.accm[0] + st.accm[2]) + (st.accm[1] + st.accm[3]));
        } else if (mode == 3 || mode == 5) {
            r = st.a1;
        } else {
            r = st.a1 - st.am;
        }
        out[(size_t)m * p.out_rows + p.row0 + n] = r;
    }
}

// Activations quantized on the device as ggml's x86 build quantizes them (metal's
// quantize.wgsl says how): one thread per block; kind 0 Q8_0, 1 Q8_1 (codes into `xq`, the f16
// d and s as f32 bits into `xs`), 2 Q8_K (codes, then d and 16 bsums, 17 words a block; the
// columns whose `modes` entry is 2 take ggml's 4x8 variant).
struct QMeta {
    u32 k, cols, kind;
};

__device__ __forceinline__ u32 pack4(const int* q) {
    return (u32)(q[0] & 0xff) | ((u32)(q[1] & 0xff) << 8) | ((u32)(q[2] & 0xff) << 16) |
           ((u32)(q[3] & 0xff) << 24);
}

extern "C" __global__ void quantize(QMeta p, const float* x, const u32* modes, u32* xq, u32* xs) {
    u32 qk = p.kind == 2 ? 256 : 32, per_col = p.k / qk;
    size_t b = (size_t)block_index() * 64 + threadIdx.x;
    if (b >= (size_t)per_col * p.cols) return;
    const float* v = x + b * qk;
    if (p.kind < 2) {
        float mx = 0.0f;
        for (int i = 0; i < 32; i++) mx = fmaxf(mx, fabsf(v[i]));
        float d = mx / 127.0f, id = mx != 0.0f ? 127.0f / mx : 0.0f;
        int sum = 0;
        for (int w = 0; w < 8; w++) {
            int q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = (int)rintf(v[4 * w + j] * id);
                sum += q[j];
            }
            xq[b * 8 + w] = pack4(q);
        }
        xs[2 * b] = __float_as_uint(round_f16(d));
        xs[2 * b + 1] = p.kind == 1 ? __float_as_uint(round_f16(d * (float)sum)) : 0u;
        return;
    }
    bool four_by_eight = modes[b / per_col] == 2;
    float mx = 0.0f, amx = 0.0f;
    for (int i = 0; i < 256; i++) {
        if (fabsf(v[i]) > amx) { amx = fabsf(v[i]); mx = v[i]; }
    }
    u32* h = xs + b * 17;
    if (amx == 0.0f) {
        for (int w = 0; w < 64; w++) xq[b * 64 + w] = 0u;
        for (int i = 0; i < 17; i++) h[i] = 0u;
        return;
    }
    float iscale = -127.0f / mx;
    if (four_by_eight) {
        bool pos = false;
        for (int i = 0; i < 256; i++) pos = pos || v[i] == amx;
        iscale = pos ? -127.0f / amx : 127.0f / amx;
    }
    for (int s = 0; s < 16; s++) {
        int bs = 0;
        for (int w = 0; w < 4; w++) {
            int q[4];
            for (int j = 0; j < 4; j++) {
                int r = (int)rintf(iscale * v[16 * s + 4 * w + j]);
                q[j] = four_by_eight ? max(-128, min(r, 127)) : min(r, 127);
                bs += q[j];
            }
            xq[b * 64 + 4 * s + w] = pack4(q);
        }
        h[1 + s] = (u32)bs;
    }
    h[0] = __float_as_uint(1.0f / iscale);
}
