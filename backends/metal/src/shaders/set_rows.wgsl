// The rows set_rows writes, converted: f32 bits as they are (f16 = 0) or f16 bits rounded to
// nearest even, one u32 per element; the host stores them at their rows.

struct Meta {
    n: u32,
    f16: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    let v = src[i];
    out[i] = select(bitcast<u32>(v), f16_bits(v), p.f16 != 0u);
}
