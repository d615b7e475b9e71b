//! `mat_mul` on ARM: the reference's kernel choice and activation conversion
//! (`quant::matmul_kernel`, `quant::quantize_activations_for`), the per-element products by
//! [`crate::simd`]. Only calls whose every column gets a kernel `simd::has_kernel` knows are
//! taken; any other call is left to the next backend.

use crate::IntPath;
use crate::{kquants, repack, simd};
use abi::{DType, HostApi, TensorDesc};
use mollm_cpu_common::par::{parallel_for, SyncPtr};
use mollm_cpu_common::split_row;
use mollm_cpu_common::Error;

/// Weight formats taken: F32/F16 (the reference's float chains, `mollm_cpu_common::fmatmul`)
/// and those with integer kernels in [`simd`] (legacy formats) and [`kquants`].
const FORMATS: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::W4G32,
    DType::W4G128,
    DType::W8PC,
];

/// Weight rows per `parallel_for` task.
pub const ROWS_PER_TASK: usize = 32;

/// Whether this backend computes this (already validated) mat_mul call.
/// `chain`: mat_mul's chain_cols attribute.
pub fn check(inputs: &[TensorDesc], outputs: &[TensorDesc], chain: usize) -> Result<(), Error> {
    let (dt, k, n, cols) = mollm_cpu_common::mat_mul_host_layout(inputs, outputs, FORMATS, "ARM")?;
    if matches!(dt, DType::F32 | DType::F16) || mollm_cpu_common::wmatmul::FORMATS.contains(&dt) {
        // mollm_cpu_common::fmatmul / wmatmul: any shape.
        return Ok(());
    }
    // The kernel depends on the column only through `col < n_cols / 4 * 4`: the first and the
    // last column cover every case.
    for c in [0, cols.saturating_sub(1)] {
        let kernel = quant::matmul_kernel_in(dt, k, n, cols, c, chain);
        if !simd::has_kernel(kernel, dt) && !kquants::has_kernel(kernel, dt) {
            return Err(Error::Unsupported(format!(
                "mat_mul: no ARM {kernel:?} kernel for {dt} ({cols} columns)"
            )));
        }
    }
    Ok(())
}

/// `prepare_weight`: Q4_K weights with `ne[1] % 8 == 0` in [`repack`]'s pair layout.
///
/// # Safety
/// `w` describes valid host memory.
pub unsafe fn prepare(w: &TensorDesc) -> Result<mollm_cpu_common::Prepared, Error> {
    let no = |why: &str| Err(Error::Unsupported(format!("prepare_weight: {why}")));
    let Some(dt) = w.dtype() else {
        return no("unknown format");
    };
    if w.ndim > 2 || w.ne[2] != 1 || w.ne[3] != 1 || w.data.is_null() {
        return no("not a 2-D weight");
    }
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    if !repack::repacks(dt, n) {
        return no("only Q4_K weights with a multiple of 8 rows are repacked");
    }
    let rb = quant::row_bytes(dt, k).ok_or_else(|| Error::Invalid("bad row".into()))?;
    if w.nb[0] != dt.info().block_bytes as i64 || w.nb[1] as usize != rb {
        return no("rows not packed");
    }
    // SAFETY: a valid packed n x rb weight (checked above).
    let src = core::slice::from_raw_parts(w.data as *const u8, n * rb);
    let mut p =
        mollm_cpu_common::Prepared::zeroed(repack::KIND_Q4K_PAIRS, repack::repacked_bytes(k, n));
    repack::repack(src, rb, k, n, p.bytes_mut());
    Ok(p)
}

/// Whether this backend computes this ([`check`]ed) mat_mul on a prepared weight of `kind`.
pub fn check_prepared(kind: u32, inputs: &[TensorDesc]) -> Result<(), Error> {
    let w = &inputs[0];
    match w.dtype() {
        Some(dt) if kind == repack::KIND_Q4K_PAIRS && repack::repacks(dt, w.ne[1] as usize) => {
            Ok(())
        }
        _ => Err(Error::Unsupported(format!(
            "mat_mul: prepared layout {kind} is not this backend's"
        ))),
    }
}

