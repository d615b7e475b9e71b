// out[m, row0 + n] for the legacy block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in the
// reference's float order, so the result is the reference's to the bit. Weights as the other
// matmuls take them (i8 codes four to a word, (d, m) per 32-element block); activations as
// ggml quantizes them (Q8_0 / Q8_1: i8 codes, (d, s) per block). Per block, the exact integer
// sums of four products (`dot4I8Packed`), then the x86 kernels' chain:
// - lanes 8 (`ggml_vec_dot_*` and tinyBLAS): eight f32 accumulators, lane l taking elements
//   4l..4l+3 of each block, `acc = fma(dx * dy, sum, acc)`, then `hsum_float_8`, plus the
//   `m * s` terms summed on the side for Q4_1 / Q5_1;
// - lanes 1 (Q4_0 in ggml's repack layout): one accumulator, `acc = fma(sum, dx * dy, acc)`
//   over whole-block sums.
// One invocation per row of up to `tile` (at most 8) columns: the row's weight words are
// read once for them all (a prompt's product reads its weights once per tile, not per
// column), and each output keeps its own chain. 64 rows per workgroup.

struct Meta {
    k: u32,
    rows: u32,     // rows in this chunk
    cols: u32,
    out_rows: u32, // N of the whole weight
    row0: u32,
    lanes: u32,    // 8 or 1
    has_m: u32,    // Q4_1 / Q5_1
    tile: u32,     // columns per invocation, 1..8
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> scales: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> xq: array<u32>;
@group(0) @binding(4) var<storage, read> xs: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let at = col_row(wg, nw, li, p.rows);
    let m0 = at.x * p.tile;
    let n = at.y;
    if (m0 >= p.cols || n >= p.rows) {
        return;
    }
    let tc = min(p.tile, p.cols - m0);
    let nb = p.k / 32u;
    let kw = p.k / 4u;
    var acc: array<array<f32, 8>, 8>;
    var summs: array<f32, 8>;
    var w: array<u32, 8>;
    for (var b = 0u; b < nb; b++) {
        let ws = scales[n * nb + b];
        let wo = n * kw + b * 8u;
        for (var l = 0u; l < 8u; l++) {
            w[l] = codes[wo + l];
        }
        for (var c = 0u; c < tc; c++) {
            let m = m0 + c;
            let as_ = xs[m * nb + b];
            let d = ws.x * as_.x;
            let xo = m * kw + b * 8u;
            if (p.lanes == 8u) {
                for (var l = 0u; l < 8u; l++) {
                    let s = dot4I8Packed(w[l], xq[xo + l]);
                    acc[c][l] = fma_x(d, f32(s), acc[c][l]);
                }
            } else {
                var s = 0;
                for (var l = 0u; l < 8u; l++) {
                    s += dot4I8Packed(w[l], xq[xo + l]);
                }
                acc[c][0] = fma_x(f32(s), d, acc[c][0]);
            }
            if (p.has_m != 0u) {
                summs[c] = fma_x(ws.y, as_.y, summs[c]);
            }
        }
    }
    for (var c = 0u; c < tc; c++) {
        let a = acc[c];
        var r = a[0];
        if (p.lanes == 8u) {
            r = ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
        }
        if (p.has_m != 0u) {
            r = r + summs[c];
        }
        out[(m0 + c) * p.out_rows + p.row0 + n] = r;
    }
}
