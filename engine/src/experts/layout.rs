//! Where the experts lie: the stacked expert tensors of each layer in the file (GGUF or
//! package), their segments, how slots are laid out for them, and the checks that every
//! range lies inside the file without overlapping another.

use super::*;

/// One stacked expert tensor in the file: expert `e` is `bytes` at `offset + e * stride`, a
/// `[ne[0], ne[1]]` matrix of `dtype`. In a GGUF file the matrices lie back to back (`stride`
/// = `bytes`); a `.mollm` package interleaves gate, up and down, so each steps over all three.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub offset: u64,
    pub stride: u64,
    pub bytes: u64,
    pub dtype: DType,
    pub ne: [i64; 2],
}

/// The routed experts of one MoE layer: gate, up and down.
#[derive(Clone, Debug)]
pub struct LayerExperts {
    /// Names it in errors (the gate tensor's name).
    pub name: String,
    pub parts: [Span; 3],
    pub n_expert: usize,
    /// The router's weight (its index in the program), for next-layer predictions.
    pub router: usize,
}

impl LayerExperts {
    pub(super) fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// What one read per expert fetches, and for each part its segment and its distance from
    /// the segment's start. Parts that repeat with one stride and lie together inside it are
    /// read together: all three in a `.mollm` package, gate and up in a GGUF file's merged
    /// `ffn_gate_up_exps`; a GGUF file's separate stacks are one segment each.
    pub(super) fn segments(&self) -> (Vec<Seg>, [(usize, u64); 3]) {
        let p = &self.parts;
        let mut order = [0, 1, 2];
        order.sort_by_key(|&i| p[i].offset);
        let mut segs: Vec<Seg> = Vec::with_capacity(3);
        let mut part = [(0usize, 0u64); 3];
        for i in order {
            let q = p[i];
            let n = segs.len();
            if let Some(s) = segs.last_mut() {
                let joins = q.stride == s.stride
                    && q.offset >= s.offset + s.len
                    && q.offset + q.bytes - s.offset <= s.stride;
                if joins {
                    part[i] = (n - 1, q.offset - s.offset);
                    s.len = q.offset + q.bytes - s.offset;
                    continue;
                }
            }
            segs.push(Seg {
                offset: q.offset,
                stride: q.stride,
                len: q.bytes,
            });
            part[i] = (n, 0);
        }
        (segs, part)
    }
}

/// Bytes read together for one expert: expert `e`'s are `len` bytes at `offset + e * stride`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Seg {
    pub(super) offset: u64,
    pub(super) stride: u64,
    pub(super) len: u64,
}

/// Where a layer's expert lies in a slot: each segment's region (from the slot's start), and
/// each part's segment and distance into it.
#[derive(Clone, Debug)]
pub(super) struct SlotLayout {
    /// Bytes a slot needs for one of this layer's experts (every region).
    pub(super) bytes: usize,
    pub(super) segs: Vec<Seg>,
    pub(super) region: Vec<usize>,
    /// Each region's bytes.
    pub(super) region_len: Vec<usize>,
    pub(super) part: [(usize, u64); 3],
}

