// out = act(gate) * up, rows of k, as the reference computes it: SiLU (act 0) with ggml's
// AVX-512 exp polynomial (`v_expf`) on each row's whole 16-element blocks (the row's last
// k % 16 elements use the device's `exp` where the reference uses libm's: close, not always
// the same bits); GELU (act 1) from ggml's table of f16(gelu(x)) by the f16 bits of x (0 at
// x <= -10), the reference's values.

struct Meta {
    n: u32,
    act: u32,
    k: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read> gelu: array<u32>; // f16 bits, two to a word
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let i = wg_index(wg, nw) * 64u + li;
    if (i >= p.n) {
        return;
    }
    let g = gate[i];
    var a: f32;
    if (p.act == 0u) {
        if (i % p.k < (p.k & ~15u)) {
            a = g / (1.0 + v_expf(0.0 - g));
        } else {
            a = g / (1.0 + exp(-g));
        }
    } else {
        if (g <= -10.0) {
            out[i] = 0.0;
            return;
        }
        if (g >= 10.0) {
            a = g;
        } else {
            let h = f16_bits(g);
            a = f16_value((gelu[h / 2u] >> (16u * (h & 1u))) & 0xffffu);
        }
    }
    out[i] = a * up[i];
}