/// # Safety
/// A validated, [`check`]ed call on valid host memory (with `prepared`: `inputs[0].data` is
/// the weight in [`repack`]'s layout, [`check_prepared`]ed); the CPU runs `path`.
pub unsafe fn run(
    path: IntPath,
    host: &HostApi,
    prepared: bool,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    chain: usize,
) -> Result<(), Error> {
    let (w, x, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = w.dtype().expect("validated");
    if matches!(dt, DType::F32 | DType::F16) {
        return mollm_cpu_common::fmatmul::run(host, inputs, outputs, chain, false);
    }
    if mollm_cpu_common::wmatmul::FORMATS.contains(&dt) {
        let frame = mollm_cpu_common::wmatmul::Frame::Portable;
        return mollm_cpu_common::wmatmul::run(frame, host, inputs, outputs);
    }
    let (k, n, cols) = (w.ne[0] as usize, w.ne[1] as usize, x.nrows() as usize);
    if n == 0 || cols == 0 || k == 0 {
        return Ok(());
    }
    let vdt = quant::vec_dot_type(dt);
    let rb = quant::row_bytes(vdt, k).ok_or_else(|| {
        Error::Invalid(format!(
            "mat_mul: {k} is not a whole number of {vdt} blocks"
        ))
    })?;
    let col_index: Vec<(i64, i64, i64)> = (0..cols as i64).map(|c| split_row(&x, c)).collect();

    // Activations: one converted row per column (exact scalar conversion from `quant`).
    let mut act = vec![0u8; cols * rb];
    let mut col = vec![0f32; k];
    for c in 0..cols {
        let (i1, i2, i3) = col_index[c];
        let base = x
            .data
            .wrapping_offset((i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]) as isize);
        for (e, v) in col.iter_mut().enumerate() {
            // SAFETY: element e of a validated f32 row.
            *v = (base.wrapping_offset(e as isize * x.nb[0] as isize) as *const f32)
                .read_unaligned();
        }
        let kernel = quant::matmul_kernel_in(dt, k, n, cols, c, chain);
        quant::quantize_activations_for(kernel, dt, &col, &mut act[c * rb..(c + 1) * rb])
            .map_err(|e| Error::Unsupported(format!("mat_mul: {e}")))?;
    }

    let kernels: Vec<quant::Kernel> = (0..cols)
        .map(|c| quant::matmul_kernel_in(dt, k, n, cols, c, chain))
        .collect();
    let n_tasks = n.div_ceil(ROWS_PER_TASK) as u32;
    let (act, col_index, kernels) = (&act, &col_index, &kernels);
    let (wp, op) = (SyncPtr(w.data), SyncPtr(out.data));
    let w_stride = w.nb[1] as usize;
    let wrb = quant::row_bytes(dt, k).expect("validated");
    let put = |r: usize, c: usize, v: f32| {
        let (i1, i2, i3) = col_index[c];
        let off = r as i64 * out.nb[0] + i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3];
        // SAFETY: each (row, column) is written by exactly one task.
        unsafe { (op.0.wrapping_offset(off as isize) as *mut f32).write_unaligned(v) };
    };
    if prepared {
        // Every column's kernel is a repack chain ([`repack`]): pairs of rows, against two
        // columns when they share a kernel, else one column passed twice.
        let pair_bytes = repack::repacked_bytes(k, 2);
        parallel_for(host, n_tasks, |t| {
            let r0 = t as usize * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(n);
            let mut c = 0;
            while c < cols {
                let two = c + 1 < cols && kernels[c + 1] == kernels[c];
                let c1 = if two { c + 1 } else { c };
                let acts = [&act[c * rb..(c + 1) * rb], &act[c1 * rb..(c1 + 1) * rb]];
                for r in (r0..r1).step_by(2) {
                    // SAFETY: pair r/2 of the prepared weight (n is even).
                    let pw = unsafe {
                        core::slice::from_raw_parts(wp.0.add(r / 2 * pair_bytes), pair_bytes)
                    };
                    // SAFETY: the caller checked that the CPU runs `path`.
                    let v = unsafe { repack::tile(path, kernels[c], pw, acts) };
                    put(r, c, v[0]);
                    put(r + 1, c, v[2]);
                    if two {
                        put(r, c + 1, v[1]);
                        put(r + 1, c + 1, v[3]);
                    }
                }
                c += 1 + two as usize;
            }
        });
        return Ok(());
    }
    let wrow = |r: usize| {
        // SAFETY: row r of the validated weight tensor.
        unsafe { core::slice::from_raw_parts(wp.0.add(r * w_stride), wrb) }
    };
    parallel_for(host, n_tasks, |t| {
        let r0 = t as usize * ROWS_PER_TASK;
        let r1 = (r0 + ROWS_PER_TASK).min(n);
        let one = |r: usize, c: usize| {
            let a = &act[c * rb..(c + 1) * rb];
            // SAFETY: the caller checked that the CPU runs `path`; `check` found a chain for
            // every column's kernel.
            let v = unsafe {
                if simd::has_kernel(kernels[c], dt) {
                    simd::vec_dot(path, dt, wrow(r), a)
                } else {
                    kquants::dot(path, kernels[c], dt, wrow(r), a)
                }
            };
            put(r, c, v);
        };
        let mut c = 0;
        while c < cols {
            let kernel = kernels[c];
            if c + 1 < cols && kernels[c + 1] == kernel && kquants::has_tile(kernel, dt) {
                // Two columns, two rows at a time (SMMLA on arm-i8mm); an odd last row alone.
                let acts = [&act[c * rb..(c + 1) * rb], &act[(c + 1) * rb..(c + 2) * rb]];
                let mut r = r0;
                while r + 1 < r1 {
                    // SAFETY: as above.
                    let v =
                        unsafe { kquants::tile(path, kernel, dt, [wrow(r), wrow(r + 1)], acts) };
                    for (i, v) in v.into_iter().enumerate() {
                        put(r + i / 2, c + i % 2, v);
                    }
                    r += 2;
                }
                if r < r1 {
                    one(r, c);
                    one(r, c + 1);
                }
                c += 2;
            } else {
                for r in r0..r1 {
                    one(r, c);
                }
                c += 1;
            }
        }
    });
    Ok(())
}
