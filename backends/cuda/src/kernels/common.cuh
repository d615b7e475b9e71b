// Prepended to every kernel file (NVRTC compiles each with no system headers). Blocks are 64
// threads; a block's index may spread over y when a grid has more than 32768 blocks.
typedef unsigned int u32;

__device__ __forceinline__ u32 block_index() {
    return blockIdx.y * gridDim.x + blockIdx.x;
}

// f32 -> f16 bits, rounding to nearest even, in integer arithmetic (the reference's rounding).
__device__ __forceinline__ u32 f16_bits(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    if (a >= 0x47800000u) return sign | 0x7c00u;
    if (a < 0x38800000u) {
        u32 e = a >> 23;
        if (e < 102u) return sign;
        u32 mant = (a & 0x7fffffu) | 0x800000u;
        u32 shift = 126u - e;
        u32 q = mant >> shift;
        u32 rem = mant & ((1u << shift) - 1u);
        u32 half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q += 1u;
        return sign | q;
    }
    u32 u = a - 0x38000000u;
    return sign | ((u + 0xfffu + ((u >> 13) & 1u)) >> 13);
}

__device__ __forceinline__ float f16_value(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 e = (h >> 10) & 0x1fu;
    u32 m = h & 0x3ffu;
    if (e == 0u) return __uint_as_float(__float_as_uint((float)m * 5.9604644775390625e-8f) | sign);
    if (e == 31u) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ float round_f16(float f) { return f16_value(f16_bits(f)); }

// Sum or max over the 64 threads of a block; every thread gets the result.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float buf[64];
    u32 li = threadIdx.x;
    buf[li] = v;
    __syncthreads();
    for (u32 h = 32; h > 0; h >>= 1) {
        if (li < h) buf[li] = is_max ? fmaxf(buf[li], buf[li + h]) : buf[li] + buf[li + h];
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// `ggml_v_expf` (ggml-cpu/vec.h, AVX-512), one lane: the reference's `ggml::v_expf`, with the
// same fused steps (`fmaf`; the file is compiled with --fmad=false, so nothing else fuses).
__device__ float v_expf(float x) {
    const float r = __uint_as_float(0x4b400000u);
    float z = fmaf(x, __uint_as_float(0x3fb8aa3bu), r);
    float n = z - r;
    float b = fmaf(-n, __uint_as_float(0x35bfbe8eu), fmaf(-n, __uint_as_float(0x3f317200u), x));
    float u = b * b;
    float j = fmaf(fmaf(fmaf(__uint_as_float(0x3c072010u), b, __uint_as_float(0x3d2b9f17u)), u,
                        fmaf(__uint_as_float(0x3e2aaf33u), b, __uint_as_float(0x3efffedbu))),
                   u, fmaf(__uint_as_float(0x3f7ffff6u), b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __uint_as_float(0x7f800000u);
    if (j != j || n != n) return j + n;
    return ldexpf(j, (int)floorf(n));
}

// `_mm512_reduce_add_ps` of a[0..16].
__device__ __forceinline__ float reduce16(const float* a) {
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++) t8[i] = a[i + 8] + a[i];
    for (int i = 0; i < 4; i++) t4[i] = t8[i + 4] + t8[i];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// `GGML_F32x16_REDUCE` of four 16-lane accumulators a[0..64].
__device__ __forceinline__ float reduce4x16(float* a) {
    for (int l = 0; l < 16; l++) {
        a[l] += a[l + 32];
        a[l + 16] += a[l + 48];
    }
    for (int l = 0; l < 16; l++) a[l] += a[l + 16];
    return reduce16(a);
}
