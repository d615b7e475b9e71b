// Causal attention in the reference's order (the metal backend's attention.wgsl, which says
// how): one 64-thread block per (query, head) over the host-gathered rows of its sequence, K
// then V in `kv` ([row][kv head][d], f32 or f16 bits), scores in `scores`. The reference's
// f64 sums are doubles here.

struct AttnMeta {
    u32 d, hq, hkv, t, stride, f16, window, v_off;
    float scale, softcap;
};

struct Query {
    int pos;
    u32 base, n_kv, n_eff, kq_tile, kqv_tile, unused0, unused1;
};

__device__ __forceinline__ float kv_load(const AttnMeta& p, const u32* kv, size_t idx) {
    if (p.f16) return f16_value((kv[idx / 2] >> (16 * (idx & 1))) & 0xffffu);
    return __uint_as_float(kv[idx]);
}

__device__ __forceinline__ float q_load(const AttnMeta& p, const float* q, size_t i) {
    return p.f16 ? round_f16(q[i]) : q[i];
}

__device__ float attn_score(const AttnMeta& p, const u32* kv, size_t k0, const float* q,
                            size_t q0, bool kq_tile) {
    float acc[64];
    for (int l = 0; l < 64; l++) acc[l] = 0.0f;
    if (kq_tile) {
        for (u32 e = 0; e < p.d; e++)
            acc[e % 16] = fmaf(kv_load(p, kv, k0 + e), q_load(p, q, q0 + e), acc[e % 16]);
        return reduce16(acc);
    }
    u32 np = p.d & ~63u;
    for (u32 e = 0; e < np; e++)
        acc[e % 64] = fmaf(kv_load(p, kv, k0 + e), q_load(p, q, q0 + e), acc[e % 64]);
    float s = reduce4x16(acc);
    if (!p.f16) {
        for (u32 e = np; e < p.d; e++) s = fmaf(kv_load(p, kv, k0 + e), q_load(p, q, q0 + e), s);
        return s;
    }
    double w = s;
    for (u32 e = np; e < p.d; e++) w += (double)(kv_load(p, kv, k0 + e) * q_load(p, q, q0 + e));
    return (float)w;
}

__device__ __forceinline__ u32 round_up(u32 v, u32 m) { return (v + m - 1) / m * m; }

extern "C" __global__ void attention(AttnMeta p, const float* q, const u32* kv, const Query* qs,
                                     float* scores, float* out) {
    __shared__ float shared_max, shared_inv;
    u32 id = block_index(), li = threadIdx.x;
    if (id >= p.t * p.hq) return;
    u32 t = id / p.hq, h = id % p.hq, hk = h / (p.hq / p.hkv);
    Query qi = qs[t];
    size_t q0 = (size_t)id * p.d, s0 = (size_t)id * p.stride;
    int e1 = qi.pos + 1;
    u32 end = e1 < 0 ? 0 : ((u32)e1 < qi.n_kv ? (u32)e1 : qi.n_kv);
    u32 len = end > 0 ? min(round_up(end, 16), qi.n_eff) : min(qi.n_eff, 16u);
    const float ninf = __uint_as_float(0xff800000u);
    for (u32 j = li; j < len; j += 64) {
        float s = ninf;
        if (j < end && (p.window == 0 || (u32)qi.pos - j < p.window)) {
            s = attn_score(p, kv, ((size_t)(qi.base + j) * p.hkv + hk) * p.d, q, q0, qi.kq_tile);
            s = p.softcap > 0.0f ? (tanhf(s * (1.0f / p.softcap)) * p.softcap) * p.scale : s * p.scale;
        }
        scores[s0 + j] = s;
    }
    __syncthreads();
    if (li == 0) {
        float m = ninf;
        for (u32 j = 0; j < len; j++) {
            float x = scores[s0 + j];
            m = m > x ? m : x;
        }
        shared_max = m;
    }
    __syncthreads();
    float mx = shared_max;
    u32 full = len & ~15u;
    for (u32 j = li; j < len; j += 64) {
        float x = scores[s0 + j] - mx;
        scores[s0 + j] = j < full ? v_expf(x) : expf(x);
    }
    __syncthreads();
    if (li == 0) {
        double sum = 0;
        for (u32 b = 0; b < full; b += 16) sum += (double)reduce16(scores + s0 + b);
        for (u32 j = full; j < len; j++) sum += (double)scores[s0 + j];
        shared_inv = (float)(1.0 / sum);
    }
    __syncthreads();
    float inv = shared_inv;
    for (u32 j = li; j < len; j += 64) {
        float x = scores[s0 + j] * inv;
        scores[s0 + j] = p.f16 ? round_f16(x) : x;
    }
    __syncthreads();
    u32 lanes = qi.kqv_tile ? 16 : 64;
    u32 np = qi.kqv_tile ? qi.n_eff : (qi.n_eff & ~63u);
    u32 span = end > 0 ? min(round_up(end, lanes), qi.n_eff) : 0;
    u32 simd_end = min(min(span, np), len);
    for (u32 e = li; e < p.d; e += 64) {
        float acc[64];
        for (int l = 0; l < 64; l++) acc[l] = 0.0f;
        for (u32 j = 0; j < simd_end; j++) {
            float pj = scores[s0 + j];
            if (pj == 0.0f) continue;
            float v = kv_load(p, kv, p.v_off + ((size_t)(qi.base + j) * p.hkv + hk) * p.d + e);
            acc[j % lanes] = fmaf(v, pj, acc[j % lanes]);
        }
        float r = qi.kqv_tile ? reduce16(acc) : reduce4x16(acc);
        if (!qi.kqv_tile && np < qi.n_eff && span > np) {
            double w = r;
            for (u32 j = np; j < qi.n_kv; j++) {
                float pj = j < len ? scores[s0 + j] : 0.0f;
                float v = kv_load(p, kv, p.v_off + ((size_t)(qi.base + j) * p.hkv + hk) * p.d + e);
                if (p.f16) w += (double)(v * pj);
                else r = fmaf(v, pj, r);
            }
            if (p.f16) r = (float)w;
        }
        out[q0 + e] = r;
    }
}

// Chunks of `per_chunk` words from `src` (chunk c from word `starts[c]`) one after another
// into `dst` from word `dst_off`: attention's rows gathered from a device cache.
struct GatherMeta {
    u32 n, per_chunk, dst_off;
};

extern "C" __global__ void gather_words(GatherMeta p, const u32* starts, const u32* src,
                                        u32* dst) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.n) return;
    dst[p.dst_off + i] = src[(size_t)starts[i / p.per_chunk] + i % p.per_chunk];
}
