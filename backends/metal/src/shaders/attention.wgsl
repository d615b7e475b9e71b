// Causal attention, ggml's non-flash order: scores s_j = dot(k_j, q) (q rounded to f16 with
// an f16 cache), soft-capped, scaled; p = softmax(s) over the visible rows (rounded to f16
// with an f16 cache); out = sum_j p_j v_j. One workgroup per (query, head). The host gathers
// each query's visible cache rows: query t reads rows base .. base + n_kv of `kv`
// (K first, V at v_off), laid out [row][kv head][d], f32 or f16 bits.

struct Meta {
    d: u32,
    hq: u32,
    hkv: u32,
    t: u32,
    max_kv: u32, // the scores' stride
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
    unused: u32,
}

@group(0) @binding(0) var<storage, read> p: Meta;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kv: array<u32>;
@group(0) @binding(3) var<storage, read> qs: array<Query>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

fn load(idx: u32) -> f32 {
    if (p.f16 != 0u) {
        let w = kv[idx / 2u];
        return f16_value((w >> (16u * (idx & 1u))) & 0xffffu);
    }
    return bitcast<f32>(kv[idx]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let id = wg_index(wg, nw);
    if (id >= p.t * p.hq) {
        return;
    }
    let t = id / p.hq;
    let h = id % p.hq;
    let hk = h / (p.hq / p.hkv);
    let qi = qs[t];
    let pos = u32(max(qi.pos, 0));
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let hi = min(qi.n_kv, pos + 1u);
    let q0 = id * p.d;
    let s0 = id * p.max_kv;

    var mx = -3.4028235e38;
    for (var j = lo + li; j < hi; j += 64u) {
        let k0 = ((qi.base + j) * p.hkv + hk) * p.d;
        var s = 0.0;
        for (var e = 0u; e < p.d; e++) {
            var qv = q[q0 + e];
            if (p.f16 != 0u) {
                qv = round_f16(qv);
            }
            s += load(k0 + e) * qv;
        }
        if (p.softcap > 0.0) {
            s = p.softcap * tanh(clamp(s / p.softcap, -10.0, 10.0));
        }
        s *= p.scale;
        scores[s0 + j] = s;
        mx = max(mx, s);
    }
    mx = wg_reduce(li, mx, true);

    var sum = 0.0;
    for (var j = lo + li; j < hi; j += 64u) {
        let e = exp(scores[s0 + j] - mx);
        scores[s0 + j] = e;
        sum += e;
    }
    sum = wg_reduce(li, sum, false);
    let inv = select(0.0, 1.0 / sum, sum > 0.0);
    storageBarrier();
    workgroupBarrier();

    for (var e = li; e < p.d; e += 64u) {
        var acc = 0.0;
        for (var j = lo; j < hi; j++) {
            var pj = scores[s0 + j] * inv;
            if (p.f16 != 0u) {
                pj = round_f16(pj);
            }
            acc += pj * load(p.v_off + ((qi.base + j) * p.hkv + hk) * p.d + e);
        }
        out[q0 + e] = acc;
    }
}
