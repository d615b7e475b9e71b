// out[m, :] = table[ids[m], :] for a table held as f32: one workgroup per output row.

struct Meta {
    k: u32,
    rows: u32,
    unused: u32,
    table_rows: u32, // rows of this chunk of the table
    row0: u32,       // its first row
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
    // Rows outside this chunk are another launch's.
    let id = u32(ids[m]);
    if (id < p.row0 || id >= p.row0 + p.table_rows) {
        return;
    }
    let r = id - p.row0;
    for (var k = li; k < p.k; k += 64u) {
        out[m * p.k + k] = w[r * p.k + k];
    }
}
