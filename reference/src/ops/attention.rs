//! attention: ggml's non-flash path (`kq = mul_mat(k, q)`, optional soft-cap,
//! `soft_max_ext` with the causal/window mask, `kqv = mul_mat(v^T, kq)`).
//!
//! llama.cpp pads the number of cache rows it attends over to a multiple of
//! [`KV_PAD`] (`llama_kv_cache::get_n_kv`), the padding masked. Padding changes which SIMD
//! block or lane each row falls in, so the kernels here run over the padded length, with the
//! padded rows treated as masked and zero (their memory is never read). Masked rows contribute
//! exact zeros (`exp(-inf) = 0`, `fma(0, v, acc) = acc`), so work stops after the last visible
//! row of each query, rounded up to whole blocks/lanes: bit-identical, and causal-cheap.

use crate::tensor::{read_i32, row_ptr, widen_row, Error, Result};
use abi::{DType, HostApi, OpParams, TensorDesc};
use backend_kit::par::{parallel_for_shared as parallel_for, SyncPtr};
use numerics::{dot_tile, dot_vec_f16, dot_vec_f32, ggml_max, reduce16, round_f16, soft_max_f32};

pub use numerics::KV_PAD;

/// Reads cache row `(h, j)` (D elements) as f32.
unsafe fn cache_row(t: &TensorDesc, h: i64, j: i64, dst: &mut [f32]) {
    let p = row_ptr(t, h, j, 0);
    let dt = t.dtype().expect("validated");
    if dt == DType::F32 && t.nb[0] != 4 {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = (p.wrapping_offset(i as isize * t.nb[0] as isize) as *const f32).read();
        }
    } else {
        let bytes = dt.row_bytes(t.ne[0] as u64).unwrap() as usize;
        widen_row(dt, core::slice::from_raw_parts(p, bytes), dst);
    }
}

fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    if inputs.len() > 5 {
        // Several sequences (ABI 1.4): by definition, each as its own call.
        for c in abi::attention_seqs(inputs, &outputs[0], p).map_err(Error::Invalid)? {
            run(host, c.inputs(), &[c.out], &c.params)?;
        }
        return Ok(());
    }
    let (q, k, v, pos, out) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &outputs[0]);
    let (d, hq, nt) = (q.ne[0], q.ne[1], q.ne[2]);
    let hkv = k.ne[1];
    let a = abi::AttentionAttrs::from_params(p);
    let rows = abi::PagedRows::new(inputs.get(4), a.page_rows, k.ne[2]).map_err(Error::Invalid)?;
    let c = rows.len;
    let n_kv = a.n_kv;
    let window = a.window;
    let (scale, softcap) = (a.scale, a.softcap);
    let k_f16 = k.dtype() == Some(DType::F16);
    let v_f16 = v.dtype() == Some(DType::F16);
    // The length ggml's kernels see.
    let n_eff = round_up(n_kv, KV_PAD).min(c).max(n_kv);
    let group = hq / hkv;
    let positions: Vec<i64> = (0..nt).map(|t| read_i32(pos, t) as i64).collect();
    // Kernel choice, as ggml_compute_forward_mul_mat decides it (see matmul.rs).
    let kq_tile = k_f16 && nt >= 2 && d % 16 == 0 && n_eff % 4 == 0;
    let kqv_tile = nt >= 2 && n_eff % 16 == 0 && d % 4 == 0;
    let out_ptr = SyncPtr(out.data);
    let out_desc = *out;
    let q_desc = *q;
    let du = d as usize;

    parallel_for(host, (hq * nt) as u32, |task| {
        let (h, t) = (task as i64 % hq, task as i64 / hq);
        let hk = h / group;
        let pt = positions[t as usize];
        let visible = |j: i64| j <= pt && (window == 0 || pt - j < window);
        let last = (n_kv - 1).min(pt); // last possibly visible row
        let mut qv = crate::tensor::read_row(&q_desc, h, t, 0);
        if k_f16 {
            for x in qv.iter_mut() {
                *x = round_f16(*x);
            }
        }
        // Scores over the rows that can matter, rounded up to whole 16-blocks.
        let len = if last < 0 {
            n_eff.min(16)
        } else {
            round_up(last + 1, 16).min(n_eff)
        } as usize;
        let mut w = vec![f32::NEG_INFINITY; len];
        let mut krow = vec![0f32; du];
        for j in 0..=last {
            if !visible(j) {
                continue;
            }
            cache_row(k, hk, rows.get(j), &mut krow);
            let s = if !k_f16 {
                dot_vec_f32(&krow, &qv)
            } else if kq_tile {
                dot_tile(&krow, &qv)
            } else {
                dot_vec_f16(&krow, &qv)
            };
            let s = if softcap > 0.0 {
                // llama.cpp: scale(kq, 1/softcap) -> tanh -> scale(kq, softcap), and only
                // then soft_max_ext applies kq_scale.
                ((s * (1.0 / softcap)).tanh() * softcap) * scale
            } else {
                s * scale
            };
            w[j as usize] = s;
        }
        // soft_max_ext over the padded row: the masked tail contributes exp(-inf) = 0.
        let max = w.iter().fold(f32::NEG_INFINITY, |m, &x| ggml_max(m, x));
        let src = w.clone();
        let sum = soft_max_f32(&src, &mut w, max);
        let inv = (1.0 / sum) as f32;
        for x in w.iter_mut() {
            *x *= inv;
            if v_f16 {
                *x = round_f16(*x);
            }
        }
        // kqv: out[i] = dot over rows j of v[j][i] * p[j], lane-wise as the chosen kernel.
        let lanes: usize = if kqv_tile { 16 } else { 64 };
        let np = if kqv_tile {
            n_eff as usize
        } else {
            n_eff as usize & !63
        };
        let span = if last < 0 {
            0
        } else {
            (round_up(last + 1, lanes as i64) as usize).min(n_eff as usize)
        };
        let simd_end = span.min(np);
        let mut acc = vec![0f32; du * lanes];
        let mut vrow = vec![0f32; du];
        for j in 0..simd_end.min(len) {
            let pj = w[j];
            if pj == 0.0 {
                continue; // fma(0, v, acc) == acc for finite v
            }
            cache_row(v, hk, rows.get(j as i64), &mut vrow);
            let lane = j % lanes;
            for i in 0..du {
                let a = &mut acc[i * lanes + lane];
                *a = vrow[i].mul_add(pj, *a);
            }
        }
        let mut res = vec![0f32; du];
        for i in 0..du {
            let a = &acc[i * lanes..(i + 1) * lanes];
            res[i] = if kqv_tile {
                reduce16(a.try_into().unwrap())
            } else {
                let mut g = [[0f32; 16]; 4];
                for (gi, chunk) in g.iter_mut().zip(a.chunks_exact(16)) {
                    gi.copy_from_slice(chunk);
                }
                for l in 0..16 {
                    g[0][l] += g[2][l];
                    g[1][l] += g[3][l];
                }
                for l in 0..16 {
                    g[0][l] += g[1][l];
                }
                reduce16(&g[0])
            };
        }
        // ggml_vec_dot leftovers (rows past the last 64-step): f32 FMA (f32 V) or f64 (f16 V).
        if !kqv_tile && (np as i64) < n_eff && span > np {
            let mut tail64 = res.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            for j in np..(n_eff as usize) {
                let pj = if j < len { w[j] } else { 0.0 };
                if j as i64 >= n_kv {
                    // Padding: v treated as zero.
                    continue;
                }
                cache_row(v, hk, rows.get(j as i64), &mut vrow);
                for i in 0..du {
                    if v_f16 {
                        tail64[i] += (vrow[i] * pj) as f64;
                    } else {
                        res[i] = vrow[i].mul_add(pj, res[i]);
                    }
                }
            }
            if v_f16 {
                for i in 0..du {
                    res[i] = tail64[i] as f32;
                }
            }
        }
        for (i, &x) in res.iter().enumerate() {
            let off = i as i64 * out_desc.nb[0] + h * out_desc.nb[1] + t * out_desc.nb[2];
            // SAFETY: each (h, t) output row is written by one task only.
            unsafe { (out_ptr.0.wrapping_offset(off as isize) as *mut f32).write(x) };
        }
    });
    Ok(())
}
