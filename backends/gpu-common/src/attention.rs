//! attention: the host gathers each sequence's cache rows `0..n_kv` (through its block table
//! when the cache is paged) into one packed K/V buffer, `[row][kv head][d]`, and the kernel (metal's
//! `attention.wgsl`, cuda's `attention.cu`) runs one workgroup per query and head over them.

use crate::host::{self, bytes};
use crate::{Device, Error, Launch};
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
    gpu: &D,
    ins: &[TensorDesc],
    out: &TensorDesc,
    p: &OpParams,
) -> Result<(), Error> {
    let (q, k, v, pos) = (&ins[0], &ins[1], &ins[2], &ins[3]);
    let (d, hq, t) = (q.ne[0] as usize, q.ne[1] as usize, q.ne[2] as usize);
    let hkv = k.ne[1] as usize;
    let (n_kv, window, page) = (p.i[0] as usize, p.i[1], p.i[2] as usize);
    let f16 = k.dtype() == Some(DType::F16);
    if v.dtype != k.dtype {
        return Err(Error::Unsupported(
            "attention: k and v caches of different formats".into(),
        ));
    }
    let positions = host::i32s(&host::gather(pos));
    let table = ins
        .get(4)
        .map(|b| (host::i32s(&host::gather(b)), b.ne[0] as usize));
    let seqs: Vec<Seq> = match ins.get(5) {
        Some(s) => host::i32s(&host::gather(s))
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
    let mut kb = Vec::with_capacity(rows_total * per_row);
    let mut vb = Vec::with_capacity(rows_total * per_row);
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
        let pad = reference::ops::attention::KV_PAD;
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
    if kb.len() % 4 != 0 {
        kb.resize(kb.len() + 2, 0);
    }
    let v_off = kb.len() / es;
    kb.extend_from_slice(&vb);
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
        p.f[0].to_bits(),
        p.f[1].to_bits(),
    ];
    let qb = gpu.upload("q", &host::gather(q))?;
    let kvb = gpu.upload("k and v rows", &kb)?;
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
    let r = gpu.run(&[launch], &ob, size)?;
    host::scatter(out, &r);
    Ok(())
}
