// Activations quantized on the device as ggml's x86 build quantizes them for the block
// formats' dot products (the reference's `quant::quantize_activations_for`), one invocation
// per block of a column:
//   kind 0 Q8_0, 1 Q8_1 (32 elements: `d = max/127`, `id = 127/max`, round half to even;
//     Q8_1's `s = f16(d * sum(q))`) into `xq` (codes four to a word) and `xs` (d and s as the
//     f16 values, as f32 bits, two words a block);
//   kind 2 Q8_K (256 elements: `iscale = -127/max` with the signed max, or, for the columns
//     whose `modes` entry is 2 (Q4_K's repack GEMM), ggml's 4x8 variant with its sign rule;
//     `d = 1/iscale`) into `xq` and `xs` (d's bits and the 16 bsums, 17 words a block).

struct Meta {
    k: u32,
    cols: u32,
    kind: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> modes: array<u32>;
@group(0) @binding(3) var<storage, read_write> xq: array<u32>;
@group(0) @binding(4) var<storage, read_write> xs: array<u32>;

fn put(w0: u32, q: array<i32, 4>) {
    xq[w0] = (u32(q[0]) & 0xffu) | ((u32(q[1]) & 0xffu) << 8u) | ((u32(q[2]) & 0xffu) << 16u)
        | ((u32(q[3]) & 0xffu) << 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let qk = select(32u, 256u, p.kind == 2u);
    let per_col = p.k / qk;
    let b = wg_index(wg, nw) * 64u + li;
    if (b >= per_col * p.cols) {
        return;
    }
    let o = b * qk;
    if (p.kind < 2u) {
        var mx = 0.0;
        for (var i = 0u; i < 32u; i++) {
            mx = max(mx, abs(x[o + i]));
        }
        let d = mx / 127.0;
        let id = select(0.0, 127.0 / mx, mx != 0.0);
        var sum = 0;
        for (var w = 0u; w < 8u; w++) {
            var q: array<i32, 4>;
            for (var j = 0u; j < 4u; j++) {
                q[j] = i32(round(x[o + 4u * w + j] * id));
                sum += q[j];
            }
            put(b * 8u + w, q);
        }
        xs[2u * b] = bitcast<u32>(round_f16(d));
        xs[2u * b + 1u] = select(0u, bitcast<u32>(round_f16(d * f32(sum))), p.kind == 1u);
        return;
    }
    let four_by_eight = modes[b / per_col] == 2u;
    var mx = 0.0;
    var amx = 0.0;
    for (var i = 0u; i < 256u; i++) {
        let v = x[o + i];
        if (abs(v) > amx) {
            amx = abs(v);
            mx = v;
        }
    }
    let h = b * 17u;
    if (amx == 0.0) {
        for (var w = 0u; w < 64u; w++) {
            xq[b * 64u + w] = 0u;
        }
        for (var i = 0u; i < 17u; i++) {
            xs[h + i] = 0u;
        }
        return;
    }
    var iscale = -127.0 / mx;
    if (four_by_eight) {
        // ggml_quantize_mat_q8_K_4x8: the sign from whether +amax occurs.
        var pos = false;
        for (var i = 0u; i < 256u; i++) {
            pos = pos || x[o + i] == amx;
        }
        iscale = select(127.0 / amx, -127.0 / amx, pos);
    }
    for (var s = 0u; s < 16u; s++) {
        var bs = 0;
        for (var w = 0u; w < 4u; w++) {
            var q: array<i32, 4>;
            for (var j = 0u; j < 4u; j++) {
                let v = i32(round(iscale * x[o + 16u * s + 4u * w + j]));
                q[j] = select(min(v, 127), clamp(v, -128, 127), four_by_eight);
                bs += q[j];
            }
            put(b * 64u + 4u * s + w, q);
        }
        xs[h + 1u + s] = bitcast<u32>(bs);
    }
    xs[h] = bitcast<u32>(1.0 / iscale);
}
