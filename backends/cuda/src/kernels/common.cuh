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
