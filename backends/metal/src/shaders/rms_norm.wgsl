// Per row of k: y = (x * 1/sqrt(mean(x^2) + eps)) * w. One workgroup per row; the sum of
// squares in f32 (the reference's is f64: within the gate's tolerance).

struct Meta {
    k: u32,
    rows: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wg_index(wg, nw);
    if (r >= p.rows) {
        return;
    }
    var s = 0.0;
    for (var k = li; k < p.k; k += 64u) {
        let v = x[r * p.k + k];
        s += v * v;
    }
    let scale = 1.0 / sqrt(wg_reduce(li, s, false) / f32(p.k) + p.eps);
    for (var k = li; k < p.k; k += 64u) {
        out[r * p.k + k] = (x[r * p.k + k] * scale) * w[k];
    }
}
