// Rotary embedding of x [D, H, T] with the host's cos/sin cache [T, n_dims] (cos at even,
// sin at odd indices: the reference's own `rope_cache`, so theta is the same float). One
// invocation per element; each pair as the reference rotates it (fma(x0, c, -(x1 s)),
// fma(x0, s, x1 c)).

struct Meta {
    d: u32,
    h: u32,
    t: u32,
    n_dims: u32,
    neox: u32,
    n: u32, // elements (dims past the third repeat the tokens)
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    let e = i % p.d;
    let head = i - e;
    let t = (i / (p.d * p.h)) % p.t;
    if (e >= p.n_dims) {
        out[i] = x[i];
        return;
    }
    var a: u32;
    var b: u32;
    var i0: u32;
    let half = p.n_dims / 2u;
    if (p.neox != 0u) {
        let j = select(e, e - half, e >= half);
        a = j;
        b = j + half;
        i0 = 2u * j;
    } else {
        a = e & ~1u;
        b = a + 1u;
        i0 = a;
    }
    let c = cs[t * p.n_dims + i0];
    let s = cs[t * p.n_dims + i0 + 1u];
    let x0 = x[head + a];
    let x1 = x[head + b];
    if (e == a) {
        out[i] = fma_x(x0, c, -(x1 * s));
    } else {
        out[i] = fma_x(x0, s, x1 * c);
    }
}