/// The slots a cache of `budget` bytes is cut into, given the bytes one expert of each layer
/// needs (`need`): a size per distinct need, as many slots of each as its layers' share of
/// all layers (every layer runs as many experts a token), the largest size taking what the
/// rounding leaves; as many slots as fit, at least one of the largest. A slot takes an expert
/// of any layer that needs no more. (With one size for all, that of the largest need,
/// Qwen2.5-Coder-1.5B's experts left room unused: 27.6 MB slots for its layers whose down
/// matrix is Q6_K, 24.0 MB needed by the others, half the layers: 7% fewer slots.)
pub(super) fn slot_lengths(need: &[usize], budget: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = need.to_vec();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    if sizes.is_empty() {
        sizes.push(io::ALIGN as usize);
    }
    let layers = need.len().max(1);
    let lens = |n: usize| -> Vec<usize> {
        let mut v = Vec::with_capacity(n);
        for &size in &sizes[1..] {
            let share = need.iter().filter(|&&x| x == size).count();
            v.extend(std::iter::repeat_n(size, n * share / layers));
        }
        let mut out = vec![sizes[0]; n - v.len()];
        out.extend(v);
        out
    };
    // The total grows with n: the most slots that fit, by bisection.
    let (mut lo, mut hi) = (1, (budget / sizes[sizes.len() - 1]).max(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if lens(mid).iter().sum::<usize>() <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lens(lo)
}

/// Room a region leaves past segment `seg` of `l` for repacks larger than the file's layout:
/// 1/32 of each K-quant matrix in it (Q4_K's 16-row groups take 2.8% more); the 32-element
/// formats' layouts keep their size, and their slots stay as small as the file's bytes.
pub(super) fn repack_margin(l: &LayerExperts, part: &[(usize, u64); 3], seg: usize) -> u64 {
    (0..3)
        .filter(|&p| part[p].0 == seg && l.parts[p].dtype.info().block_len == 256)
        .map(|p| (l.parts[p].bytes / 32).next_multiple_of(64))
        .sum()
}

/// The MoE layers of `program` as the cache sees them (the experts' byte ranges in the
/// file), and each MoE node's cache layer by its gate weight's index.
pub fn layers_of(
    program: &crate::graph::Program,
    gguf: &loader::ModelFile,
) -> Result<(Vec<LayerExperts>, HashMap<usize, usize>)> {
    use crate::graph::program::{Kind, Src};
    let mut layers = Vec::new();
    let mut by_gate = HashMap::new();
    for node in &program.nodes {
        if !matches!(node.kind, Kind::Moe { .. }) {
            continue;
        }
        let mut parts = Vec::new();
        let mut n_expert = 0;
        for src in &node.inputs[2..5] {
            let Src::Weight(j) = *src else {
                unreachable!("compile checks moe weights")
            };
            let name = &program.weight_names[j];
            let t = gguf.tensor(name).ok_or_else(|| {
                EngineError::Invalid(format!("expert tensor {name} is not in the file"))
            })?;
            let ne = program.weights[j].ne();
            n_expert = ne[2] as usize;
            parts.push(Span {
                offset: t.offset,
                stride: t.matrix_stride(),
                bytes: t.matrix_bytes(),
                dtype: t.dtype,
                ne: [ne[0], ne[1]],
            });
        }
        if let (Src::Weight(router), Src::Weight(j)) = (node.inputs[1], node.inputs[2]) {
            by_gate.insert(j, layers.len());
            layers.push(LayerExperts {
                name: program.weight_names[j].clone(),
                parts: [parts[0], parts[1], parts[2]],
                n_expert,
                router,
            });
        }
    }
    Ok((layers, by_gate))
}

/// Bytes of all routed experts of `layers`.
pub fn expert_bytes(layers: &[LayerExperts]) -> u64 {
    layers.iter().map(|l| l.bytes() * l.n_expert as u64).sum()
}

/// Why the expert ranges a file declares cannot be read as expert matrices.
#[derive(Debug, thiserror::Error)]
pub enum SpanError {
    #[error("{} part {part}: experts of {bytes} bytes, {stride} apart, for a {ne:?} {dtype} matrix", loader::printable(.layer))]
    Size {
        layer: String,
        part: usize,
        bytes: u64,
        stride: u64,
        ne: [i64; 2],
        dtype: abi::DType,
    },
    #[error("{} part {part}: experts at {offset}..+{n_expert}x{stride} lie past the end of the file ({file_len} bytes)", loader::printable(.layer))]
    PastEnd {
        layer: String,
        part: usize,
        offset: u64,
        n_expert: usize,
        stride: u64,
        file_len: u64,
    },
    #[error("expert ranges overlap: {} ({}..{}) and {} ({}..{})", loader::printable(&.a.2), .a.0, .a.1, loader::printable(&.b.2), .b.0, .b.1)]
    Overlap {
        a: (u64, u64, String),
        b: (u64, u64, String),
    },
}

/// Refuses expert ranges outside a file of `file_len` bytes, overlapping each other, whose
/// size is not their matrix's, or closer together than one matrix.
pub(super) fn check_spans(
    layers: &[LayerExperts],
    file_len: u64,
) -> std::result::Result<(), SpanError> {
    let mut ranges = Vec::new();
    for l in layers {
        for (pi, p) in l.parts.iter().enumerate() {
            let want = p.dtype.row_bytes(p.ne[0] as u64);
            let mat = want.and_then(|r| r.checked_mul(p.ne[1] as u64));
            if mat != Some(p.bytes) || p.stride < p.bytes {
                return Err(SpanError::Size {
                    layer: l.name.clone(),
                    part: pi,
                    bytes: p.bytes,
                    stride: p.stride,
                    ne: p.ne.map(|d| d as i64),
                    dtype: p.dtype,
                });
            }
        }
        // Each segment's experts from the first byte to the last.
        for (si, s) in l.segments().0.iter().enumerate() {
            let end = (l.n_expert as u64)
                .saturating_sub(1)
                .checked_mul(s.stride)
                .and_then(|b| b.checked_add(s.len))
                .and_then(|b| b.checked_add(s.offset));
            match end {
                Some(e) if e <= file_len => ranges.push((s.offset, e, l.name.clone())),
                _ => {
                    return Err(SpanError::PastEnd {
                        layer: l.name.clone(),
                        part: si,
                        offset: s.offset,
                        n_expert: l.n_expert as usize,
                        stride: s.stride,
                        file_len,
                    })
                }
            }
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(SpanError::Overlap {
                a: w[0].clone(),
                b: w[1].clone(),
            });
        }
    }
    Ok(())
}
