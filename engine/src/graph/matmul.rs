//! How a step's columns are grouped into matmul calls (batch invariance): a sequence's prompt
//! chunk is a call of its own, the single tokens of decoding sequences share one call in
//! which every column takes the one-column kernel chain. The executor ([`super::run`]) and
//! the MoE layers ([`super::moe`]) both call through here.

use crate::error::Result;
use crate::exec::Exec;
use abi::{OpParams, TensorDesc};

/// A run of columns computed by one matmul call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColGroup {
    pub start: usize,
    pub len: usize,
    /// 0: the call's own column count picks the chain; 1: every column the one-column chain.
    pub chain: i64,
}

/// Groups `lens` (consecutive segments of columns) for matmul calls: every segment of one
/// column joins a shared one-column-chain call when segments of one are adjacent; longer
/// segments get a call each.
pub(crate) fn col_groups(lens: impl Iterator<Item = usize>, out: &mut Vec<ColGroup>) {
    out.clear();
    let mut start = 0;
    for len in lens {
        if len == 0 {
            continue;
        }
        match out.last_mut() {
            Some(g) if len == 1 && g.chain == 1 && g.start + g.len == start => g.len += 1,
            _ => out.push(ColGroup {
                start,
                len,
                chain: if len == 1 { 1 } else { 0 },
            }),
        }
        start += len;
    }
}

/// A matmul whose columns run in `groups` (see [`col_groups`]); `None`: one call.
pub(crate) fn matmul_grouped(
    ex: &Exec,
    w: &crate::tensor::Weight,
    x: TensorDesc,
    out: TensorDesc,
    params: OpParams,
    groups: Option<&[ColGroup]>,
) -> Result<()> {
    let Some(groups) = groups.filter(|g| g.len() > 1 || g.first().is_some_and(|g| g.chain != 0))
    else {
        return ex.matmul_desc(w, x, out, params);
    };
    for g in groups {
        let view = |d: &TensorDesc| {
            let mut v = *d;
            v.data = d.data.wrapping_add(g.start * d.nb[1] as usize);
            v.ne[1] = g.len as i64;
            for i in 2..4 {
                v.nb[i] = v.nb[i - 1] * v.ne[i - 1];
            }
            v
        };
        let mut a = abi::MatMulAttrs::from_params(&params);
        a.chain_cols = if g.len == 1 { 0 } else { g.chain };
        ex.matmul_desc(w, view(&x), view(&out), a.to_params())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_tokens_share_a_call_and_chunks_get_their_own() {
        let mut g = Vec::new();
        col_groups([1, 1, 5, 1, 0, 1, 3].into_iter(), &mut g);
        let want = [
            ColGroup {
                start: 0,
                len: 2,
                chain: 1,
            },
            ColGroup {
                start: 2,
                len: 5,
                chain: 0,
            },
            ColGroup {
                start: 7,
                len: 2,
                chain: 1,
            },
            ColGroup {
                start: 9,
                len: 3,
                chain: 0,
            },
        ];
        assert_eq!(g, want);
    }
}
