// out[m, row0 + n] = sum_k w[n, k] x[m, k] over a chunk of rows of a grouped weight: codes
// are i8 (four to a word, in element order), each group of G elements has (scale, offset) and
// decodes as scale * code + offset. As ggml's dot products do, a group contributes
// scale * sum(code x) + offset * S, with S the activations' own sum over the group (for Q8_1
// activations the f16 `s` ggml stores, not the sum of the rounded values). One subgroup per row (64 / subgroup size rows per
// workgroup, no barriers: the sums meet in subgroupAdd); columns four at a time.

struct Meta {
    k: u32,        // elements per row (a multiple of G and of 4)
    rows: u32,     // rows in this chunk
    cols: u32,     // M
    group: u32,    // G
    out_rows: u32, // N of the whole weight (the output's row stride)
    row0: u32,     // first row of this chunk
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> sums: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(subgroup_id) sid: u32, @builtin(subgroup_size) sgs: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let n = wg_index(wg, nw) * (64u / sgs) + sid;
    if (n >= p.rows) {
        return;
    }
    let kw = p.k / 4u;
    let gpr = p.k / p.group;
    // Eight columns a pass with no per-column test while eight remain (prompts), then the
    // rest four at a time.
    var m0 = 0u;
    for (; m0 + 8u <= p.cols; m0 += 8u) {
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        for (var w = lane; w < kw; w += sgs) {
            let word = bitcast<i32>(codes[n * kw + w]);
            let g = (w * 4u) / p.group;
            let s = scales[n * gpr + g];
            let q = vec4<f32>(f32(extractBits(word, 0u, 8u)), f32(extractBits(word, 8u, 8u)),
                              f32(extractBits(word, 16u, 8u)), f32(extractBits(word, 24u, 8u)));
            let c0 = m0 * kw + w;
            a0 += s.x * vec4<f32>(dot(q, x[c0]), dot(q, x[c0 + kw]), dot(q, x[c0 + 2u * kw]),
                                  dot(q, x[c0 + 3u * kw]));
            a1 += s.x * vec4<f32>(dot(q, x[c0 + 4u * kw]), dot(q, x[c0 + 5u * kw]),
                                  dot(q, x[c0 + 6u * kw]), dot(q, x[c0 + 7u * kw]));
            if ((w * 4u) % p.group == 0u && s.y != 0.0) {
                let g0 = m0 * gpr + g;
                a0 += s.y * vec4<f32>(sums[g0], sums[g0 + gpr], sums[g0 + 2u * gpr], sums[g0 + 3u * gpr]);
                a1 += s.y * vec4<f32>(sums[g0 + 4u * gpr], sums[g0 + 5u * gpr], sums[g0 + 6u * gpr],
                                      sums[g0 + 7u * gpr]);
            }
        }
        let t0 = subgroupAdd(a0);
        let t1 = subgroupAdd(a1);
        if (lane == 0u) {
            for (var c = 0u; c < 4u; c++) {
                out[(m0 + c) * p.out_rows + p.row0 + n] = t0[c];
                out[(m0 + 4u + c) * p.out_rows + p.row0 + n] = t1[c];
            }
        }
    }
    for (; m0 < p.cols; m0 += 4u) {
        var acc = vec4<f32>(0.0);
        for (var w = lane; w < kw; w += sgs) {
            let word = bitcast<i32>(codes[n * kw + w]);
            let g = (w * 4u) / p.group;
            let s = scales[n * gpr + g];
            let q = vec4<f32>(f32(extractBits(word, 0u, 8u)), f32(extractBits(word, 8u, 8u)),
                              f32(extractBits(word, 16u, 8u)), f32(extractBits(word, 24u, 8u)));
            let first = (w * 4u) % p.group == 0u && s.y != 0.0;
            for (var c = 0u; c < 4u; c++) {
                if (m0 + c < p.cols) {
                    acc[c] += s.x * dot(q, x[(m0 + c) * kw + w]);
                    if (first) {
                        acc[c] += s.y * sums[(m0 + c) * gpr + g];
                    }
                }
            }
        }
        let sum = subgroupAdd(acc);
        if (lane == 0u) {
            for (var c = 0u; c < 4u; c++) {
                if (m0 + c < p.cols) {
                    out[(m0 + c) * p.out_rows + p.row0 + n] = sum[c];
                }
            }
        }
    }
}
