// out[m, row0 + n] = sum_k w[n, k] x[m, k] for weights held as f32 (F32, F16 and BF16
// files): one subgroup per row (as matmul_q.wgsl), columns four at a time, any k.

struct Meta {
    k: u32,
    rows: u32,
    cols: u32,
    unused: u32,
    out_rows: u32,
    row0: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(subgroup_id) sid: u32, @builtin(subgroup_size) sgs: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let n = wg_index(wg, nw) * (64u / sgs) + sid;
    if (n >= p.rows) {
        return;
    }
    for (var m0 = 0u; m0 < p.cols; m0 += 4u) {
        var acc = vec4<f32>(0.0);
        for (var k = lane; k < p.k; k += sgs) {
            let wv = w[n * p.k + k];
            for (var c = 0u; c < 4u; c++) {
                if (m0 + c < p.cols) {
                    acc[c] += wv * x[(m0 + c) * p.k + k];
                }
            }
        }
        let sum = subgroupAdd(acc);
        if (lane == 0u) {
            for (var c = 0u; c < 4u; c++) {
                if (m0 + c < p.cols) {
                    out[(m0 + c) * p.out_rows + p.row0 + n] = sum[c];
                }
            }
        }
    }
}
