// out[i] = fma(a[i], b[i], c[i]) with the device's own `fma` (`probe` = 0: does it round
// once?) or with `fma_x` (1: tests of the emulation).

struct Meta {
    n: u32,
    emulated: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> abc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    let v = abc[i];
    out[i] = select(fma(v.x, v.y, v.z), fma_x(v.x, v.y, v.z), p.emulated != 0u);
}
