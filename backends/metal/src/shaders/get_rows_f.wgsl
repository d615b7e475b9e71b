// out[m, :] = table[ids[m], :] for a table held as f32: one workgroup per output row.

struct Meta {
    k: u32,
    rows: u32,
    unused: u32,
    table_rows: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = wg_index(wg, nw);
    if (m >= p.rows) {
        return;
    }
    let r = u32(ids[m]);
    for (var k = li; k < p.k; k += 64u) {
        out[m * p.k + k] = w[r * p.k + k];
    }
}
