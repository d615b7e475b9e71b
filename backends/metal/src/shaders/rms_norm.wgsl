// Per row of k: y = (x * 1/sqrt(mean(x^2) + eps)) * w, in the reference's steps: the sum of
// squares term by term in element order in `wide` (f64 where the device has it, as ggml's
// `ggml_float` sum: then the result is the reference's to the bit), by one invocation of the
// row's workgroup.

struct Meta {
    k: u32,
    rows: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> row_scale: f32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wg_index(wg, nw);
    if (r >= p.rows) {
        return;
    }
    if (li == 0u) {
        var s = wide(0.0);
        for (var k = 0u; k < p.k; k++) {
            let v = x[r * p.k + k];
            s += wide(v * v);
        }
        let mean = f32(s / wide(p.k));
        row_scale = 1.0 / sqrt(mean + p.eps);
    }
    workgroupBarrier();
    let scale = row_scale;
    for (var k = li; k < p.k; k += 64u) {
        out[r * p.k + k] = (x[r * p.k + k] * scale) * w[k];
    }
}
