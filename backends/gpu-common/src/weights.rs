//! Weights on the device. Every quantized format the kernels take is decoded on the host into
//! one layout: i8 codes in element order (four to a word) and, per group of G elements, a
//! (scale, offset) pair of f32 such that an element is `scale * code + offset`, the same
//! products the reference's dequantization forms (`d * q`, `d * q + m`, `d * sc * q - dmin *
//! m`). F32, F16 and BF16 weights are held as f32. 4-bit codes take a byte each on the device
//! (twice the file's bytes): simple for every format, not yet the fastest a GPU could do.
//! A weight larger than one storage binding is split into chunks of whole rows.

use crate::host::bytes;
use crate::{Device, Error};
use abi::DType;
use quant::{bf16_to_f32, fp16_to_f32, scale_min_k4};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// i8 codes with one (scale, offset) per `group` elements.
    Grouped { group: usize },
    /// f32 values.
    Dense,
}

/// How a format is held on the device; `None`: not taken by this backend.
pub fn layout(dt: DType) -> Option<Layout> {
    use DType::*;
    Some(match dt {
        F32 | F16 | BF16 => Layout::Dense,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | W4G32 => Layout::Grouped { group: 32 },
        Q6_K => Layout::Grouped { group: 16 },
        W8PC => Layout::Grouped { group: 64 },
        W4G128 => Layout::Grouped { group: 128 },
        _ => return None,
    })
}

fn layout_of(dt: DType) -> Result<Layout, Error> {
    layout(dt).ok_or_else(|| {
        Error::Unsupported(format!("{dt} weights are not taken by the GPU backends"))
    })
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Decodes whole rows of `dt` (`src`: the rows' bytes, `k` elements each) into codes and
/// (scale, offset) pairs, appending to `codes` and `scales`.
pub fn decode_grouped(dt: DType, src: &[u8], codes: &mut Vec<i8>, scales: &mut Vec<[f32; 2]>) {
    use DType::*;
    let bb = dt.info().block_bytes as usize;
    for b in src.chunks_exact(bb) {
        match dt {
            Q4_0 | W4G32 | W4G128 => {
                let half = bb - 2;
                let d = f16_at(b, 0);
                let q = &b[2..];
                codes.extend((0..half).map(|j| (q[j] & 0xF) as i8 - 8));
                codes.extend((0..half).map(|j| (q[j] >> 4) as i8 - 8));
                let groups = 2 * half / layout_group(dt);
                scales.extend((0..groups).map(|_| [d, 0.0]));
            }
            Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let q = &b[4..20];
                codes.extend(q.iter().map(|&x| (x & 0xF) as i8));
                codes.extend(q.iter().map(|&x| (x >> 4) as i8));
                scales.push([d, m]);
            }
            Q5_0 | Q5_1 => {
                let d = f16_at(b, 0);
                let (m, o) = if dt == Q5_1 {
                    (f16_at(b, 2), 4)
                } else {
                    (0.0, 2)
                };
                let qh = u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
                let q = &b[o + 4..o + 20];
                let bias = if dt == Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    codes.push(((q[j] & 0xF) | (((qh >> j) & 1) << 4) as u8) as i8 - bias);
                }
                for j in 0..16 {
                    codes.push(((q[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8) as i8 - bias);
                }
                scales.push([d, m]);
            }
            Q8_0 => {
                codes.extend(b[2..34].iter().map(|&x| x as i8));
                scales.push([f16_at(b, 0), 0.0]);
            }
            W8PC => {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap());
                codes.extend(b[4..68].iter().map(|&x| x as i8));
                scales.push([d, 0.0]);
            }
            Q4_K | Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = scale_min_k4(b[4..16].try_into().unwrap());
                let (qh, ql) = if dt == Q5_K {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for j in 0..4 {
                    for (s, shift) in [(2 * j, 0), (2 * j + 1, 4)] {
                        for l in 0..32 {
                            let mut c = (ql[32 * j + l] >> shift) & 0xF;
                            if dt == Q5_K && qh[l] & (1 << s) != 0 {
                                c += 16;
                            }
                            codes.push(c as i8);
                        }
                        scales.push([d * sc[s] as f32, -(dmin * m[s] as f32)]);
                    }
                }
            }
            Q6_K => {
                let (ql, qh) = (&b[0..128], &b[128..192]);
                let sc = &b[192..208];
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                    let mut part = [[0i8; 32]; 4];
                    for l in 0..32 {
                        let h = qh[l];
                        part[0][l] = ((ql[l] & 0xF) | (h & 3) << 4) as i8 - 32;
                        part[1][l] = ((ql[l + 32] & 0xF) | ((h >> 2) & 3) << 4) as i8 - 32;
                        part[2][l] = ((ql[l] >> 4) | ((h >> 4) & 3) << 4) as i8 - 32;
                        part[3][l] = ((ql[l + 32] >> 4) | ((h >> 6) & 3) << 4) as i8 - 32;
                    }
                    for (c, p) in part.iter().enumerate() {
                        codes.extend_from_slice(p);
                        for is in 0..2 {
                            scales.push([d * (sc[is + 2 * c] as i8) as f32, 0.0]);
                        }
                    }
                }
            }
            _ => unreachable!("{dt} has no grouped layout"),
        }
    }
}

