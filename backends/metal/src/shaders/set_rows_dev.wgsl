// set_rows into a device tensor, in place: one thread per destination word (f32 bits as they
// are, or two f16 elements rounded to nearest even), each row where `idx` puts it.

struct Meta {
    words: u32,
    per_row: u32,
    f16: u32,
    k: u32,
    base: u32,
    stride: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.words) {
        return;
    }
    let m = i / p.per_row;
    let w = i % p.per_row;
    let at = p.base + u32(idx[m]) * p.stride + w;
    if (p.f16 != 0u) {
        let e = m * p.k + 2u * w;
        dst[at] = f16_bits(src[e]) | (f16_bits(src[e + 1u]) << 16u);
    } else {
        dst[at] = bitcast<u32>(src[m * p.k + w]);
    }
}
