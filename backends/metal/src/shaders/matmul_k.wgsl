// out[m, row0 + n] for Q4_K and Q6_K weights in the reference's float order, so the result is
// the reference's to the bit: the chain of the x86 kernel ggml runs for the column (`modes`,
// chosen on the host by `quant::matmul_kernel_in`):
//   0 Q4_K `ggml_vec_dot_q4_K_q8_K` (eight lanes, four min lanes, `hsum_float_8`),
//   1 Q4_K repack GEMV (one fma per super block), 2 Q4_K repack GEMM (one per 64 elements),
//   3 Q4_K tiled, 4 Q6_K `ggml_vec_dot_q6_K_q8_K`, 5 Q6_K tiled.
// Weights: i8 codes in element order (Q4_K 0..15, Q6_K q - 32), four to a word, and per
// super block the `kscales` words (weights.rs `k_scales`). Activations: Q8_K as the column's
// kernel quantizes it, codes four to a word and per super block `[d, bsums 0..16]` (`xk`).
// Integer sums are exact (and wrap where ggml's do). One invocation per row of up to `tile`
// (at most 4) columns, each super block's weights read for them all in turn (from the cache:
// a prompt's product reads its weights once per tile, not per column), each output in its own
// chain.

struct Meta {
    k: u32,
    rows: u32,
    cols: u32,
    out_rows: u32,
    row0: u32,
    tile: u32,
}

