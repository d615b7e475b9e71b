//! attention: each sequence's cache rows `0..n_kv` (through its block table when the cache is
//! paged) are gathered into one packed K/V buffer, `[row][kv head][d]` (by the host from a
//! host cache, by `gather_words` from a device one), and the kernel (metal's
//! `attention.wgsl`, cuda's `attention.cu`) runs one workgroup per query and head over them.

use crate::host::{self, bytes};
use crate::{Ctx, Device, Error, Launch};
use abi::{DType, OpParams, TensorDesc};

/// What each query reads: its position, first gathered row and row count, and how the
/// reference pads and orders its sequence's sums (the kernel's `Query`).
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Query {
    pos: i32,
    base: u32,
    n_kv: u32,
    /// `n_kv` padded as the reference pads it: up to a multiple of 256, at most the rows the
    /// sequence can address (`KV_PAD`).
    n_eff: u32,
    /// The reference's tile orders (ggml's tinyBLAS) for the scores and for the output.
    kq_tile: u32,
    kqv_tile: u32,
    unused: [u32; 2],
}

/// One sequence of the call: its queries, rows and block-table column.
struct Seq {
    first: usize,
    count: usize,
    n_kv: usize,
}

/// # Safety
/// A validated attention call on valid host memory.
pub unsafe fn run<D: Device>(
    ctx: &Ctx<D>,
    ins: &[TensorDesc],
    out: &TensorDesc,
    p: &OpParams,
) -> Result<(), Error> {
    let gpu = ctx.dev;
    let (q, k, v, pos) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let (d, hq, t) = (q.ne[0] as usize, q.ne[1] as usize, q.ne[2] as usize);
    let hkv = k.ne[1] as usize;
    let a = abi::AttentionAttrs::from_params(p);
    let (n_kv, window, page) = (a.n_kv as usize, a.window, a.page_rows as usize);
    let f16 = k.dtype() == Some(DType::F16);
    if v.dtype != k.dtype {
        return Err(Error::Unsupported(
            "attention: k and v caches of different formats".into(),
        ));
    }
    let positions = host::i32s(&ctx.host_bytes(pos)?);
    let table = match ins.get(4) {
        Some(b) => Some((host::i32s(&ctx.host_bytes(b)?), b.ne[0] as usize)),
        None => None,
    };
    let on_device = k.buffer != 0 || v.buffer != 0;
    if on_device && (k.buffer == 0 || v.buffer == 0 || k.nb != v.nb) {
        return Err(Error::Unsupported(
            "attention: k and v caches in different memories or layouts".into(),
        ));
    }
    let seqs: Vec<Seq> = match ins.get(5) {
        Some(s) => host::i32s(&ctx.host_bytes(s)?)
            .chunks_exact(3)
            .map(|c| Seq {
                first: c[0].max(0) as usize,
                count: c[1].max(0) as usize,
                n_kv: c[2].max(0) as usize,
            })
            .collect(),
        None => vec![Seq {
            first: 0,
            count: t,
            n_kv,
        }],
    };
    // Each sequence's rows, gathered; each query's view of them.
    let es = if f16 { 2 } else { 4 };
    let rows_total: usize = seqs.iter().map(|s| s.n_kv).sum();
    let per_row = hkv * d * es;
    let mut kb = Vec::with_capacity(if on_device { 0 } else { rows_total * per_row });
    let mut vb = Vec::with_capacity(kb.capacity());
    // From a device cache: the byte offset of each (row, head) in the cache tensor.
    let mut starts: Vec<u64> = Vec::new();
    let mut queries = vec![Query::default(); t];
    // The rows a sequence can address: its table column's pages, or the whole cache.
    let addressable = match &table {
        Some((_, pages)) => (*pages * page) as i64,
        None => k.ne[2],
    };
    let mut base = 0usize;
    for (si, s) in seqs.iter().enumerate() {
        if s.first + s.count > t || s.n_kv > n_kv {
            return Err(Error::Invalid(format!(
                "attention: sequence {si} (queries {}+{}, n_kv {}) outside the call's {t} \
                 queries and n_kv {n_kv}",
                s.first, s.count, s.n_kv
            )));
        }
        for j in 0..s.n_kv {
            let row = match &table {
                Some((bt, pages)) => {
                    let pg = bt[si * pages + j / page];
                    let r = pg as i64 * page as i64 + (j % page) as i64;
                    if pg < 0 || r >= k.ne[2] {
                        return Err(Error::Invalid(format!(
                            "attention: block_table[{}, {si}] = {pg} outside the cache's {} rows",
                            j / page,
                            k.ne[2]
                        )));
                    }
                    r
                }
                None => j as i64,
            };
            if on_device {
                starts.extend((0..hkv).map(|h| (h as i64 * k.nb[1] + row * k.nb[2]) as u64));
                continue;
            }
            for (src, dst) in [(k, &mut kb), (v, &mut vb)] {
                for h in 0..hkv {
                    let at = src
                        .data
                        .offset((h as i64 * src.nb[1] + row * src.nb[2]) as isize);
                    if src.nb[0] as usize == es {
                        dst.extend_from_slice(core::slice::from_raw_parts(at, d * es));
                    } else {
                        for e in 0..d {
                            let x = at.offset(e as isize * src.nb[0] as isize);
                            dst.extend_from_slice(core::slice::from_raw_parts(x, es));
                        }
                    }
                }
            }
        }
        let pad = numerics::KV_PAD;
        let n_eff = ((s.n_kv as i64 + pad - 1) / pad * pad)
            .min(addressable)
            .max(s.n_kv as i64) as u32;
        for qi in s.first..s.first + s.count {
            queries[qi] = Query {
                pos: positions[qi],
                base: base as u32,
                n_kv: s.n_kv as u32,
                n_eff,
                kq_tile: (f16 && s.count >= 2 && d % 16 == 0 && n_eff % 4 == 0) as u32,
                kqv_tile: (s.count >= 2 && n_eff % 16 == 0 && d % 4 == 0) as u32,
                unused: [0; 2],
            };
        }
        base += s.n_kv;
    }
    // K then V in one buffer; V starts on a whole word.
    let kvb = if on_device {
        gather_device(ctx, k, v, &starts, d * es)?
    } else {
        if kb.len() % 4 != 0 {
            kb.resize(kb.len() + 2, 0);
        }
        let v_off = kb.len() / es;
        kb.extend_from_slice(&vb);
        (gpu.upload("k and v rows", &kb)?, v_off)
    };
    let (kvb, v_off) = kvb;
    // Scores per (query, head): the padded rows the reference's softmax runs over.
    let stride = queries
        .iter()
        .map(|q| (q.n_kv.div_ceil(16) * 16).min(q.n_eff).max(q.n_eff.min(16)))
        .max()
        .unwrap_or(0)
        .max(1) as usize;
    let meta = [
        d as u32,
        hq as u32,
        hkv as u32,
        t as u32,
        stride as u32,
        f16 as u32,
        window.max(0) as u32,
        v_off as u32,
        a.scale.to_bits(),
        a.softcap.to_bits(),
    ];
    let qb = ctx.input(q, "q")?;
    let qsb = gpu.upload("queries", bytes(&queries))?;
    let sb = gpu.empty("scores", (t * hq * stride * 4) as u64)?;
    let size = (d * hq * t * 4) as u64;
    let ob = gpu.empty("output", size)?;
    let launch = Launch {
        kernel: "attention",
        meta: meta.to_vec(),
        bufs: vec![&qb, &kvb, &qsb, &sb, &ob],
        groups: (t * hq) as u32,
    };
    ctx.deliver(&[launch], &ob, out, |_| {})
}