fn layout_group(dt: DType) -> usize {
    match layout(dt) {
        Some(Layout::Grouped { group }) => group,
        _ => 1,
    }
}

/// Decodes whole rows of F32, F16 or BF16 into f32.
pub fn decode_dense(dt: DType, src: &[u8], out: &mut Vec<f32>) {
    match dt {
        DType::F32 => out.extend(
            src.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap())),
        ),
        DType::F16 => out.extend(src.chunks_exact(2).map(|b| f16_at(b, 0))),
        DType::BF16 => out.extend(
            src.chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        ),
        _ => unreachable!("{dt} is not dense"),
    }
}

/// Rows `row0 .. row0 + rows` of a weight, on the device.
pub struct Chunk<B> {
    pub row0: u32,
    pub rows: u32,
    /// Codes (grouped) or f32 values (dense).
    pub values: B,
    /// (scale, offset) pairs; `None` for dense weights.
    pub scales: Option<B>,
    /// Q4_K / Q6_K: each 256-element super block's own numbers, for the kernels that sum in
    /// the reference's order ([`k_scales`]).
    pub kscales: Option<B>,
}

/// The integers a K-quant super block's dot products use, which the (scale, offset) pairs fold
/// into floats: Q4_K `[d, dmin, sc 0..4, sc 4..8, m 0..4, m 4..8, 0, 0]`, Q6_K
/// `[d, 0, scales 0..4, 4..8, 8..12, 12..16, 0, 0]` (d and dmin as f32 bits; 6-bit scales and
/// mins as bytes, Q6_K's i8 scales as bytes, four to a word); nothing for other formats.
pub fn k_scales(dt: DType, src: &[u8], out: &mut Vec<u32>) {
    let bb = dt.info().block_bytes as usize;
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    for b in src.chunks_exact(bb) {
        match dt {
            DType::Q4_K => {
                let (sc, m) = scale_min_k4(b[4..16].try_into().unwrap());
                out.extend([f16_at(b, 0).to_bits(), f16_at(b, 2).to_bits()]);
                out.extend([
                    word(&sc[..4]),
                    word(&sc[4..]),
                    word(&m[..4]),
                    word(&m[4..]),
                    0,
                    0,
                ]);
            }
            DType::Q6_K => {
                out.extend([f16_at(b, 208).to_bits(), 0]);
                out.extend(b[192..208].chunks_exact(4).map(word));
                out.extend([0, 0]);
            }
            _ => return,
        }
    }
}

/// A weight `[k, n]` held on the device.
pub struct DevWeight<B> {
    pub k: usize,
    pub n: usize,
    pub layout: Layout,
    pub chunks: Vec<Chunk<B>>,
}

