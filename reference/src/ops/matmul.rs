//! mat_mul: `out[n, m] = dot(w[:, n], x[:, m])` with ggml's activation conversion.
//!
//! Activations are converted ONCE per call (each column to the weight's `vec_dot_type`), then
//! tasks take blocks of weight rows; inside a task each weight row meets every column while it
//! is hot in cache.
//!
//! F32 / F16 weights reproduce ggml's choice of kernel: llamafile's tinyBLAS (one 16-lane FMA
//! accumulator per output, [`numerics::dot_tile`]) when the activation matrix has >= 2
//! columns, `K % 16 == 0` and `N % 4 == 0` (for F32 also only when x is contiguous), otherwise
//! `ggml_vec_dot_f32` / `ggml_vec_dot_f16`. F16 weights see activations rounded to f16.
//! Other formats go through `quant::quantize_activations` + `quant::vec_dot`.

use crate::tensor::{block_row, split_row, widen_row, Error, Result};
use abi::{DType, HostApi, TensorDesc};
use backend_kit::par::{parallel_for_shared as parallel_for, SyncPtr};
use numerics::{dot_tile, dot_vec_f16, dot_vec_f32, round_f16};

/// Weight rows per task.
pub const ROWS_PER_TASK: usize = 32;

pub fn check_formats(inputs: &[TensorDesc]) -> Result<()> {
    let w = &inputs[0];
    let dt = w.dtype().expect("validated");
    if w.ne[0] > 1 && w.nb[0] != dt.info().block_bytes as i64 {
        return Err(Error::Unsupported(format!(
            "mat_mul: weight rows of {dt} must be packed"
        )));
    }
    Ok(())
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &abi::OpParams,
) -> Result<()> {
    let (w, x, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = w.dtype().expect("validated");
    let k = w.ne[0] as usize;
    let n = w.ne[1] as usize;
    let cols = x.nrows() as usize;
    if n == 0 || cols == 0 {
        return Ok(());
    }
    // mat_mul's chain_cols: the columns as separate calls of `chain` columns (0: one call).
    let chain = abi::MatMulAttrs::from_params(p).chain();
    let group = if chain == 0 { x.ne[1] } else { chain as i64 };
    let col_index: Vec<(i64, i64, i64)> = (0..cols as i64).map(|c| split_row(x, c)).collect();
    let out_ptr = SyncPtr(out.data);
    let out_desc = *out;
    let write = move |row: usize, c: usize, v: f32| {
        let (i1, i2, i3) = col_index[c];
        let off = row as i64 * out_desc.nb[0]
            + i1 * out_desc.nb[1]
            + i2 * out_desc.nb[2]
            + i3 * out_desc.nb[3];
        // SAFETY: each (row, column) is written by exactly one task.
        unsafe { (out_ptr.0.wrapping_offset(off as isize) as *mut f32).write(v) };
    };
    let n_tasks = n.div_ceil(ROWS_PER_TASK) as u32;

    if matches!(dt, DType::F32 | DType::F16) {
        // Activations as f32 (rounded through f16 for F16 weights), column-major.
        let mut act = vec![0f32; cols * k];
        for c in 0..cols {
            let (i1, i2, i3) = split_row(x, c as i64);
            let col = crate::tensor::row_f32(x, i1, i2, i3);
            for (d, &s) in act[c * k..(c + 1) * k].iter_mut().zip(col.iter()) {
                *d = if dt == DType::F16 { round_f16(s) } else { s };
            }
        }
        let tile =
            group >= 2 && k % 16 == 0 && n % 4 == 0 && (dt == DType::F16 || x.is_contiguous());
        let dot: fn(&[f32], &[f32]) -> f32 = match (tile, dt) {
            (true, _) => dot_tile,
            (false, DType::F32) => dot_vec_f32,
            _ => dot_vec_f16,
        };
        parallel_for(host, n_tasks, |t| {
            let mut wrow = vec![0f32; k];
            let r0 = t as usize * ROWS_PER_TASK;
            for r in r0..(r0 + ROWS_PER_TASK).min(n) {
                widen_row(dt, block_row(w, r as i64, 0, 0), &mut wrow);
                for c in 0..cols {
                    write(r, c, dot(&wrow, &act[c * k..(c + 1) * k]));
                }
            }
        });
        return Ok(());
    }

    let vdt = quant::vec_dot_type(dt);
    let rb = vdt.row_bytes(k as u64).ok_or_else(|| {
        Error::Invalid(format!(
            "mat_mul: {k} is not a whole number of {vdt} blocks"
        ))
    })? as usize;
    let mut act = vec![0u8; cols * rb];
    let qerr = std::sync::Mutex::new(None);
    {
        let act_ptr = SyncPtr(act.as_mut_ptr());
        let (ct, per) = crate::tensor::tasks(cols, cols.div_ceil(host.n_threads.max(1) as usize));
        parallel_for(host, ct, |t| {
            let mut col = vec![0f32; k];
            for c in t as usize * per..((t as usize + 1) * per).min(cols) {
                let (i1, i2, i3) = split_row(x, c as i64);
                for (d, &s) in col
                    .iter_mut()
                    .zip(crate::tensor::row_f32(x, i1, i2, i3).iter())
                {
                    *d = s;
                }
                // SAFETY: column c owns bytes c*rb..(c+1)*rb.
                let dst = unsafe { core::slice::from_raw_parts_mut(act_ptr.0.add(c * rb), rb) };
                let kernel = quant::matmul_kernel_in(dt, k, n, cols, c, chain);
                if let Err(e) = quant::quantize_activations_for(kernel, dt, &col, dst) {
                    qerr.lock()
                        .unwrap()
                        .get_or_insert(Error::Unsupported(format!("mat_mul: {e}")));
                }
            }
        });
    }
    if let Some(e) = qerr.into_inner().unwrap() {
        return Err(e);
    }
    // ggml picks a kernel (and with it a float summation order) per column; see quant::Kernel.
    let kernels: Vec<quant::Kernel> = (0..cols)
        .map(|c| quant::matmul_kernel_in(dt, k, n, cols, c, chain))
        .collect();
    parallel_for(host, n_tasks, |t| {
        let r0 = t as usize * ROWS_PER_TASK;
        for r in r0..(r0 + ROWS_PER_TASK).min(n) {
            let wrow = block_row(w, r as i64, 0, 0);
            for (c, &kernel) in kernels.iter().enumerate() {
                write(
                    r,
                    c,
                    quant::dot_with(kernel, dt, k, wrow, &act[c * rb..(c + 1) * rb]),
                );
            }
        }
    });
    Ok(())
}
