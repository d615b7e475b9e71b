// Causal attention in the reference's order (ggml's non-flash path on x86, reference
// `ops::attention`), so that the device gives the reference's bits: one workgroup per (query,
// head).
// - Scores: `dot(k_j, q)` in ggml's lanes (`ggml_vec_dot_f32`: 4 x 16 accumulators over
//   64-element steps, then the leftovers; f16 caches: q rounded to f16 and tinyBLAS's 16 lanes
//   or `ggml_vec_dot_f16`), soft-capped, scaled; rows not visible are -inf. Each query's
//   row count is padded as the reference pads it (`len`, `n_eff`).
// - Softmax: ggml's exp polynomial (`v_expf`) on whole 16-blocks, each block's sum in
//   `_mm512_reduce_add_ps` order, the blocks summed in `wide` (f64 where the device has it:
//   the reference's sum) by one invocation.
// - Output: per dimension, `lanes` (16 or 64) accumulators taking rows in turn, reduced as
//   ggml reduces them, then the rows past the last whole 64 in order.
// The host gathers each query's rows: query t reads rows base .. base + n_kv of `kv` (K
// first, V at v_off), laid out [row][kv head][d], f32 or f16 bits.

struct Meta {
    d: u32,
    hq: u32,
    hkv: u32,
    t: u32,
    stride: u32, // the scores' stride per (query, head)
    f16: u32,
    window: u32,
    v_off: u32,
    scale: f32,
    softcap: f32,
}

struct Query {
    pos: i32,
    base: u32,
    n_kv: u32,
    n_eff: u32,   // n_kv padded as the reference pads it
    kq_tile: u32, // tinyBLAS's order for the scores (f16 caches)
    kqv_tile: u32,
    unused0: u32,
    unused1: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kv: array<u32>;
@group(0) @binding(3) var<storage, read> qs: array<Query>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> shared_max: f32;
var<workgroup> shared_inv: f32;

fn load(idx: u32) -> f32 {
    if (p.f16 != 0u) {
        let w = kv[idx / 2u];
        return f16_value((w >> (16u * (idx & 1u))) & 0xffffu);
    }
    return bitcast<f32>(kv[idx]);
}

fn query(q0: u32, e: u32) -> f32 {
    let v = q[q0 + e];
    return select(v, round_f16(v), p.f16 != 0u);
}

fn score(k0: u32, q0: u32, kq_tile: bool) -> f32 {
    var acc: array<f32, 64>;
    if (kq_tile) {
        for (var e = 0u; e < p.d; e++) {
            acc[e % 16u] = fma_x(load(k0 + e), query(q0, e), acc[e % 16u]);
        }
        return reduce16(&acc, 0u);
    }
    let np = p.d & ~63u;
    for (var e = 0u; e < np; e++) {
        acc[e % 64u] = fma_x(load(k0 + e), query(q0, e), acc[e % 64u]);
    }
    let s = reduce4x16(&acc);
    if (p.f16 == 0u) {
        var r = s;
        for (var e = np; e < p.d; e++) {
            r = fma_x(load(k0 + e), query(q0, e), r);
        }
        return r;
    }
    var w = wide(s);
    for (var e = np; e < p.d; e++) {
        w += wide(load(k0 + e) * query(q0, e));
    }
    return f32(w);
}

fn round_up(v: u32, m: u32) -> u32 {
    return (v + m - 1u) / m * m;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    fma_init(nw);
    let id = wg_index(wg, nw);
    if (id >= p.t * p.hq) {
        return;
    }
    let t = id / p.hq;
    let h = id % p.hq;
    let hk = h / (p.hq / p.hkv);
    let qi = qs[t];
    let q0 = id * p.d;
    let s0 = id * p.stride;
    // The last row that may be visible, +1 (0: none).
    let end = u32(clamp(qi.pos + 1, 0, i32(qi.n_kv)));
    var len = min(qi.n_eff, 16u);
    if (end > 0u) {
        len = min(round_up(end, 16u), qi.n_eff);
    }
    let ninf = bitcast<f32>(0xff800000u);

    for (var j = li; j < len; j += 64u) {
        var s = ninf;
        let visible = j < end && (p.window == 0u || u32(qi.pos) - j < p.window);
        if (visible) {
            s = score(((qi.base + j) * p.hkv + hk) * p.d, q0, qi.kq_tile != 0u);
            if (p.softcap > 0.0) {
                s = (tanh(s * (1.0 / p.softcap)) * p.softcap) * p.scale;
            } else {
                s = s * p.scale;
            }
        }
        scores[s0 + j] = s;
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        // ggml's MAX(a, b) = a > b ? a : b, in row order.
        var m = ninf;
        for (var j = 0u; j < len; j++) {
            let x = scores[s0 + j];
            m = select(x, m, m > x);
        }
        shared_max = m;
    }
    workgroupBarrier();
    let mx = shared_max;
    let full = len & ~15u;
    for (var j = li; j < len; j += 64u) {
        let x = scores[s0 + j] - mx;
        scores[s0 + j] = select(exp(x), v_expf(x), j < full);
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        var sum = wide(0.0);
        var blk: array<f32, 64>;
        for (var b = 0u; b < full; b += 16u) {
            for (var l = 0u; l < 16u; l++) {
                blk[l] = scores[s0 + b + l];
            }
            sum += wide(reduce16(&blk, 0u));
        }
        for (var j = full; j < len; j++) {
            sum += wide(scores[s0 + j]);
        }
        shared_inv = f32(wide(1.0) / sum);
    }
    workgroupBarrier();
    let inv = shared_inv;
    for (var j = li; j < len; j += 64u) {
        let x = scores[s0 + j] * inv;
        scores[s0 + j] = select(x, round_f16(x), p.f16 != 0u);
    }
    storageBarrier();
    workgroupBarrier();

    let lanes = select(64u, 16u, qi.kqv_tile != 0u);
    let np = select(qi.n_eff & ~63u, qi.n_eff, qi.kqv_tile != 0u);
    var span = 0u;
    if (end > 0u) {
        span = min(round_up(end, lanes), qi.n_eff);
    }
    let simd_end = min(min(span, np), len);
    for (var e = li; e < p.d; e += 64u) {
        var acc: array<f32, 64>;
        for (var j = 0u; j < simd_end; j++) {
            let pj = scores[s0 + j];
            if (pj == 0.0) {
                continue;
            }
            let v = load(p.v_off + ((qi.base + j) * p.hkv + hk) * p.d + e);
            acc[j % lanes] = fma_x(v, pj, acc[j % lanes]);
        }
        var r: f32;
        if (qi.kqv_tile != 0u) {
            r = reduce16(&acc, 0u);
        } else {
            r = reduce4x16(&acc);
        }
        if (qi.kqv_tile == 0u && np < qi.n_eff && span > np) {
            var w = wide(r);
            for (var j = np; j < qi.n_kv; j++) {
                var pj = 0.0;
                if (j < len) {
                    pj = scores[s0 + j];
                }
                let v = load(p.v_off + ((qi.base + j) * p.hkv + hk) * p.d + e);
                if (p.f16 != 0u) {
                    w += wide(v * pj);
                } else {
                    r = fma_x(v, pj, r);
                }
            }
            if (p.f16 != 0u) {
                r = f32(w);
            }
        }
        out[q0 + e] = r;
    }
}