/// The rows at byte offsets `starts` (`chunk` bytes each, every head of every row read) of
/// device caches `k` and `v`, packed into one new buffer, K then V: the buffer and V's first
/// element.
fn gather_device<D: Device>(
    ctx: &Ctx<D>,
    k: &TensorDesc,
    v: &TensorDesc,
    starts: &[u64],
    chunk: usize,
) -> Result<(D::Buf, usize), Error> {
    if chunk % 4 != 0 || k.nb[0] as usize * k.ne[0] as usize != chunk {
        return Err(Error::Unsupported(format!(
            "attention: device cache rows of {chunk} bytes are not whole packed words"
        )));
    }
    let (kp, vp) = (ctx.place(k)?, ctx.place(v)?);
    let per_chunk = (chunk / 4) as u32;
    let n = starts.len() as u32 * per_chunk;
    let es = k.nb[0] as usize;
    let out = ctx.dev.empty("k and v rows", (2 * n as u64).max(1) * 4)?;
    let word_starts = |p: &crate::mem::Place<D::Buf>| -> Vec<u32> {
        starts.iter().map(|&s| ((p.off + s) / 4) as u32).collect()
    };
    let (ks, vs) = (word_starts(&kp), word_starts(&vp));
    let ksb = ctx.dev.upload("k rows", bytes(&ks))?;
    let vsb = ctx.dev.upload("v rows", bytes(&vs))?;
    let launches = [
        Launch {
            kernel: "gather_words",
            meta: vec![n, per_chunk, 0],
            bufs: vec![&ksb, &kp.buf, &out],
            groups: n.div_ceil(64),
        },
        Launch {
            kernel: "gather_words",
            meta: vec![n, per_chunk, n],
            bufs: vec![&vsb, &vp.buf, &out],
            groups: n.div_ceil(64),
        },
    ];
    ctx.dev.enqueue(&launches)?;
    Ok((out, n as usize * 4 / es))
}