impl<B> DevWeight<B> {
    /// Uploads `n` rows of `k` elements of `dt`, `row(i)` giving row `i`'s bytes.
    pub fn upload<'a, D: Device<Buf = B>>(
        gpu: &D,
        dt: DType,
        k: usize,
        n: usize,
        row: impl Fn(usize) -> &'a [u8],
    ) -> Result<DevWeight<B>, Error> {
        let lay = layout_of(dt)?;
        let row_bytes = match lay {
            Layout::Grouped { .. } => k as u64,
            Layout::Dense => 4 * k as u64,
        };
        let per_chunk = (gpu.max_binding() / row_bytes.max(1)).min(n as u64) as usize;
        if per_chunk == 0 && n > 0 {
            return Err(Error::Unsupported(format!(
                "one row of {k} elements exceeds the device's storage binding"
            )));
        }
        Self::upload_chunked(gpu, dt, k, n, per_chunk, row)
    }

    /// [`DevWeight::upload`] in chunks of at most `per_chunk` rows.
    pub fn upload_chunked<'a, D: Device<Buf = B>>(
        gpu: &D,
        dt: DType,
        k: usize,
        n: usize,
        per_chunk: usize,
        row: impl Fn(usize) -> &'a [u8],
    ) -> Result<DevWeight<B>, Error> {
        let lay = layout_of(dt)?;
        let per_chunk = per_chunk.max(1);
        let mut chunks = Vec::new();
        let mut r0 = 0;
        while r0 < n {
            let rows = per_chunk.min(n - r0);
            let mut kscales = None;
            let (values, scales) = match lay {
                Layout::Grouped { group } => {
                    let mut codes = Vec::with_capacity(rows * k);
                    let mut sc = Vec::with_capacity(rows * k / group);
                    let mut ks = Vec::new();
                    for r in r0..r0 + rows {
                        decode_grouped(dt, row(r), &mut codes, &mut sc);
                        k_scales(dt, row(r), &mut ks);
                    }
                    let s = gpu.upload("weight scales", bytes(&sc))?;
                    if matches!(dt, DType::Q4_K | DType::Q6_K) {
                        kscales = Some(gpu.upload("weight super-block scales", bytes(&ks))?);
                    }
                    (gpu.upload("weight codes", bytes(&codes))?, Some(s))
                }
                Layout::Dense => {
                    let mut v = Vec::with_capacity(rows * k);
                    for r in r0..r0 + rows {
                        decode_dense(dt, row(r), &mut v);
                    }
                    (gpu.upload("weight", bytes(&v))?, None)
                }
            };
            chunks.push(Chunk {
                row0: r0 as u32,
                rows: rows as u32,
                values,
                scales,
                kscales,
            });
            r0 += rows;
        }
        Ok(DevWeight {
            k,
            n,
            layout: lay,
            chunks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grouped decoding equals the reference dequantization, element for element, for
    /// every format it takes (random blocks through `quant`'s quantizers).
    #[test]
    fn grouped_codes_decode_to_the_reference_values() {
        let k = 512;
        let src: Vec<f32> = (0..k)
            .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
            .collect();
        for &dt in abi::WEIGHT_DTYPES {
            let Some(lay) = layout(dt) else { continue };
            let mut bytes = vec![0u8; quant::row_bytes(dt, k).unwrap()];
            quant::quantize_row(dt, &src, &mut bytes).unwrap();
            let mut want = vec![0f32; k];
            quant::dequantize_row(dt, &bytes, &mut want).unwrap();
            let got: Vec<f32> = match lay {
                Layout::Dense => {
                    let mut v = Vec::new();
                    decode_dense(dt, &bytes, &mut v);
                    v
                }
                Layout::Grouped { group } => {
                    let (mut c, mut s) = (Vec::new(), Vec::new());
                    decode_grouped(dt, &bytes, &mut c, &mut s);
                    assert_eq!((c.len(), s.len()), (k, k / group), "{dt}");
                    c.iter()
                        .enumerate()
                        .map(|(i, &q)| q as f32 * s[i / group][0] + s[i / group][1])
                        .collect()
                }
            };
            for i in 0..k {
                assert!(
                    (got[i] - want[i]).abs() <= 1e-6 * want[i].abs().max(1.0),
                    "{dt} element {i}: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }
}
