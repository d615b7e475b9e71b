//! `mat_mul` with mollm's W4G32 / W4G128 / W8PC weights (quant/src/mollm.rs): activations
//! quantized per column in the matching groups (Q8_0, or A8G128 for W4G128), exact integer
//! sums per group, and the reference's float chain (eight lanes, group g in lane g % 8, one
//! fma with `dw·da` per group, `hsum_float_8`), so results are bit-identical to
//! `quant::vec_dot`.
//!
//! W4A8 GEMV for decode and GEMM for prompts share one loop: each weight row is dotted with
//! every activation column while it is in L1 (a prompt's columns reuse it). On x86 the dot runs
//! straight from the packed row ([`crate::x86::wmatmul`]); the portable path unpacks the row to
//! i8 codes once and dots plain Rust slices (widening multiply-adds on NEON).

use crate::par::{parallel_for, SyncPtr};
use crate::{split_row, Error};
use abi::{DType, HostApi, TensorDesc};

/// Weight formats taken here.
pub const FORMATS: &[DType] = &[DType::W4G32, DType::W4G128, DType::W8PC];

/// Weight rows per task.
const ROWS_PER_TASK: usize = 64;

/// Which kernel computes the dot products.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Frame {
    /// Unpack each row to i8 codes, then plain Rust (NEON on AArch64 by auto-vectorization).
    Portable,
    /// Straight from the packed rows with AVX2 ([`crate::x86::wmatmul`]); the portable path
    /// on other architectures (the x86 backends also build there, and score 0).
    Avx2,
    /// AVX-512 F/BW/VL/VNNI: vpdpbusd; as `Avx2` off x86.
    Avx512,
}

/// # Safety
/// A validated mat_mul of a [`FORMATS`] weight with packed rows on valid host memory; the CPU
/// runs `frame`.
pub unsafe fn run(
    frame: Frame,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<(), Error> {
    let (w, x, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = w.dtype().expect("validated");
    let (k, n, cols) = (w.ne[0] as usize, w.ne[1] as usize, x.nrows() as usize);
    if n == 0 || cols == 0 || k == 0 {
        return Ok(());
    }
    let acts = Acts::quantize(dt, x)?;
    let Acts {
        ga,
        gpad,
        ref aq,
        ref ad,
        ref asum,
        ref col_index,
    } = acts;
    let groups = k / ga;
    let (wp, op) = (SyncPtr(w.data), SyncPtr(out.data));
    let (w, out) = (*w, *out);
    let wrb = quant::row_bytes(dt, k).expect("validated");
    parallel_for(host, n.div_ceil(ROWS_PER_TASK) as u32, |t| {
        let mut wq = vec![0i8; k];
        let mut wd = vec![0f32; groups];
        let r0 = t as usize * ROWS_PER_TASK;
        for r in r0..(r0 + ROWS_PER_TASK).min(n) {
            // SAFETY: row r of the validated weight.
            let row = unsafe {
                core::slice::from_raw_parts(
                    wp.0.wrapping_offset(r as isize * w.nb[1] as isize),
                    wrb,
                )
            };
            let simd = cfg!(x86) && frame != Frame::Portable;
            if !simd {
                unpack(dt, row, &mut wq, &mut wd);
            }
            // Decode streams the weights once: ask for the rows 16 KiB ahead (into L2).
            #[cfg(x86)]
            if simd {
                let ahead =
                    wp.0.wrapping_offset(r as isize * w.nb[1] as isize)
                        .wrapping_add(16384);
                crate::x86::prefetch::<true>(ahead, wrb);
            }
            let put = |c: usize, v: f32| {
                let (i1, i2, i3) = col_index[c];
                let off = r as i64 * out.nb[0] + i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3];
                // SAFETY: each (row, column) is written by exactly one task.
                unsafe { (op.0.wrapping_offset(off as isize) as *mut f32).write_unaligned(v) };
            };
            let a = |c: usize| &aq[c * k..(c + 1) * k];
            let d = |c: usize| &ad[c * gpad..(c + 1) * gpad];
            // The portable chain takes no sums (it dots the unpacked codes).
            #[cfg_attr(not(x86), allow(unused_variables))]
            let s = |c: usize| &asum[c * gpad..(c + 1) * gpad];
            match frame {
                #[cfg(x86)]
                Frame::Avx2 | Frame::Avx512 => {
                    use crate::x86::wmatmul as x;
                    let isa = if frame == Frame::Avx512 {
                        x::Isa::Avx512
                    } else {
                        x::Isa::Avx2
                    };
                    // Four columns per unpacked row group (prompts), then one at a time.
                    let mut c = 0;
                    while c + 4 <= cols {
                        let cs = [c, c + 1, c + 2, c + 3];
                        // SAFETY: the caller checked that the CPU runs `frame`.
                        let v =
                            unsafe { x::dot::<4>(isa, dt, row, cs.map(a), cs.map(d), cs.map(s)) };
                        for (j, v) in v.into_iter().enumerate() {
                            put(c + j, v);
                        }
                        c += 4;
                    }
                    for c in c..cols {
                        // SAFETY: as above.
                        let [v] = unsafe { x::dot::<1>(isa, dt, row, [a(c)], [d(c)], [s(c)]) };
                        put(c, v);
                    }
                }
                _ => {
                    for c in 0..cols {
                        put(c, dot_body(&wq, &wd, a(c), d(c), ga));
                    }
                }
            }
        }
    });
    Ok(())
}

/// The activation columns of a mollm-format mat_mul, quantized as the weight's format asks
/// (quant's own conversion): codes, per-group scales and per-group code sums.
pub struct Acts {
    /// Activation group length (32 or 128).
    pub ga: usize,
    /// Groups per column, zero-padded to whole chunks of eight (kernels load eight at a time).
    pub gpad: usize,
    /// `cols x k` codes.
    pub aq: Vec<i8>,
    /// `cols x gpad` scales.
    pub ad: Vec<f32>,
    /// `cols x gpad` sums of each group's codes.
    pub asum: Vec<i32>,
    /// Each column's (i1, i2, i3) index.
    pub col_index: Vec<(i64, i64, i64)>,
}

impl Acts {
    /// Zeroed buffers for the columns of `x`, with groups of the activation format `dt`'s
    /// weights take (a SIMD quantizer fills them in).
    pub fn zeroed(dt: DType, x: &TensorDesc) -> Acts {
        let k = x.ne[0] as usize;
        let cols = x.nrows() as usize;
        let ga = quant::vec_dot_type(dt).info().block_len as usize;
        let gpad = (k / ga).div_ceil(8) * 8;
        Acts {
            ga,
            gpad,
            aq: vec![0i8; cols * k],
            ad: vec![0f32; cols * gpad],
            asum: vec![0i32; cols * gpad],
            col_index: (0..cols as i64).map(|c| split_row(x, c)).collect(),
        }
    }

    /// The first element of column `c` of `x`.
    pub fn column(&self, x: &TensorDesc, c: usize) -> *const u8 {
        let (i1, i2, i3) = self.col_index[c];
        x.data
            .wrapping_offset((i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]) as isize)
    }

    /// # Safety
    /// `x` is a validated F32 activation of a mat_mul with a [`FORMATS`] weight of `dt`, on
    /// valid host memory.
    pub unsafe fn quantize(dt: DType, x: &TensorDesc) -> Result<Acts, Error> {
        let mut a = Acts::zeroed(dt, x);
        let (k, ga, gpad) = (x.ne[0] as usize, a.ga, a.gpad);
        let vt = quant::vec_dot_type(dt);
        let rb =
            quant::row_bytes(vt, k).ok_or_else(|| Error::Invalid("mat_mul: bad row".into()))?;
        let mut col = vec![0f32; k];
        let mut conv = vec![0u8; rb];
        for c in 0..a.col_index.len() {
            let base = a.column(x, c);
            for (e, v) in col.iter_mut().enumerate() {
                *v = (base.wrapping_offset(e as isize * x.nb[0] as isize) as *const f32)
                    .read_unaligned();
            }
            quant::quantize_activations(dt, &col, &mut conv)
                .map_err(|e| Error::Unsupported(format!("mat_mul: {e}")))?;
            let bb = vt.info().block_bytes as usize;
            for (g, b) in conv.chunks_exact(bb).enumerate() {
                let (d, q) = if vt == DType::Q8_0 {
                    (
                        quant::fp16_to_f32(u16::from_le_bytes([b[0], b[1]])),
                        &b[2..],
                    )
                } else {
                    (f32::from_le_bytes(b[..4].try_into().unwrap()), &b[4..])
                };
                a.ad[c * gpad + g] = d;
                for (o, &v) in a.aq[c * k + g * ga..c * k + (g + 1) * ga].iter_mut().zip(q) {
                    *o = v as i8;
                }
                a.asum[c * gpad + g] = q.iter().map(|&v| v as i8 as i32).sum();
            }
        }
        Ok(a)
    }
}

