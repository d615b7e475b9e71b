// add (op 0), mul (op 1) with b broadcast over a (each of b's dims divides a's), scale (op 2).

struct Meta {
    n: u32,
    op: u32,
    s: f32,
    unused: u32,
    a: vec4<u32>,
    b: vec4<u32>,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    if (p.op == 2u) {
        out[i] = a[i] * p.s;
        return;
    }
    let i0 = i % p.a.x;
    let i1 = (i / p.a.x) % p.a.y;
    let i2 = (i / (p.a.x * p.a.y)) % p.a.z;
    let i3 = i / (p.a.x * p.a.y * p.a.z);
    let j = (i0 % p.b.x) + p.b.x * ((i1 % p.b.y) + p.b.y * ((i2 % p.b.z) + p.b.z * (i3 % p.b.w)));
    if (p.op == 0u) {
        out[i] = a[i] + b[j];
    } else {
        out[i] = a[i] * b[j];
    }
}
