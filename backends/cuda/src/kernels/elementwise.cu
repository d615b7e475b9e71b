// One thread per element: rope (with the host's cos/sin cache, the reference's own), glu,
// add / mul with broadcast / scale, and set_rows' conversion.

struct RopeMeta {
    u32 d, h, t, n_dims, neox, n;
};

extern "C" __global__ void rope(RopeMeta p, const float* x, const float* cs, float* out) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.n) return;
    u32 e = i % p.d, head = i - e, t = (i / (p.d * p.h)) % p.t;
    if (e >= p.n_dims) { out[i] = x[i]; return; }
    u32 a, b, i0, half = p.n_dims / 2;
    if (p.neox) {
        u32 j = e >= half ? e - half : e;
        a = j; b = j + half; i0 = 2 * j;
    } else {
        a = e & ~1u; b = a + 1; i0 = a;
    }
    float c = cs[(size_t)t * p.n_dims + i0], s = cs[(size_t)t * p.n_dims + i0 + 1];
    float x0 = x[head + a], x1 = x[head + b];
    out[i] = e == a ? fmaf(x0, c, -(x1 * s)) : fmaf(x0, s, x1 * c);
}

struct GluMeta {
    u32 n, act, k;
};

// SiLU with ggml's exp polynomial on each row's whole 16-blocks (the reference's bits), the
// device's expf on the rest (the reference's is libm's); GELU from ggml's table of
// f16(gelu(x)) by the f16 bits of x (`gelu`, two to a word), the reference's values.
extern "C" __global__ void glu(GluMeta p, const float* gate, const float* up, const u32* gelu,
                               float* out) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.n) return;
    float g = gate[i], a;
    if (p.act == 0) {
        a = i % p.k < (p.k & ~15u) ? g / (1.0f + v_expf(0.0f - g)) : g / (1.0f + expf(-g));
    } else {
        if (g <= -10.0f) { out[i] = 0.0f; return; }
        u32 h = f16_bits(g);
        a = g >= 10.0f ? g : f16_value((gelu[h / 2] >> (16 * (h & 1))) & 0xffffu);
    }
    out[i] = a * up[i];
}

struct EltMeta {
    u32 n, op;
    float s;
    u32 unused;
    u32 a[4], b[4];
};

extern "C" __global__ void elementwise(EltMeta p, const float* a, const float* b, float* out) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.n) return;
    if (p.op == 2) { out[i] = a[i] * p.s; return; }
    u32 i0 = i % p.a[0], i1 = (i / p.a[0]) % p.a[1], i2 = (i / (p.a[0] * p.a[1])) % p.a[2];
    u32 i3 = i / (p.a[0] * p.a[1] * p.a[2]);
    u32 j = (i0 % p.b[0]) + p.b[0] * ((i1 % p.b[1]) + p.b[1] * ((i2 % p.b[2]) + p.b[2] * (i3 % p.b[3])));
    out[i] = p.op == 0 ? a[i] + b[j] : a[i] * b[j];
}

struct SetRowsMeta {
    u32 n, f16;
};

extern "C" __global__ void set_rows(SetRowsMeta p, const float* src, u32* out) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.n) return;
    out[i] = p.f16 ? f16_bits(src[i]) : __float_as_uint(src[i]);
}

// set_rows into a device tensor, in place: one thread per destination word (f32 bits, or two
// f16 elements), each row where `idx` puts it.
struct SetRowsDevMeta {
    u32 words, per_row, f16, k, base, stride;
};

extern "C" __global__ void set_rows_dev(SetRowsDevMeta p, const float* src, const int* idx,
                                        u32* dst) {
    u32 i = block_index() * 64 + threadIdx.x;
    if (i >= p.words) return;
    u32 m = i / p.per_row, w = i % p.per_row;
    size_t at = (size_t)p.base + (size_t)(u32)idx[m] * p.stride + w;
    if (p.f16) {
        u32 e = m * p.k + 2 * w;
        dst[at] = f16_bits(src[e]) | (f16_bits(src[e + 1]) << 16);
    } else {
        dst[at] = __float_as_uint(src[m * p.k + w]);
    }
}
