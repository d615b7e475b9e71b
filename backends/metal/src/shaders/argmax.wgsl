// Per row: the index of the largest value, the first on ties; NaN is never chosen (a row of
// NaN gives 0). NaN is recognised by its bits: some drivers assume floats are never NaN.

struct Meta {
    k: u32,
    rows: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

var<workgroup> best_v: array<f32, 64>;
var<workgroup> best_i: array<u32, 64>;

const NONE: u32 = 0xffffffffu;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether (v, i) beats (bv, bi): a candidate that is not NaN against none, or a larger value,
// or the same value at a lower index.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (bi == NONE) {
        return true;
    }
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wg_index(wg, nw);
    if (r >= p.rows) {
        return;
    }
    var bv = 0.0;
    var bi = NONE;
    for (var k = li; k < p.k; k += 64u) {
        let v = x[r * p.k + k];
        if (!is_nan(v) && beats(v, k, bv, bi)) {
            bv = v;
            bi = k;
        }
    }
    best_v[li] = bv;
    best_i[li] = bi;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h && beats(best_v[li + h], best_i[li + h], best_v[li], best_i[li])) {
            best_v[li] = best_v[li + h];
            best_i[li] = best_i[li + h];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        out[r] = select(i32(best_i[0]), 0, best_i[0] == NONE);
    }
}
