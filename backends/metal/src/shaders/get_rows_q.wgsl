// out[m, :] = decode(table[ids[m], :]) for a grouped table (see matmul_q.wgsl): one workgroup
// per output row. A group without an offset is `code * scale` alone, as the reference decodes
// it (adding 0 would turn its -0 into +0).

struct Meta {
    k: u32,
    rows: u32, // ids
    group: u32,
    table_rows: u32, // rows of this chunk of the table
    row0: u32,       // its first row
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

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
    let kw = p.k / 4u;
    let gpr = p.k / p.group;
    for (var w = li; w < kw; w += 64u) {
        let word = bitcast<i32>(codes[r * kw + w]);
        let s = scales[r * gpr + (w * 4u) / p.group];
        for (var j = 0u; j < 4u; j++) {
            let v = f32(extractBits(word, 8u * j, 8u)) * s.x;
            out[m * p.k + w * 4u + j] = select(v + s.y, v, s.y == 0.0);
        }
    }
}