// One output's accumulators.
struct KState {
    acc: array<f32, 8>,
    accm: array<f32, 4>,
    a1: f32,
    am: f32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> codes: array<u32>;
@group(0) @binding(2) var<storage, read> ks: array<u32>;
@group(0) @binding(3) var<storage, read> xq: array<u32>;
@group(0) @binding(4) var<storage, read> xk: array<u32>;
@group(0) @binding(5) var<storage, read> modes: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const XK_WORDS: u32 = 17u;

// Byte `i` (0..16) of the four words at ks[o..o + 4], unsigned or sign-extended.
fn kbyte(o: u32, i: u32) -> u32 {
    return extractBits(ks[o + i / 4u], 8u * (i % 4u), 8u);
}

fn kbyte_i(o: u32, i: u32) -> i32 {
    return extractBits(bitcast<i32>(ks[o + i / 4u]), 8u * (i % 4u), 8u);
}

// Σ codes·q8 over four consecutive words starting at word `w` / `a` (16 elements), or eight
// (32).
fn dot16(w: u32, a: u32) -> i32 {
    var s = 0;
    for (var i = 0u; i < 4u; i++) {
        s += dot4I8Packed(codes[w + i], xq[a + i]);
    }
    return s;
}

fn bsum(x0: u32, i: u32) -> i32 {
    return bitcast<i32>(xk[x0 + 1u + i]);
}

// `st0` after super block `b` of row `n` times column `m` (whose chain is `mode`). (By value:
// naga's SPIR-V writer cannot pass a pointer to an element of a local array.)
fn block(st0: KState, mode: u32, n: u32, m: u32, b: u32) -> KState {
    var st = st0;
    let nsb = p.k / 256u;
    let kw = p.k / 4u;
    let k0 = (n * nsb + b) * 8u;
    let xd = bitcast<f32>(ks[k0]);
    let xdmin = bitcast<f32>(ks[k0 + 1u]);
    let x0 = (m * nsb + b) * XK_WORDS;
    let yd = bitcast<f32>(xk[x0]);
    let wo = n * kw + b * 64u;
    let ao = m * kw + b * 64u;
    if (mode <= 3u) {
        // Q4_K: 6-bit scales sc[s] at bytes 0..8 and mins m[s] at 8..16 of ks[k0 + 2..].
        if (mode == 0u) {
            let d = yd * xd;
            let dmin = -yd * xdmin;
            for (var j = 0u; j < 4u; j++) {
                var prod = 0;
                for (var h = 0u; h < 2u; h++) {
                    let s = 2u * j + h;
                    // ggml sums the bsum pair in 16 bits.
                    let q8s = (bsum(x0, 2u * s) + bsum(x0, 2u * s + 1u)) << 16u >> 16u;
                    prod += i32(kbyte(k0 + 2u, 8u + s)) * q8s;
                }
                st.accm[j] = fma_x(dmin, f32(prod), st.accm[j]);
            }
            var sumi = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
            for (var s = 0u; s < 8u; s++) {
                let sc = i32(kbyte(k0 + 2u, s));
                for (var l = 0u; l < 8u; l++) {
                    sumi[l] += sc * dot4I8Packed(codes[wo + 8u * s + l], xq[ao + 8u * s + l]);
                }
            }
            for (var l = 0u; l < 8u; l++) {
                st.acc[l] = fma_x(d, f32(sumi[l]), st.acc[l]);
            }
        } else {
            var isum = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
            var imin = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
            for (var s = 0u; s < 8u; s++) {
                let raw = dot16(wo + 8u * s, ao + 8u * s) + dot16(wo + 8u * s + 4u, ao + 8u * s + 4u);
                isum[s] = i32(kbyte(k0 + 2u, s)) * raw;
                imin[s] = i32(kbyte(k0 + 2u, 8u + s)) * (bsum(x0, 2u * s) + bsum(x0, 2u * s + 1u));
            }
            if (mode == 3u) {
                // Tiled: wrapping sums, then `res = s1 * d; res = fma(-dmin, s2, res);
                // acc = fma(res, d8, acc)`.
                var s1 = 0;
                var s2 = 0;
                for (var s = 0u; s < 8u; s++) {
                    s1 += isum[s];
                    s2 += imin[s];
                }
                let res = fma_x(-xdmin, f32(s2), f32(s1) * xd);
                st.a1 = fma_x(res, yd, st.a1);
            } else {
                let dw = xd * yd;
                let dm = xdmin * yd;
                if (mode == 1u) {
                    var s1 = 0;
                    var s2 = 0;
                    for (var s = 0u; s < 8u; s++) {
                        s1 += isum[s];
                        s2 += imin[s];
                    }
                    st.a1 = fma_x(f32(s1), dw, st.a1);
                    st.am = fma_x(f32(s2), dm, st.am);
                } else {
                    for (var sb = 0u; sb < 4u; sb++) {
                        st.a1 = fma_x(f32(isum[2u * sb] + isum[2u * sb + 1u]), dw, st.a1);
                        st.am = fma_x(f32(imin[2u * sb] + imin[2u * sb + 1u]), dm, st.am);
                    }
                }
            }
        }
    } else if (mode == 4u) {
        // Q6_K vec_dot: lanes of (q - 32 + 32)·q8 with the scale of their 16-half, less
        // 32 · bsums · scales per lane.
        let d = yd * xd;
        var sumi = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
        for (var gi = 0u; gi < 8u; gi++) {
            for (var l = 0u; l < 8u; l++) {
                let sc = kbyte_i(k0 + 2u, 2u * gi + select(0u, 1u, l >= 4u));
                let a = xq[ao + 8u * gi + l];
                let s = dot4I8Packed(codes[wo + 8u * gi + l], a) + 32 * dot4I8Packed(0x01010101u, a);
                sumi[l] += sc * s;
            }
        }
        for (var l = 0u; l < 8u; l++) {
            let sub = (bsum(x0, 2u * l) * kbyte_i(k0 + 2u, 2u * l)
                + bsum(x0, 2u * l + 1u) * kbyte_i(k0 + 2u, 2u * l + 1u)) << 5u;
            st.acc[l] = fma_x(d, f32(sumi[l] - sub), st.acc[l]);
        }
    } else {
        // Q6_K tiled: Σ over 16-element sub-blocks of scale · Σ (q - 32)·q8, wrapping.
        var s1 = 0;
        for (var s = 0u; s < 16u; s++) {
            s1 += dot16(wo + 4u * s, ao + 4u * s) * kbyte_i(k0 + 2u, s);
        }
        st.a1 = fma_x(f32(s1) * xd, yd, st.a1);
    }
    return st;
}

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
    let nsb = p.k / 256u;
    var sts: array<KState, 4>;
    for (var b = 0u; b < nsb; b++) {
        for (var c = 0u; c < tc; c++) {
            sts[c] = block(sts[c], modes[m0 + c], n, m0 + c, b);
        }
    }
    for (var c = 0u; c < tc; c++) {
        let m = m0 + c;
        let mode = modes[m];
        let st = sts[c];
        var r: f32;
        if (mode == 0u || mode == 4u) {
            r = ((st.acc[4] + st.acc[0]) + (st.acc[6] + st.acc[2])) + ((st.acc[5] + st.acc[1]) + (st.acc[7] + st.acc[3]));
            if (mode == 0u) {
                r = r + ((st.accm[0] + st.accm[2]) + (st.accm[1] + st.accm[3]));
            }
        } else if (mode == 3u || mode == 5u) {
            r = st.a1;
        } else {
            r = st.a1 - st.am;
        }
        out[m * p.out_rows + p.row0 + n] = r;
    }
}
