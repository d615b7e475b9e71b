// Causal attention, ggml's non-flash order (the metal backend's attention.wgsl): one 64-thread
// block per (query, head) over the host-gathered rows of its sequence, K then V in `kv`
// ([row][kv head][d], f32 or f16 bits), scores in `scores`.

struct AttnMeta {
    u32 d, hq, hkv, t, max_kv, f16, window, v_off;
    float scale, softcap;
};

struct Query {
    int pos;
    u32 base, n_kv, unused;
};

__device__ __forceinline__ float kv_load(const AttnMeta& p, const u32* kv, size_t idx) {
    if (p.f16) return f16_value((kv[idx / 2] >> (16 * (idx & 1))) & 0xffffu);
    return __uint_as_float(kv[idx]);
}

extern "C" __global__ void attention(AttnMeta p, const float* q, const u32* kv, const Query* qs,
                                     float* scores, float* out) {
    u32 id = block_index(), li = threadIdx.x;
    if (id >= p.t * p.hq) return;
    u32 t = id / p.hq, h = id % p.hq, hk = h / (p.hq / p.hkv);
    Query qi = qs[t];
    u32 pos = qi.pos > 0 ? (u32)qi.pos : 0;
    u32 lo = (p.window > 0 && pos + 1 > p.window) ? pos + 1 - p.window : 0;
    u32 hi = qi.n_kv < pos + 1 ? qi.n_kv : pos + 1;
    size_t q0 = (size_t)id * p.d, s0 = (size_t)id * p.max_kv;
    float mx = -3.4028235e38f;
    for (u32 j = lo + li; j < hi; j += 64) {
        size_t k0 = ((size_t)(qi.base + j) * p.hkv + hk) * p.d;
        float s = 0;
        for (u32 e = 0; e < p.d; e++) {
            float qv = p.f16 ? round_f16(q[q0 + e]) : q[q0 + e];
            s += kv_load(p, kv, k0 + e) * qv;
        }
        if (p.softcap > 0) s = p.softcap * tanhf(fminf(fmaxf(s / p.softcap, -10.0f), 10.0f));
        s *= p.scale;
        scores[s0 + j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_reduce(mx, true);
    float sum = 0;
    for (u32 j = lo + li; j < hi; j += 64) {
        float e = expf(scores[s0 + j] - mx);
        scores[s0 + j] = e;
        sum += e;
    }
    sum = block_reduce(sum, false);
    float inv = sum > 0 ? 1.0f / sum : 0.0f;
    __syncthreads();
    for (u32 e = li; e < p.d; e += 64) {
        float acc = 0;
        for (u32 j = lo; j < hi; j++) {
            float pj = scores[s0 + j] * inv;
            if (p.f16) pj = round_f16(pj);
            acc += pj * kv_load(p, kv, p.v_off + ((size_t)(qi.base + j) * p.hkv + hk) * p.d + e);
        }
        out[q0 + e] = acc;
    }
}
