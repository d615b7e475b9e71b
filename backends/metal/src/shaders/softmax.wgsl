// Per row: p = softmax(x * scale) in the reference's steps (`soft_max_row`): the max in row
// order, ggml's exp polynomial (`v_expf`) on whole 16-blocks (the device's `exp` on the rest,
// where the reference uses libm's), each block's sum in `_mm512_reduce_add_ps` order and the
// blocks summed in `wide` (f64 where the device has it) by one invocation. One workgroup per
// row.

struct Meta {
    k: u32,
    rows: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

var<workgroup> shared_max: f32;
var<workgroup> shared_inv: f32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let r = wg_index(wg, nw);
    if (r >= p.rows) {
        return;
    }
    let o = r * p.k;
    if (li == 0u) {
        // ggml's MAX(a, b) = a > b ? a : b, in row order.
        var m = bitcast<f32>(0xff800000u);
        for (var k = 0u; k < p.k; k++) {
            let v = x[o + k] * p.scale;
            m = select(v, m, m > v);
        }
        shared_max = m;
    }
    workgroupBarrier();
    let mx = shared_max;
    let full = p.k & ~15u;
    for (var k = li; k < p.k; k += 64u) {
        let v = x[o + k] * p.scale - mx;
        out[o + k] = select(exp(v), v_expf(v), k < full);
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        var sum = wide(0.0);
        var blk: array<f32, 64>;
        for (var b = 0u; b < full; b += 16u) {
            for (var l = 0u; l < 16u; l++) {
                blk[l] = out[o + b + l];
            }
            sum += wide(reduce16(&blk, 0u));
        }
        for (var k = full; k < p.k; k++) {
            sum += wide(out[o + k]);
        }
        shared_inv = f32(wide(1.0) / sum);
    }
    workgroupBarrier();
    let inv = shared_inv;
    for (var k = li; k < p.k; k += 64u) {
        out[o + k] = out[o + k] * inv;
    }
}
