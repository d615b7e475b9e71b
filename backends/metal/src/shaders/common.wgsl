// Prepended to every kernel. Dispatches are at most 32768 workgroups wide, so a kernel with
// more work items spreads them over y as well and finds its index with `wg_index`.

fn wg_index(wg: vec3<u32>, nw: vec3<u32>) -> u32 {
    return wg.y * nw.x + wg.x;
}

// f32 -> f16 bits, rounding to nearest even (the reference's conversion), in integer
// arithmetic so that no driver's float mode can change it.
fn f16_bits(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    let sign = (x >> 16u) & 0x8000u;
    let a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if (a >= 0x47800000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        // Half subnormal (or zero): round(|f| * 2^24) as an integer.
        let e = a >> 23u;
        if (e < 102u) {
            return sign;
        }
        let mant = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        let q = mant >> shift;
        let rem = mant & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        var r = q;
        if (rem > half || (rem == half && (q & 1u) == 1u)) {
            r = q + 1u;
        }
        return sign | r;
    }
    let u = a - 0x38000000u;
    return sign | ((u + 0xfffu + ((u >> 13u) & 1u)) >> 13u);
}

// f16 bits -> f32, exact (subnormals included).
fn f16_value(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // m * 2^-24, exact in f32.
        let v = f32(m) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(v) | sign);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn round_f16(f: f32) -> f32 {
    return f16_value(f16_bits(f));
}

// Workgroup reductions for the 64-invocation kernels (one row or head per workgroup): every
// invocation passes its value and gets the total; call from workgroup-uniform control flow.
var<workgroup> reduce_buf: array<f32, 64>;

fn wg_reduce(li: u32, v: f32, is_max: bool) -> f32 {
    reduce_buf[li] = v;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) {
            let o = reduce_buf[li + h];
            reduce_buf[li] = select(reduce_buf[li] + o, max(reduce_buf[li], o), is_max);
        }
        workgroupBarrier();
    }
    let r = reduce_buf[0];
    workgroupBarrier();
    return r;
}
