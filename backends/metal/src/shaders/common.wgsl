// Prepended to every kernel. Dispatches are at most 32768 workgroups wide, so a kernel with
// more work items spreads them over y as well and finds its index with `wg_index`.

fn wg_index(wg: vec3<u32>, nw: vec3<u32>) -> u32 {
    return wg.y * nw.x + wg.x;
}

// For the one-invocation-per-output matmuls: 64 rows of one column per workgroup, columns
// after each other. (column, row) of this invocation.
fn col_row(wg: vec3<u32>, nw: vec3<u32>, li: u32, rows: u32) -> vec2<u32> {
    let per_col = (rows + 63u) / 64u;
    let g = wg_index(wg, nw);
    return vec2<u32>(g / per_col, (g % per_col) * 64u + li);
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

// fma(a, b, c) rounded once, as the reference's `mul_add`, on every device. Where the
// device's own `fma` is fused (`FMA_FUSED`, measured when the device opens and prepended to
// every kernel) it is that; lavapipe computes `fma` as a rounded product plus an add, so there
// it is emulated: Dekker's exact product, an exact sum, and the low parts added with
// rounding to odd before the one rounding to nearest (Boldo & Melquiond, "Emulation of FMA and
// correctly-rounded sums: proved algorithms using rounding to odd", 2008). Exact for finite
// operands whose product neither overflows nor comes near the subnormals; others get the
// device's `fma`. Those error-free steps only work as written, and shader compilers may
// simplify `c - (c - a)` to `a`: each step passes through `opq`, an OR with a zero the
// compiler cannot see (`fma_init` sets it from the dispatch size), which it cannot simplify.
// A kernel that calls `fma_x` calls `fma_init(num_workgroups)` first.
var<private> OPQ: u32;

fn fma_init(nw: vec3<u32>) {
    OPQ = nw.z - 1u;
}

fn opq(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | OPQ);
}

fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opq(a + b);
    let bb = opq(s - a);
    return vec2<f32>(s, opq(a - opq(s - bb)) + opq(b - bb));
}

fn split_f32(a: f32) -> vec2<f32> {
    let c = opq(4097.0 * a);
    let hi = opq(c - opq(c - a));
    return vec2<f32>(hi, opq(a - hi));
}

fn fma_x(a: f32, b: f32, c: f32) -> f32 {
    if (FMA_FUSED) {
        return fma(a, b, c);
    }
    let p = opq(a * b);
    let m = max(abs(a), abs(b));
    if (!(abs(p) < 1.0e37 && abs(c) < 3.0e38 && m < 1.0e30) || abs(p) < 1.0e-28 || a == 0.0 || b == 0.0) {
        return fma(a, b, c);
    }
    let sa = split_f32(a);
    let sb = split_f32(b);
    let e1 = opq(opq(sa.x * sb.x) - p);
    let e2 = opq(e1 + opq(sa.x * sb.y));
    let e3 = opq(e2 + opq(sa.y * sb.x));
    let pl = opq(e3 + opq(sa.y * sb.y));
    let t = two_sum(c, p);
    let w = two_sum(t.y, pl);
    var v = w.x;
    if (w.y != 0.0 && (bitcast<u32>(v) & 1u) == 0u) {
        // Round to odd: the inexact sum moves one unit toward its remainder.
        if (v == 0.0) {
            v = w.y;
        } else if ((w.y > 0.0) == (v > 0.0)) {
            v = bitcast<f32>(bitcast<u32>(v) + 1u);
        } else {
            v = bitcast<f32>(bitcast<u32>(v) - 1u);
        }
    }
    return t.x + v;
}

// `ggml_v_expf` (ggml-cpu/vec.h, AVX-512), one lane: the reference's `ggml::v_expf`.
fn v_expf(x: f32) -> f32 {
    let r = bitcast<f32>(0x4b400000u);
    let z = fma_x(x, bitcast<f32>(0x3fb8aa3bu), r);
    let n = z - r;
    let b = fma_x(-n, bitcast<f32>(0x35bfbe8eu), fma_x(-n, bitcast<f32>(0x3f317200u), x));
    let u = b * b;
    let j = fma_x(fma_x(fma_x(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
                        fma_x(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))), u,
                  fma_x(bitcast<f32>(0x3f7ffff6u), b, 1.0));
    if (abs(n) > 192.0) {
        return select(bitcast<f32>(0x7f800000u), 0.0, n <= 0.0);
    }
    if (j != j || n != n) {
        return j + n;
    }
    // j * 2^n rounded once (n is integral): exact unless the result is subnormal.
    return ldexp(j, i32(floor(n)));
}

// `_mm512_reduce_add_ps` of 16 lanes at `a[o..o + 16]`.
fn reduce16(a: ptr<function, array<f32, 64>>, o: u32) -> f32 {
    var t8: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        t8[i] = (*a)[o + i + 8u] + (*a)[o + i];
    }
    var t4: array<f32, 4>;
    for (var i = 0u; i < 4u; i++) {
        t4[i] = t8[i + 4u] + t8[i];
    }
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// `GGML_F32x16_REDUCE` of four 16-lane accumulators: (a0 + a2) + (a1 + a3) lane-wise, then
// `reduce16`.
fn reduce4x16(a: ptr<function, array<f32, 64>>) -> f32 {
    for (var l = 0u; l < 16u; l++) {
        (*a)[l] += (*a)[l + 32u];
        (*a)[l + 16u] += (*a)[l + 48u];
    }
    for (var l = 0u; l < 16u; l++) {
        (*a)[l] += (*a)[l + 16u];
    }
    return reduce16(a, 0u);
}