/// A weight row as i8 codes and one scale per activation group.
fn unpack(dt: DType, row: &[u8], q: &mut [i8], d: &mut [f32]) {
    match dt {
        DType::W4G32 | DType::W4G128 => {
            let (bl, bb) = (dt.info().block_len as usize, dt.info().block_bytes as usize);
            let half = bl / 2;
            for (g, b) in row.chunks_exact(bb).enumerate() {
                d[g] = quant::fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                let out = &mut q[g * bl..(g + 1) * bl];
                for j in 0..half {
                    out[j] = (b[2 + j] & 0x0F) as i8 - 8;
                    out[j + half] = (b[2 + j] >> 4) as i8 - 8;
                }
            }
        }
        _ => {
            // W8PC: 64-element blocks, two Q8_0 activation groups each.
            for (bi, b) in row.chunks_exact(68).enumerate() {
                let s = f32::from_le_bytes(b[..4].try_into().unwrap());
                d[2 * bi] = s;
                d[2 * bi + 1] = s;
                for (o, &v) in q[64 * bi..64 * bi + 64].iter_mut().zip(&b[4..]) {
                    *o = v as i8;
                }
            }
        }
    }
}

/// The reference's chain (quant::mollm::vec_dot) over unpacked codes.
#[inline(always)]
fn dot_body(wq: &[i8], wd: &[f32], a: &[i8], ad: &[f32], ga: usize) -> f32 {
    let mut lanes = [0f32; 8];
    for (g, (ws, xs)) in wq.chunks_exact(ga).zip(a.chunks_exact(ga)).enumerate() {
        let isum = if ga == 32 {
            idot::<32>(ws, xs)
        } else {
            idot::<128>(ws, xs)
        };
        lanes[g % 8] = (wd[g] * ad[g]).mul_add(isum as f32, lanes[g % 8]);
    }
    let r = [
        lanes[4] + lanes[0],
        lanes[5] + lanes[1],
        lanes[6] + lanes[2],
        lanes[7] + lanes[3],
    ];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Exact integer dot of `N` i8 pairs (i16 products summed in i32).
#[inline(always)]
fn idot<const N: usize>(w: &[i8], a: &[i8]) -> i32 {
    let (w, a): (&[i8; N], &[i8; N]) = (w.try_into().unwrap(), a.try_into().unwrap());
    let mut s = 0i32;
    for i in 0..N {
        s += (w[i] as i16 * a[i] as i16) as i32;
    }
    s
}
