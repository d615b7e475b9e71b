// Copies chunks of `per_chunk` words from `src` (chunk c from word `starts[c]`) one after
// another into `dst` from word `dst_off`: attention's rows gathered from a device cache.

struct Meta {
    n: u32,
    per_chunk: u32,
    dst_off: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    dst[p.dst_off + i] = src[starts[i / p.per_chunk] + i % p.per_chunk];
}
