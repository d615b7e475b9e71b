//! Seeded random cases for every op, over shapes that include edge sizes: one row, odd head
//! counts, a single block, many blocks, GQA ratios, windows shorter than the sequence; and
//! fixed cases ([`fixed_case`]) at the sizes production calls have, which small random shapes
//! never reach: attention over real KV caches (padded to 256 rows), so that the kernels' main
//! loops run and not only their tails. [`cases`] is what the gate checks: both.

use abi::{
    DType, Op, OpParams, TensorDesc, GLU_GELU_TANH, GLU_SILU, ROPE_NEOX, ROPE_NORMAL, WEIGHT_DTYPES,
};

/// A tensor that owns its bytes.
#[derive(Clone, Debug)]
pub struct Owned {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

impl Owned {
    pub fn zeros(dtype: DType, shape: &[i64]) -> Owned {
        let n: i64 = shape[1..].iter().product();
        let bytes = dtype.row_bytes(shape[0] as u64).expect("whole blocks") as usize * n as usize;
        Owned {
            dtype,
            shape: shape.to_vec(),
            data: vec![0; bytes],
        }
    }

    pub fn f32(shape: &[i64], v: &[f32]) -> Owned {
        Owned {
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    pub fn i32(v: &[i32]) -> Owned {
        Owned {
            dtype: DType::I32,
            shape: vec![v.len() as i64],
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Rows of `f32` values stored as `dtype` (quantized with the reference quantizer).
    pub fn quantized(dtype: DType, shape: &[i64], v: &[f32]) -> Owned {
        if dtype == DType::F32 {
            return Owned::f32(shape, v);
        }
        let mut t = Owned::zeros(dtype, shape);
        let k = shape[0] as usize;
        let rb = t.data.len() / (v.len() / k);
        for (row, dst) in v.chunks(k).zip(t.data.chunks_mut(rb)) {
            quant::quantize_row(dtype, row, dst).expect("quantizable");
        }
        t
    }

    pub fn desc(&mut self) -> TensorDesc {
        TensorDesc::contiguous(self.data.as_mut_ptr(), self.dtype, &self.shape)
    }

    pub fn as_f32(&self) -> Vec<f32> {
        self.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

/// One invocation: inputs, outputs (zeroed or, for in-place ops, pre-filled) and attributes.
#[derive(Clone, Debug)]
pub struct Case {
    pub op: Op,
    pub label: String,
    pub inputs: Vec<Owned>,
    pub outputs: Vec<Owned>,
    pub params: OpParams,
}

/// Small deterministic generator (splitmix64), so a failing case is named by its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    /// Roughly normal, scaled.
    pub fn normal(&mut self, scale: f32) -> f32 {
        let s: f32 = (0..4)
            .map(|_| (self.u64() >> 40) as f32 / (1u64 << 24) as f32)
            .sum();
        (s - 2.0) * 1.7 * scale
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal(scale)).collect()
    }
}

/// The operand whose format names a case: the weight or table, the KV cache (attention), the
/// destination (set_rows), else the first input.
pub fn format(c: &Case) -> DType {
    match c.op {
        Op::Attention => c.inputs[1].dtype,
        Op::SetRows => c.inputs[2].dtype,
        _ => c.inputs[0].dtype,
    }
}

/// Every case the gate checks for `op`: seeds `0..n_seeds` of [`case`], then the fixed cases
/// ([`fixed_case`]), each with its name in failure messages (`seed N`, `fixed case N`).
pub fn cases(op: Op, n_seeds: u64) -> impl Iterator<Item = (String, Case)> {
    let seeded = (0..n_seeds).map(move |seed| (format!("seed {seed}"), case(op, seed)));
    let fixed = (0..fixed_count(op)).map(move |i| {
        (
            format!("fixed case {i}"),
            fixed_case(op, i).expect("below fixed_count"),
        )
    });
    seeded.chain(fixed)
}

/// `(head dim, q heads, kv heads, cache rows C, query tokens T, n_kv, window, softcap, cache
/// format)`.
pub type AttentionShape = (i64, i64, i64, i64, i64, i64, i64, f32, DType);

/// Attention over real cache lengths, one row per case:
/// `(head dim, q heads, kv heads, cache rows C, query tokens T, n_kv, window, softcap, cache
/// format)`; query `t` sits at position `n_kv - T + t` (causal, as a prompt chunk or a decode
/// step). The kernels (`reference::ops::attention`, `mollm_cpu_common::ops`) attend over `n_eff
/// = min(round_up(n_kv, 256), C)` rows: scores in 16-row blocks up to the last visible row,
/// `p·V` in 64 lanes per `vec_dot` step for one token (leftover rows past the last whole step
/// with FMA) or 16-lane tiles for several tokens when `n_eff % 16 == 0`; dots over the head
/// in 64-element steps. The comments say which paths each row takes.
#[rustfmt::skip]
pub const ATTENTION_FIXED: &[AttentionShape] = &[
    // C = 256 (one pad block), f32 caches.
    (64, 9, 3, 256, 1, 1, 0, 0.0, DType::F32),      // decode, first token: one 16-block, one lane step
    (64, 8, 2, 256, 1, 200, 0, 0.0, DType::F32),    // decode, GQA 4: 3 full 64-lane steps + a partial one
    (64, 6, 2, 256, 1, 256, 0, 0.0, DType::F32),    // decode, n_kv = C: every 64-lane step full
    (64, 4, 4, 256, 1, 130, 0, 30.0, DType::F32),   // decode with soft-capping
    (64, 9, 3, 256, 16, 16, 0, 0.0, DType::F32),    // prompt from an empty cache: 16-lane p·V tiles, causal
    (256, 4, 1, 256, 3, 256, 0, 0.0, DType::F32),   // prompt ending at n_kv = C, head dim 256, GQA 4
    // C = 512 (two pad blocks).
    (64, 14, 2, 512, 3, 263, 0, 0.0, DType::F32),   // prompt just past the first pad block, GQA 7
    (256, 4, 2, 512, 1, 320, 0, 0.0, DType::F32),   // decode, head dim 256, n_kv a multiple of 64 (n_eff 512)
    (128, 2, 1, 512, 1, 512, 100, 0.0, DType::F32), // decode, n_kv = C, sliding window
    (256, 2, 1, 512, 5, 512, 128, 0.0, DType::F32), // prompt, n_kv = C, sliding window, head dim 256
    (64, 3, 1, 512, 20, 300, 16, 0.0, DType::F32),  // prompt chunk, window shorter than the chunk
    // A cache that is not a multiple of the padding: n_eff = C = 300.
    (64, 3, 3, 300, 1, 290, 0, 0.0, DType::F32),    // decode: 4 lane steps + leftover rows 256..290
    (64, 2, 1, 300, 4, 290, 0, 0.0, DType::F32),    // prompt, n_eff % 16 != 0: 64-lane path + leftovers
    // One query over a longer cache, 3 KV heads.
    (64, 9, 3, 1024, 1, 1000, 0, 0.0, DType::F32),  // decode 1000 deep, n_eff 1024
    // f16 caches (the reference's f16 paths; backends that do not declare them skip these).
    (64, 9, 3, 1024, 1, 700, 0, 0.0, DType::F16),   // decode 700 deep
    (64, 8, 2, 256, 1, 200, 0, 0.0, DType::F16),    // decode: f16 vec_dot
    (256, 2, 1, 512, 3, 300, 0, 0.0, DType::F16),   // prompt: f16 score tiles, 16-lane p·V
    (128, 2, 2, 512, 1, 512, 64, 0.0, DType::F16),  // decode, n_kv = C, sliding window
    (64, 2, 1, 300, 1, 290, 0, 0.0, DType::F16),    // leftover rows summed in f64
];

/// Paged attention (the `block_table` operand, ABI 1.2), after [`ATTENTION_FIXED`]:
/// `(head dim, q heads, kv heads, pool pages, page rows, block table, query tokens T, n_kv,
/// window, cache format)`. The sequence's C is `len(table) * page rows`.
pub type PagedShape = (
    i64,
    i64,
    i64,
    i64,
    i64,
    &'static [i32],
    i64,
    i64,
    i64,
    DType,
);

#[rustfmt::skip]
pub const ATTENTION_PAGED: &[PagedShape] = &[
    (64, 8, 2, 4, 256, &[3, 1], 1, 300, 0, DType::F32),        // decode across two pages, out of order
    (64, 9, 3, 4, 256, &[2, 0, 3], 5, 700, 0, DType::F32),     // prompt chunk in a third page, 16-lane tiles
    (128, 2, 1, 3, 256, &[1, 2], 1, 400, 100, DType::F16),     // f16 decode, sliding window
    (64, 4, 2, 6, 16, &[5, 0, 3, 1], 3, 50, 0, DType::F32),    // small pages: n_eff capped at C = 64
];

/// Several sequences in one attention call (the `seqs` operand, ABI 1.4), after
/// [`ATTENTION_PAGED`]: `(head dim, q heads, kv heads, pool pages, page rows, sequences as
/// (block table, query tokens, n_kv), window, cache format)`. Each sequence's queries sit at
/// positions `n_kv - t .. n_kv`; the tables are padded with page 0 to the longest.
pub type SeqsShape = (
    i64,
    i64,
    i64,
    i64,
    i64,
    &'static [(&'static [i32], i64, i64)],
    i64,
    DType,
);

#[rustfmt::skip]
pub const ATTENTION_SEQS: &[SeqsShape] = &[
    // A decode step of three sequences of different lengths (one spans two pages).
    (64, 9, 3, 6, 256, &[(&[0], 1, 12), (&[3, 1], 1, 300), (&[2], 1, 1)], 0, DType::F32),
    // A prompt chunk between two decoding sequences (16-lane tiles for the chunk only).
    (64, 8, 2, 6, 256, &[(&[1], 1, 40), (&[4, 5], 5, 270), (&[0], 1, 100)], 0, DType::F32),
    // f16 caches, a sliding window.
    (128, 2, 1, 4, 256, &[(&[1, 2], 1, 400), (&[3], 2, 50)], 100, DType::F16),
];

/// Bumped whenever the cases change, so cached gate verdicts of older case sets expire.
pub const CASES_VERSION: u32 = 8;

/// How many fixed cases `op` has.
pub fn fixed_count(op: Op) -> u64 {
    match op {
        Op::Attention => {
            (ATTENTION_FIXED.len() + ATTENTION_PAGED.len() + ATTENTION_SEQS.len()) as u64
        }
        _ => 0,
    }
}

/// Fixed case `i` of `op` (see [`ATTENTION_FIXED`]); `None` past [`fixed_count`].
pub fn fixed_case(op: Op, i: u64) -> Option<Case> {
    match op {
        Op::Attention => {
            let mut r = Rng::new(0xA77E_0000 + i);
            if let Some(&(d, hq, hkv, cache, t, n_kv, window, softcap, kv_dt)) =
                ATTENTION_FIXED.get(i as usize)
            {
                return Some(attention(
                    &mut r, d, hq, hkv, cache, t, n_kv, window, softcap, kv_dt,
                ));
            }
            let i = i as usize - ATTENTION_FIXED.len();
            if i >= ATTENTION_PAGED.len() {
                return Some(attention_seqs(
                    &mut r,
                    ATTENTION_SEQS.get(i - ATTENTION_PAGED.len())?,
                ));
            }
            let &(d, hq, hkv, pages, page, table, t, n_kv, window, kv_dt) = &ATTENTION_PAGED[i];
            let mut c = attention(
                &mut r,
                d,
                hq,
                hkv,
                pages * page,
                t,
                n_kv,
                window,
                0.0,
                kv_dt,
            );
            c.inputs.push(Owned::i32(table));
            let mut a = abi::AttentionAttrs::from_params(&c.params);
            a.page_rows = page;
            c.params = a.to_params();
            c.label = format!("{} paged: {page}-row pages {table:?} of {pages}", c.label);
            Some(c)
        }
        _ => None,
    }
}

/// A case of [`ATTENTION_SEQS`].
pub fn attention_seqs(r: &mut Rng, shape: &SeqsShape) -> Case {
    let &(d, hq, hkv, pages, page, seqs, window, kv_dt) = shape;
    let tt: i64 = seqs.iter().map(|s| s.1).sum();
    let width = seqs.iter().map(|s| s.0.len()).max().unwrap_or(1);
    let mut pos = Vec::new();
    let mut table = vec![0i32; width * seqs.len()];
    let mut info = Vec::new();
    for (s, &(tab, t, n_kv)) in seqs.iter().enumerate() {
        assert!(t <= n_kv && n_kv <= tab.len() as i64 * page);
        info.extend([pos.len() as i32, t as i32, n_kv as i32]);
        pos.extend((n_kv - t..n_kv).map(|p| p as i32));
        table[s * width..s * width + tab.len()].copy_from_slice(tab);
    }
    let p = abi::AttentionAttrs {
        n_kv: seqs.iter().map(|s| s.2).max().unwrap_or(1),
        window,
        page_rows: page,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: 0.0,
    }
    .to_params();
    let rows = pages * page;
    let n = (d * hkv * rows) as usize;
    let i32s = |shape: &[i64], v: &[i32]| Owned {
        shape: shape.to_vec(),
        ..Owned::i32(v)
    };
    Case {
        op: Op::Attention,
        label: format!(
            "d={d} hq={hq} hkv={hkv} {} sequences (table, t, n_kv) {seqs:?} of {pages} \
             {page}-row pages, window={window} {kv_dt}",
            seqs.len()
        ),
        inputs: vec![
            Owned::f32(&[d, hq, tt], &r.vec((d * hq * tt) as usize, 1.0)),
            Owned::quantized(kv_dt, &[d, hkv, rows], &r.vec(n, 1.0)),
            Owned::quantized(kv_dt, &[d, hkv, rows], &r.vec(n, 1.0)),
            Owned::i32(&pos),
            i32s(&[width as i64, seqs.len() as i64], &table),
            i32s(&[3, seqs.len() as i64], &info),
        ],
        outputs: vec![Owned::zeros(DType::F32, &[d, hq, tt])],
        params: p,
    }
}

/// An attention case: queries at positions `n_kv - t .. n_kv`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    r: &mut Rng,
    d: i64,
    hq: i64,
    hkv: i64,
    cache: i64,
    t: i64,
    n_kv: i64,
    window: i64,
    softcap: f32,
    kv_dt: DType,
) -> Case {
    assert!(hq % hkv == 0 && t <= n_kv && n_kv <= cache);
    let pos0 = n_kv - t;
    let pos: Vec<i32> = (0..t).map(|i| (pos0 + i) as i32).collect();
    let p = abi::AttentionAttrs {
        n_kv,
        window,
        page_rows: 0,
        scale: 1.0 / (d as f32).sqrt(),
        softcap,
    }
    .to_params();
    let q = Owned::f32(&[d, hq, t], &r.vec((d * hq * t) as usize, 1.0));
    let n = (d * hkv * cache) as usize;
    let kc = Owned::quantized(kv_dt, &[d, hkv, cache], &r.vec(n, 1.0));
    let vc = Owned::quantized(kv_dt, &[d, hkv, cache], &r.vec(n, 1.0));
    Case {
        op: Op::Attention,
        label: format!(
            "d={d} hq={hq} hkv={hkv} cache={cache} t={t} n_kv={n_kv} window={window} softcap={softcap} {kv_dt}"
        ),
        inputs: vec![q, kc, vc, Owned::i32(&pos)],
        outputs: vec![Owned::zeros(DType::F32, &[d, hq, t])],
        params: p,
    }
}

/// A random case of `op`. Shapes vary with the seed; every few seeds hit an edge size.
pub fn case(op: Op, seed: u64) -> Case {
    let mut r = Rng::new(seed.wrapping_mul(31).wrapping_add(op as u64));
    let mut p = OpParams::default();
    let rows = r.pick(&[1i64, 2, 3, 7, 16]);
    let (inputs, outputs, label) = match op {
        Op::GetRows => {
            let dt = r.pick(WEIGHT_DTYPES);
            let k = dt.info().block_len as i64 * r.pick(&[1, 2, 3]);
            let v = r.pick(&[1i64, 5, 17]);
            let table = Owned::quantized(dt, &[k, v], &r.vec((k * v) as usize, 1.0));
            let ids: Vec<i32> = (0..rows).map(|_| r.below(v as u64) as i32).collect();
            (
                vec![table, Owned::i32(&ids)],
                vec![Owned::zeros(DType::F32, &[k, rows])],
                format!("{dt} k={k} v={v} m={rows}"),
            )
        }
        Op::RmsNorm => {
            let k = r.pick(&[1i64, 8, 64, 576, 1000]);
            p = abi::RmsNormAttrs {
                eps: r.pick(&[1e-5f32, 1e-6]),
            }
            .to_params();
            let x = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 2.0));
            let w = Owned::f32(&[k], &r.vec(k as usize, 1.0));
            (
                vec![x, w],
                vec![Owned::zeros(DType::F32, &[k, rows])],
                format!("k={k} rows={rows}"),
            )
        }
        Op::Rope => {
            let d = r.pick(&[2i64, 64, 128, 256]);
            let h = r.pick(&[1i64, 3, 9]);
            let mode = r.pick(&[ROPE_NORMAL, ROPE_NEOX]);
            let n_dims = if r.below(4) == 0 && d > 2 { d / 2 } else { d };
            let freq_base = r.pick(&[10000.0f32, 1e6]);
            p = abi::RopeAttrs::new(mode, n_dims, freq_base, 4096).to_params();
            let pos: Vec<i32> = (0..rows).map(|_| r.below(5000) as i32).collect();
            let x = Owned::f32(&[d, h, rows], &r.vec((d * h * rows) as usize, 1.0));
            (
                vec![x, Owned::i32(&pos)],
                vec![Owned::zeros(DType::F32, &[d, h, rows])],
                format!("d={d} h={h} t={rows} mode={mode}"),
            )
        }
        Op::MatMul => {
            // Seeds 0..: every format in turn (the first round with 32 rows, a multiple of
            // 16, so that backends that repack whole row groups at load take the case too).
            let nd = WEIGHT_DTYPES.len() as u64;
            let dt = WEIGHT_DTYPES[(seed % nd) as usize];
            let blocks = r.pick(&[1i64, 2, 3, 9]);
            let k = dt.info().block_len as i64 * blocks;
            let n = if seed < nd {
                32
            } else {
                r.pick(&[1i64, 4, 7, 32])
            };
            let w = Owned::quantized(dt, &[k, n], &r.vec((k * n) as usize, 0.5));
            let x = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 1.0));
            (
                vec![w, x],
                vec![Owned::zeros(DType::F32, &[n, rows])],
                format!("{dt} k={k} n={n} m={rows}"),
            )
        }
        Op::Attention => {
            let d = r.pick(&[4i64, 64]);
            let hkv = r.pick(&[1i64, 2, 3]);
            let hq = hkv * r.pick(&[1i64, 3]);
            let cache = r.pick(&[8i64, 40]);
            let kv_dt = r.pick(&[DType::F32, DType::F16]);
            let t = rows.min(cache);
            let pos0 = r.below((cache - t + 1) as u64) as i64;
            let pos: Vec<i32> = (0..t).map(|i| (pos0 + i) as i32).collect();
            let a = abi::AttentionAttrs {
                n_kv: pos0 + t,
                window: r.pick(&[0i64, 0, 3]),
                page_rows: 0,
                scale: 1.0 / (d as f32).sqrt(),
                softcap: 0.0,
            };
            p = a.to_params();
            let q = Owned::f32(&[d, hq, t], &r.vec((d * hq * t) as usize, 1.0));
            let kc = Owned::quantized(
                kv_dt,
                &[d, hkv, cache],
                &r.vec((d * hkv * cache) as usize, 1.0),
            );
            let vc = Owned::quantized(
                kv_dt,
                &[d, hkv, cache],
                &r.vec((d * hkv * cache) as usize, 1.0),
            );
            let label = format!(
                "d={d} hq={hq} hkv={hkv} t={t} n_kv={} window={} {kv_dt}",
                a.n_kv, a.window
            );
            (
                vec![q, kc, vc, Owned::i32(&pos)],
                vec![Owned::zeros(DType::F32, &[d, hq, t])],
                label,
            )
        }
        Op::SetRows => {
            let k = r.pick(&[4i64, 192]);
            let dst_rows = 16i64;
            let dt = r.pick(&[DType::F32, DType::F16]);
            let m = rows.min(dst_rows);
            let mut idx: Vec<i32> = (0..dst_rows as i32).collect();
            for i in (1..idx.len()).rev() {
                idx.swap(i, r.below(i as u64 + 1) as usize);
            }
            idx.truncate(m as usize);
            let src = Owned::f32(&[k, m], &r.vec((k * m) as usize, 1.0));
            let dst = Owned::quantized(dt, &[k, dst_rows], &r.vec((k * dst_rows) as usize, 1.0));
            (
                vec![src, Owned::i32(&idx), dst.clone()],
                vec![dst],
                format!("{dt} k={k} m={m}"),
            )
        }
        Op::Glu => {
            let k = r.pick(&[1i64, 17, 1536]);
            let act = r.pick(&[GLU_SILU, GLU_GELU_TANH]);
            p = abi::GluAttrs { act }.to_params();
            let g = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 3.0));
            let u = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 1.0));
            (
                vec![g, u],
                vec![Owned::zeros(DType::F32, &[k, rows])],
                format!("k={k} act={act}"),
            )
        }
        Op::Norm => {
            // LayerNorm over whole rows (RWKV-7's 768-wide ones among them) and group norm
            // over heads of 64 (its ln_x) or 8; rows with a 16-block tail and shorter than one;
            // values off zero, so the mean matters.
            let k = r.pick(&[1i64, 8, 64, 100, 576, 768, 1000]);
            let group = match (k % 64, k % 8, r.below(2)) {
                (_, _, 0) => 0,
                (0, _, _) => 64,
                (_, 0, _) => 8,
                _ => 0,
            };
            p = abi::NormAttrs {
                eps: r.pick(&[1e-5f32, 64e-5]),
                group,
            }
            .to_params();
            let xv: Vec<f32> = r
                .vec((k * rows) as usize, 2.0)
                .iter()
                .map(|v| v + 1.5)
                .collect();
            let x = Owned::f32(&[k, rows], &xv);
            let w = Owned::f32(&[k], &r.vec(k as usize, 1.0));
            let b = Owned::f32(&[k], &r.vec(k as usize, 0.5));
            (
                vec![x, w, b],
                vec![Owned::zeros(DType::F32, &[k, rows])],
                format!("k={k} group={group} rows={rows}"),
            )
        }
        Op::L2Norm => {
            // RWKV-7's heads of 64 and whole rows; tiny rows that hit the eps clamp.
            let k = r.pick(&[1i64, 5, 64, 100, 768]);
            let tiny = r.below(5) == 0;
            p = abi::L2NormAttrs {
                eps: r.pick(&[1e-12f32, 1e-6]),
            }
            .to_params();
            let amp = if tiny { 1e-9 } else { 2.0 };
            let x = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, amp));
            (
                vec![x],
                vec![Owned::zeros(DType::F32, &[k, rows])],
                format!("k={k} rows={rows} tiny={tiny}"),
            )
        }
        Op::TokenShift => {
            let e = r.pick(&[1i64, 5, 64, 768]);
            let seqs = r.pick(&[1i64, 2, 3]);
            let x = Owned::f32(&[e, rows, seqs], &r.vec((e * rows * seqs) as usize, 2.0));
            let st = Owned::f32(&[e, seqs], &r.vec((e * seqs) as usize, 2.0));
            (
                vec![x, st],
                vec![
                    Owned::zeros(DType::F32, &[e, rows, seqs]),
                    Owned::zeros(DType::F32, &[e, seqs]),
                ],
                format!("e={e} t={rows} seqs={seqs}"),
            )
        }
        Op::Argmax => {
            // Vocabulary-sized rows too: one is split across the threads, several go to the
            // threads whole (a batched decode step's logits).
            let k = r.pick(&[1i64, 5, 64, 333, 40000]);
            let a = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 4.0));
            (
                vec![a],
                vec![Owned::zeros(DType::I32, &[rows])],
                format!("k={k} rows={rows}"),
            )
        }
        Op::SsmConv => {
            // Taps: LFM2's 3 and Qwen3.5's 4 most often, then every split of the sum (fused
            // taps only, 4 + fused, whole 8-groups, 8 + 4 + fused). Channels up to a model's
            // conv width, so that the output rows split across the threads.
            let taps = r.pick(&[3i64, 4, 3, 4, 1, 2, 5, 7, 8, 9, 13]);
            let n = r.pick(&[1i64, 5, 17, 64, 333, 6144]);
            let seqs = r.pick(&[1i64, 2, 3]);
            let w = taps - 1 + rows;
            let sx = Owned::f32(&[w, n, seqs], &r.vec((w * n * seqs) as usize, 1.0));
            let c = Owned::f32(&[taps, n], &r.vec((taps * n) as usize, 0.5));
            (
                vec![sx, c],
                vec![Owned::zeros(DType::F32, &[n, rows, seqs])],
                format!("taps={taps} n={n} t={rows} seqs={seqs}"),
            )
        }
        Op::GatedDeltaNet => {
            // Head sizes: Qwen3.5's 128, 64, and ones whose dots have leftovers of every kind
            // (1 and 5: fused; 40: rounded products in groups of 8; 100: 64 + 32 + 4); q/k
            // heads as many as v's, one, or half (the tiled broadcast); a gate per key
            // sometimes (KDA). Keys and queries of about unit length (the models l2-normalize
            // them), decays <= 1 and betas in (0, 1), so the recurrence stays bounded.
            let n = r.pick(&[128i64, 64, 128, 1, 5, 16, 40, 100]);
            let h = r.pick(&[1i64, 2, 4]);
            let hq = r.pick(&[h, 1, (h / 2).max(1)]);
            let seqs = r.pick(&[1i64, 2, 3]);
            let kda = r.below(4) == 0;
            let unit = 1.0 / (n as f32).sqrt();
            let qk = |r: &mut Rng| {
                Owned::f32(
                    &[n, hq, rows, seqs],
                    &r.vec((n * hq * rows * seqs) as usize, unit),
                )
            };
            let (q, k) = (qk(&mut r), qk(&mut r));
            let v = Owned::f32(
                &[n, h, rows, seqs],
                &r.vec((n * h * rows * seqs) as usize, 1.0),
            );
            let gn = if kda { n } else { 1 };
            let g: Vec<f32> = r
                .vec((gn * h * rows * seqs) as usize, 0.5)
                .iter()
                .map(|x| -x.abs())
                .collect();
            let beta: Vec<f32> = r
                .vec((h * rows * seqs) as usize, 1.0)
                .iter()
                .map(|x| 1.0 / (1.0 + (-x).exp()))
                .collect();
            let state = Owned::f32(&[n, n, h, seqs], &r.vec((n * n * h * seqs) as usize, 0.3));
            (
                vec![
                    q,
                    k,
                    v,
                    Owned::f32(&[gn, h, rows, seqs], &g),
                    Owned::f32(&[1, h, rows, seqs], &beta),
                    state,
                ],
                vec![
                    Owned::zeros(DType::F32, &[n, h, rows, seqs]),
                    Owned::zeros(DType::F32, &[n, n, h, seqs]),
                ],
                format!("n={n} h={h} hq={hq} t={rows} seqs={seqs} kda={kda}"),
            )
        }
        Op::RwkvWkv7 => {
            // Head sizes: RWKV-7's 64, 128, and ones with leftovers past the 64-element steps
            // (1, 5, 16, 100: mollm's definition there). Operands as the model makes them:
            // a = -kk and b = kk * iclr with kk a unit vector per head and token and iclr in
            // (0, 1), decays w in (0.55, 1), keys and receptances of about unit length, so the
            // recurrence stays bounded.
            let n = r.pick(&[64i64, 64, 128, 1, 5, 16, 100]);
            let h = r.pick(&[1i64, 2, 4]);
            let seqs = r.pick(&[1i64, 2, 3]);
            let (len, unit) = ((n * h * rows * seqs) as usize, 1.0 / (n as f32).sqrt());
            let rr = r.vec(len, unit);
            let w: Vec<f32> = r
                .vec(len, 1.0)
                .iter()
                .map(|x| (-0.606531 / (1.0 + (-x).exp())).exp())
                .collect();
            let k = r.vec(len, unit);
            let v = r.vec(len, 1.0);
            let mut kk = r.vec(len, 1.0);
            for row in kk.chunks_mut(n as usize) {
                let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                row.iter_mut().for_each(|x| *x /= norm);
            }
            let a: Vec<f32> = kk.iter().map(|x| -x).collect();
            let b: Vec<f32> = kk
                .iter()
                .zip(r.vec(len, 1.0))
                .map(|(x, g)| x / (1.0 + (-g).exp()))
                .collect();
            let shape = [n, h, rows, seqs];
            let state = Owned::f32(&[n, n, h, seqs], &r.vec((n * n * h * seqs) as usize, 0.3));
            (
                [rr, w, k, v, a, b]
                    .iter()
                    .map(|x| Owned::f32(&shape, x))
                    .chain([state])
                    .collect(),
                vec![
                    Owned::zeros(DType::F32, &shape),
                    Owned::zeros(DType::F32, &[n, n, h, seqs]),
                ],
                format!("n={n} h={h} t={rows} seqs={seqs}"),
            )
        }
        Op::Add | Op::Mul | Op::Scale | Op::Softmax => {
            let k = r.pick(&[1i64, 5, 64, 333]);
            let a = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 4.0));
            let label = format!("k={k} rows={rows}");
            match op {
                Op::Add | Op::Mul => {
                    let b_rows = if r.below(2) == 0 { 1 } else { rows };
                    let b = Owned::f32(&[k, b_rows], &r.vec((k * b_rows) as usize, 1.0));
                    (
                        vec![a, b],
                        vec![Owned::zeros(DType::F32, &[k, rows])],
                        format!("{label} b_rows={b_rows}"),
                    )
                }
                _ => {
                    p = abi::ScaleAttrs {
                        s: r.pick(&[1.0f32, 0.125, 3.0]),
                    }
                    .to_params();
                    (vec![a], vec![Owned::zeros(DType::F32, &[k, rows])], label)
                }
            }
        }
    };
    Case {
        op,
        label,
        inputs,
        outputs,
        params: p,
    }
}
