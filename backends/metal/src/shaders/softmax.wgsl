// Per row: p = exp(x*scale - max) / sum. One workgroup per row; the sum in f32.

struct Meta {
    k: u32,
    rows: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wg_index(wg, nw);
    if (r >= p.rows) {
        return;
    }
    var mx = -3.4028235e38;
    for (var k = li; k < p.k; k += 64u) {
        mx = max(mx, x[r * p.k + k] * p.scale);
    }
    mx = wg_reduce(li, mx, true);
    var s = 0.0;
    for (var k = li; k < p.k; k += 64u) {
        let e = exp(x[r * p.k + k] * p.scale - mx);
        out[r * p.k + k] = e;
        s += e;
    }
    let inv = 1.0 / wg_reduce(li, s, false);
    for (var k = li; k < p.k; k += 64u) {
        out[r * p.k + k] = out[r * p.k + k] * inv;
    }
}
