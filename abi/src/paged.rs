//! Paged caches: how attention's optional `block_table` maps a sequence's cache rows onto the
//! pool (see the attention schema). Declared here once so every backend maps rows the same way.

use crate::TensorDesc;

/// Where the sequence's cache row `j` lives: itself (no table), or its page's place in the pool.
pub struct PagedRows {
    /// Pool page of each page of the sequence; empty: unpaged.
    table: Vec<i64>,
    page: i64,
    /// Rows the sequence can address (the `C` that attention's padding is capped at).
    pub len: i64,
}

impl PagedRows {
    /// The rows of an attention call over `cache_rows` pool rows: `table` is its optional fifth
    /// input, `page` its `page_rows` attribute. Refuses a table entry outside the pool.
    ///
    /// # Safety
    /// `table`, when given, is a schema-validated 1-D I32 descriptor on valid memory.
    pub unsafe fn new(
        table: Option<&TensorDesc>,
        page: i64,
        cache_rows: i64,
    ) -> Result<PagedRows, String> {
        let Some(t) = table else {
            return Ok(PagedRows {
                table: Vec::new(),
                page: 0,
                len: cache_rows,
            });
        };
        let n_pages = cache_rows / page.max(1);
        let table: Vec<i64> = (0..t.ne[0])
            .map(|i| {
                let p = t.data.wrapping_offset((i * t.nb[0]) as isize) as *const i32;
                p.read_unaligned() as i64
            })
            .collect();
        if let Some((i, &b)) = table
            .iter()
            .enumerate()
            .find(|(_, &b)| b < 0 || b >= n_pages)
        {
            return Err(format!(
                "attention: block_table[{i}] = {b} is outside the pool's {n_pages} pages"
            ));
        }
        Ok(PagedRows {
            len: table.len() as i64 * page,
            table,
            page,
        })
    }

    /// The pool row of the sequence's row `j` (`j < len`).
    #[inline(always)]
    pub fn get(&self, j: i64) -> i64 {
        if self.table.is_empty() {
            j
        } else {
            self.table[(j / self.page) as usize] * self.page + j % self.page
        }
    }
}

/// One sequence of an attention call with the `seqs` operand (ABI 1.4), as the one-sequence
/// call that gives the same results: its five inputs (q, caches, positions, its block-table
/// column), its output rows and its attributes (its own `n_kv`).
#[derive(Clone, Copy)]
pub struct SeqCall {
    inputs: [TensorDesc; 5],
    n_inputs: usize,
    pub out: TensorDesc,
    pub params: crate::OpParams,
}

impl SeqCall {
    /// The one-sequence call's inputs (four or five).
    pub fn inputs(&self) -> &[TensorDesc] {
        &self.inputs[..self.n_inputs]
    }
}

/// The sequences of a schema-validated attention call: one [`SeqCall`] per sequence with
/// `seqs` (its sixth input), the call itself without. Refuses query ranges that are not in
/// order or do not cover the queries, and an `n_kv` outside `1..=` the call's `n_kv` or the
/// rows its table column addresses.
///
/// # Safety
/// A schema-validated attention call on valid memory.
pub unsafe fn attention_seqs(
    inputs: &[TensorDesc],
    out: &TensorDesc,
    params: &crate::OpParams,
) -> Result<Vec<SeqCall>, String> {
    let Some(seqs) = inputs.get(5) else {
        let mut ins = [inputs[0]; 5];
        let n_inputs = inputs.len().min(5);
        ins[..n_inputs].copy_from_slice(&inputs[..n_inputs]);
        return Ok(vec![SeqCall {
            inputs: ins,
            n_inputs,
            out: *out,
            params: *params,
        }]);
    };
    let (q, pos, table) = (inputs[0], inputs[3], inputs[4]);
    let n_seq = seqs.ne[1];
    let at = |r: i64, s: i64| -> i64 {
        let p = seqs
            .data
            .wrapping_offset((r * seqs.nb[0] + s * seqs.nb[1]) as isize)
            as *const i32;
        p.read_unaligned() as i64
    };
    let rows = table.ne[0] * params.i[2];
    let mut calls = Vec::with_capacity(n_seq as usize);
    let mut next = 0i64;
    for s in 0..n_seq {
        let (t0, n, n_kv) = (at(0, s), at(1, s), at(2, s));
        if t0 != next || n < 1 || t0 + n > q.ne[2] {
            return Err(format!(
                "attention: seqs[:, {s}] = ({t0}, {n}, {n_kv}): sequences must take queries \
                 {next}.. in order, at least one each, within the {} queries",
                q.ne[2]
            ));
        }
        if n_kv < 1 || n_kv > params.i[0] || n_kv > rows {
            return Err(format!(
                "attention: seqs[2, {s}] = {n_kv}: n_kv must be in 1..={} (the call's n_kv \
                 and the {rows} rows of a table column)",
                params.i[0].min(rows)
            ));
        }
        next = t0 + n;
        let mut qs = q;
        qs.data = q.data.wrapping_offset((t0 * q.nb[2]) as isize);
        qs.ne[2] = n;
        let mut ps = pos;
        ps.data = pos.data.wrapping_offset((t0 * pos.nb[0]) as isize);
        ps.ne[0] = n;
        let mut ts = table;
        ts.data = table.data.wrapping_offset((s * table.nb[1]) as isize);
        ts.ne[1] = 1;
        let mut os = *out;
        os.data = out.data.wrapping_offset((t0 * out.nb[2]) as isize);
        os.ne[2] = n;
        let mut prm = *params;
        prm.i[0] = n_kv;
        calls.push(SeqCall {
            inputs: [qs, inputs[1], inputs[2], ps, ts],
            n_inputs: 5,
            out: os,
            params: prm,
        });
    }
    if next != q.ne[2] {
        return Err(format!(
            "attention: the sequences take {next} of the {} queries",
            q.ne[2]
        ));
    }
    Ok(calls)
}
