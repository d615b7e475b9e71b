//! The memory plan: one arena for every activation of a step, sized for the largest step the
//! runner accepts. Each node's value gets a fixed offset, reused once the value is dead (the
//! last node reading it has run), so a step of any size up to the maximum runs in the same
//! memory with no allocation. Views (`reshape`) share their source's slot and extend its life.

use super::program::{Kind, Program, Src};

/// Every slot starts on a cache line (and an AVX-512 vector).
pub const ALIGN: usize = 64;

#[derive(Clone, Debug)]
pub struct Plan {
    /// Per node: byte offset of its value in the arena (a view: its source's).
    pub offset: Vec<usize>,
    /// Per node: the node whose slot holds its value (itself, or a view's source).
    pub base: Vec<usize>,
    pub arena_bytes: usize,
    pub max_t: usize,
    pub max_o: usize,
}

/// Returns `[off, off + size)` to the sorted free list, merging neighbours.
fn release(free: &mut Vec<(usize, usize)>, off: usize, size: usize) {
    let k = free.partition_point(|&(o, _)| o < off);
    free.insert(k, (off, size));
    if k + 1 < free.len() && free[k].0 + free[k].1 == free[k + 1].0 {
        free[k].1 += free[k + 1].1;
        free.remove(k + 1);
    }
    if k > 0 && free[k - 1].0 + free[k - 1].1 == free[k].0 {
        free[k - 1].1 += free[k].1;
        free.remove(k);
    }
}

impl Plan {
    pub fn new(p: &Program, max_t: usize, max_o: usize) -> Plan {
        let n = p.nodes.len();
        let mut base: Vec<usize> = (0..n).collect();
        for (i, node) in p.nodes.iter().enumerate() {
            if let (Kind::Reshape, Some(Src::Node(j))) = (node.kind, node.inputs.first()) {
                base[i] = base[*j];
            }
        }
        // Last node reading each slot; the output lives to the end.
        let mut last: Vec<usize> = (0..n).collect();
        for (i, node) in p.nodes.iter().enumerate() {
            last[base[i]] = last[base[i]].max(i);
            for s in &node.inputs {
                if let Src::Node(j) = s {
                    last[base[*j]] = last[base[*j]].max(i);
                }
            }
        }
        last[base[p.output]] = usize::MAX;

        let mut free: Vec<(usize, usize)> = Vec::new();
        let mut top = 0usize;
        let mut offset = vec![0usize; n];
        let mut size = vec![0usize; n];
        for (i, node) in p.nodes.iter().enumerate() {
            if base[i] != i {
                offset[i] = offset[base[i]];
            } else {
                let s = super::dim::eval_shape(&node.shape, max_t as i64, max_o as i64);
                let elems = s.iter().product::<i64>().max(0) as usize;
                let bytes = (elems * node.dtype.info().block_bytes as usize)
                    .next_multiple_of(ALIGN)
                    .max(ALIGN);
                // Best fit among the free ranges, else the top of the arena.
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|(_, &(_, sz))| sz >= bytes)
                    .min_by_key(|(_, &(_, sz))| sz)
                    .map(|(k, _)| k);
                offset[i] = match best {
                    Some(k) => {
                        let (off, sz) = free[k];
                        if sz == bytes {
                            free.remove(k);
                        } else {
                            free[k] = (off + bytes, sz - bytes);
                        }
                        off
                    }
                    None => {
                        top += bytes;
                        top - bytes
                    }
                };
                size[i] = bytes;
            }
            // Only after the output has its slot (an op never writes over its own inputs).
            let mut dead: Vec<usize> = node
                .inputs
                .iter()
                .filter_map(|s| match s {
                    Src::Node(j) => Some(base[*j]),
                    _ => None,
                })
                .chain(std::iter::once(base[i]))
                .filter(|&b| last[b] == i)
                .collect();
            dead.sort_unstable();
            dead.dedup();
            for b in dead {
                release(&mut free, offset[b], size[b]);
            }
        }
        Plan {
            offset,
            base,
            arena_bytes: top.max(ALIGN),
            max_t,
            max_o,
        }
    }
}
