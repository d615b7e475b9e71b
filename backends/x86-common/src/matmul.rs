//! `mat_mul` for the x86 backends: the reference's kernel choice and activation conversion
//! (`quant::matmul_kernel`, `quant::quantize_activations_for`), the per-element products by
//! the SIMD twins in [`crate::simd`].

use crate::par::{parallel_for, SyncPtr};
use crate::{Error, Isa};
use abi::{DType, HostApi, TensorDesc};
use mollm_cpu_common::split_row;

/// Weight rows per `parallel_for` task.
pub const ROWS_PER_TASK: usize = 32;

/// Most weight rows per task of a one-column call (fits the per-task output buffer).
pub const MAX_ROWS_PER_GEMV_TASK: usize = ROWS_PER_TASK * COLS_PER_STEP;

/// The weight bytes of the shortest task of a decode-sized call (~2 us of one thread's share
/// of the memory): shorter ones would pay their prefetch ramp and hand-out more often than
/// they save waiting.
const MIN_GEMV_TASK_BYTES: usize = 32 << 10;

/// Activation columns per kernel call inside a task.
pub const COLS_PER_STEP: usize = 32;

/// Floats of a task's output buffer: rows x columns of one kernel call.
const TASK_OUT: usize = 4096;

thread_local! {
    /// Each compute thread's task output buffer ([`TASK_OUT`] floats once first used).
    static TASK_BUF: core::cell::Cell<Vec<f32>> = const { core::cell::Cell::new(Vec::new()) };
    /// A task's Q6_K rows packed for AMX (`q6kamx::pack_rows`), kept per thread.
    static ROWS_BUF: core::cell::Cell<Vec<u8>> = const { core::cell::Cell::new(Vec::new()) };
    /// The calling thread's activation rows and Q5_0 terms, kept between calls: fresh zeroed
    /// vectors per call were a memset (and, when glibc handed back the pages, their first
    /// touch) of up to 2.6 MB a call, ~6% of Qwen2.5-0.5B's prompt time.
    static ACT_BUF: core::cell::Cell<Vec<u8>> = const { core::cell::Cell::new(Vec::new()) };
    static TERMS_BUF: core::cell::Cell<Vec<crate::legacy16::Terms>> =
        const { core::cell::Cell::new(Vec::new()) };
    /// The calling thread's task bounds (rows), kept between calls.
    static BOUNDS_BUF: core::cell::Cell<Vec<usize>> = const { core::cell::Cell::new(Vec::new()) };
}

/// Calls of at most this many columns (and no packed tiles) are decode-sized: one column
/// per sequence of a step.
const DECODE_COLS: usize = 16;

/// Weight formats with SIMD kernels (every kernel ggml's x86 build picks for them).
pub const FORMATS: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q5_0,
    DType::Q6_K,
    DType::Q4_K,
    DType::W4G32,
    DType::W4G128,
    DType::W8PC,
];

/// Whether this backend computes this (already validated) mat_mul call.
/// `chain`: mat_mul's chain_cols attribute.
pub fn check(inputs: &[TensorDesc], outputs: &[TensorDesc], chain: usize) -> Result<(), Error> {
    let (dt, k, n, cols) = mollm_cpu_common::mat_mul_host_layout(inputs, outputs, FORMATS, "x86")?;
    if matches!(dt, DType::F32 | DType::F16) || mollm_cpu_common::wmatmul::FORMATS.contains(&dt) {
        // mollm_cpu_common::fmatmul / wmatmul: any shape.
        return Ok(());
    }
    for c in 0..cols.min(64) {
        let kernel = quant::matmul_kernel_in(dt, k, n, cols, c, chain);
        if !crate::simd_has_kernel(kernel, dt) {
            return Err(Error::Unsupported(format!(
                "mat_mul: no x86 {kernel:?} kernel for {dt}"
            )));
        }
    }
    // Columns past 64 get the same kernels as those below (the choice depends on col only
    // through `col < n_cols / 4 * 4`); check the last one too.
    if cols > 64 {
        let kernel = quant::matmul_kernel_in(dt, k, n, cols, cols - 1, chain);
        if !crate::simd_has_kernel(kernel, dt) {
            return Err(Error::Unsupported(format!(
                "mat_mul: no x86 {kernel:?} kernel for {dt}"
            )));
        }
    }
    Ok(())
}

/// Prepared layout: Q4_K in 16-row groups ([`crate::q4k16`]).
pub const KIND_Q4K16: u32 = 1;
/// Prepared layout: the weight's own, copied into the prepared memory.
pub const KIND_COPY: u32 = 2;
/// Prepared layout: W4G32 / W4G128 / W8PC in 16-row groups ([`crate::wr16`]).
pub const KIND_WR16: u32 = 3;
/// Prepared layout: Q4_1 / Q8_0 (AVX-512) or Q4_1 / Q5_0 (AVX2) in 16-row groups
/// ([`crate::legacy16`]).
pub const KIND_LEGACY16: u32 = 4;

/// `prepare_weight`: Q4_K weights whose row count is a multiple of 16 are repacked for the
/// kernels of [`crate::q4k16`] (AVX-512 and AVX2), Q4_1, Q5_0 and Q8_0 ones (AVX-512 and
/// AVX2) for those of [`crate::legacy16`], whatever their size (a 200 MB Q8_0
/// embedding table too: its mapped source is dropped as the repack reads it, see
/// `mollm_cpu_common::SourcePages`). On AVX-512 only, mollm-format weights are repacked for
/// those of [`crate::wr16`] and other weights of formats with kernels here are copied as they
/// are (into 2 MiB pages, see `mollm_cpu_common::Prepared`).
///
/// # Safety
/// `w` describes valid host memory.
pub unsafe fn prepare(
    isa: Isa,
    host: &HostApi,
    w: &TensorDesc,
    from: &mollm_cpu_common::SourcePages,
) -> Result<mollm_cpu_common::Prepared, Error> {
    let no = |why: &str| Err(Error::Unsupported(format!("prepare_weight: {why}")));
    if !cfg!(target_arch = "x86_64") || !isa.detected() {
        return no("not an x86-64 CPU with this backend's features");
    }
    let Some(dt) = w.dtype().filter(|d| FORMATS.contains(d)) else {
        return no("no kernels for this format");
    };
    if w.ndim > 2 || w.ne[2] != 1 || w.ne[3] != 1 || w.data.is_null() {
        return no("not a 2-D weight");
    }
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    let rb = quant::row_bytes(dt, k).ok_or_else(|| Error::Invalid("bad row".into()))?;
    if n == 0 || w.nb[0] != dt.info().block_bytes as i64 || w.nb[1] as usize != rb {
        return no("rows not packed");
    }
    // SAFETY: a valid packed n x rb weight (checked above).
    let src = core::slice::from_raw_parts(w.data as *const u8, n * rb);
    if dt == DType::Q4_K && n % crate::q4k16::ROWS == 0 {
        let bytes = crate::q4k16::repacked_bytes(k, n);
        let mut p = mollm_cpu_common::Prepared::zeroed(KIND_Q4K16, bytes);
        let (dst, gb) = (SyncPtr(p.bytes_mut().as_mut_ptr()), bytes / (n / 16));
        rows_parallel(host, n, 16, rb, from, |r0, r1| {
            // SAFETY: groups r0/16..r1/16 of the repack, written by this range only.
            let d = core::slice::from_raw_parts_mut(dst.0.add(r0 / 16 * gb), (r1 - r0) / 16 * gb);
            crate::q4k16::repack(&src[r0 * rb..], rb, k, r1 - r0, d)
        });
        return Ok(p);
    }
    // The largest matrices too: Gemma 3's and Qwen2.5-0.5B's tied Q8_0 embedding tables
    // (178 and 145 MB) are most of their decode's bytes, row-wise at about half the read
    // bandwidth (Gemma 3 decode 2.2x in 16-row groups); `get_rows` reads their rows from the
    // repack (see `legacy16::get_rows`).
    if crate::legacy16::fits_isa(isa == Isa::Avx512, dt, k, n) {
        let bytes = crate::legacy16::repacked_bytes(dt, k, n);
        let mut p = mollm_cpu_common::Prepared::zeroed(KIND_LEGACY16, bytes);
        let (dst, gb) = (SyncPtr(p.bytes_mut().as_mut_ptr()), bytes / (n / 16));
        rows_parallel(host, n, 16, rb, from, |r0, r1| {
            // SAFETY: groups r0/16..r1/16 of the repack, written by this range only.
            let d = core::slice::from_raw_parts_mut(dst.0.add(r0 / 16 * gb), (r1 - r0) / 16 * gb);
            crate::legacy16::repack(dt, &src[r0 * rb..], rb, k, r1 - r0, d)
        });
        return Ok(p);
    }
    if isa != Isa::Avx512 {
        // AVX2 has 256-bit kernels for the Q4_K, Q4_1, Q5_0 and Q8_0 layouts only (the
        // others' 16-row groups are AVX-512 code).
        return no("the AVX2 backend repacks Q4_K, Q4_1, Q5_0 and Q8_0 weights of 16k rows only");
    }
    if crate::wr16::fits(dt, k, n) {
        let bytes = crate::wr16::repacked_bytes(dt, k, n);
        let mut p = mollm_cpu_common::Prepared::zeroed(KIND_WR16, bytes);
        crate::wr16::repack(dt, src, rb, k, n, p.bytes_mut());
        return Ok(p);
    }
    // Same layout, in the prepared memory (huge pages): the weight is streamed once per token
    // (measured +1..6% decode on Qwen2.5-1.5B; its 191 MB Q6_K output matrix read from the
    // file's 4 KiB pages ran at 23.5 GB/s, its Q6_K ffn_down copies at 27.4). The mapped
    // source is dropped as the copy reads it, so the largest matrices cost no extra memory.
    let mut p = mollm_cpu_common::Prepared::zeroed(KIND_COPY, n * rb);
    let dst = SyncPtr(p.bytes_mut().as_mut_ptr());
    rows_parallel(host, n, 16, rb, from, |r0, r1| {
        // SAFETY: rows r0..r1 of the copy, written by this range only.
        core::ptr::copy_nonoverlapping(
            src.as_ptr().add(r0 * rb),
            dst.0.add(r0 * rb),
            (r1 - r0) * rb,
        )
    });
    Ok(p)
}

/// Runs `f(r0, r1)` on row ranges that cover `0..n` (multiples of `unit` rows but the last)
/// on the host's threads, a round of about 1 MiB of source (`rs` bytes a row) at a time, and
/// tells `from` after each round how far the source has been read. A model's load repacks or
/// copies most of its weights: both threads fault in the new pages and move the bytes.
///
/// # Safety
/// `f` may run on several threads at once, on disjoint ranges: what it writes for one range
/// must not overlap another's.
unsafe fn rows_parallel(
    host: &HostApi,
    n: usize,
    unit: usize,
    rs: usize,
    from: &mollm_cpu_common::SourcePages,
    f: impl Fn(usize, usize),
) {
    let t = host.n_threads.max(1) as usize;
    let units = n.div_ceil(unit);
    let per_round = ((1usize << 20) / (rs * unit).max(1)).max(t);
    let mut u0 = 0;
    while u0 < units {
        let u1 = (u0 + per_round).min(units);
        let share = (u1 - u0).div_ceil(t);
        let f = &f;
        parallel_for(host, (u1 - u0).div_ceil(share) as u32, |i| {
            let a = u0 + i as usize * share;
            let b = (a + share).min(u1);
            f(a * unit, (b * unit).min(n))
        });
        from.read_upto((u1 * unit).min(n) * rs);
        u0 = u1;
    }
}

/// Whether this backend computes this mat_mul on a prepared weight of `kind`.
pub fn check_prepared(
    isa: Isa,
    kind: u32,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    chain: usize,
) -> Result<(), Error> {
    check(inputs, outputs, chain)?;
    if kind == KIND_COPY && isa == Isa::Avx512 {
        return Ok(());
    }
    // The 16-row layouts: mollm's formats (AVX-512) and the legacy ones (each ISA its own).
    let fits: Option<fn(DType, usize, usize) -> bool> = match (kind, isa) {
        (KIND_LEGACY16, Isa::Avx2) => Some(crate::legacy16::avx2_fits),
        (KIND_LEGACY16, _) => Some(crate::legacy16::fits),
        (KIND_WR16, Isa::Avx512) => Some(crate::wr16::fits),
        _ => None,
    };
    if let Some(fits) = fits {
        let w = &inputs[0];
        let dt = w.dtype().unwrap_or(DType::F32);
        return match fits(dt, w.ne[0] as usize, w.ne[1] as usize) {
            true => Ok(()),
            false => Err(Error::Invalid(format!(
                "mat_mul: a {dt} {}x{} weight is not in the 16-row layout of prepared kind {kind}",
                w.ne[1], w.ne[0]
            ))),
        };
    }
    if kind != KIND_Q4K16 || inputs[0].dtype() != Some(DType::Q4_K) {
        return Err(Error::Unsupported(format!(
            "mat_mul: prepared layout {kind} is not this backend's"
        )));
    }
    if inputs[0].ne[1] as usize % crate::q4k16::ROWS != 0 {
        return Err(Error::Invalid("mat_mul: prepared weight rows".into()));
    }
    Ok(())
}

/// # Safety
/// Validated and [`check`]ed call on valid host memory; the CPU supports `isa`.
pub unsafe fn run(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    chain: usize,
) -> Result<(), Error> {
    run_weights(isa, host, KIND_COPY, inputs, outputs, chain)
}

/// [`run`] on a weight in the prepared layout `kind`: [`KIND_COPY`] (the weight's own),
/// [`KIND_Q4K16`] or [`KIND_LEGACY16`].
///
/// # Safety
/// As [`run`]; for a repacked layout, [`check_prepared`] accepted the call.
pub unsafe fn run_weights(
    isa: Isa,
    host: &HostApi,
    kind: u32,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    chain: usize,
) -> Result<(), Error> {
    let (w, x, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = w.dtype().expect("validated");
    let repacked = kind == KIND_Q4K16;
    let legacy = kind == KIND_LEGACY16;
    if matches!(dt, DType::F32 | DType::F16) {
        return mollm_cpu_common::fmatmul::run(host, inputs, outputs, chain, isa == Isa::Avx512);
    }
    if mollm_cpu_common::wmatmul::FORMATS.contains(&dt) {
        let frame = match isa {
            Isa::Avx512 => mollm_cpu_common::wmatmul::Frame::Avx512,
            _ => mollm_cpu_common::wmatmul::Frame::Avx2,
        };
        return mollm_cpu_common::wmatmul::run(frame, host, inputs, outputs);
    }
    let k = w.ne[0] as usize;
    let n = w.ne[1] as usize;
    let cols = x.nrows() as usize;
    if n == 0 || cols == 0 || k == 0 {
        return Ok(());
    }
    let vdt = quant::vec_dot_type(dt);
    let rb = quant::row_bytes(vdt, k).ok_or_else(|| {
        Error::Invalid(format!(
            "mat_mul: {k} is not a whole number of {vdt} blocks"
        ))
    })?;
    let kernels: Vec<quant::Kernel> = (0..cols)
        .map(|c| quant::matmul_kernel_in(dt, k, n, cols, c, chain))
        .collect();
    let col_index: Vec<(i64, i64, i64)> = (0..cols as i64).map(|c| split_row(&x, c)).collect();

    // Activations, one converted row per column (SIMD where `actq` has the conversion,
    // quant's scalar code otherwise: the same bytes either way).
    let mut act_buf = ACT_BUF.with(|b| b.take());
    if act_buf.len() < cols * rb {
        act_buf.resize(cols * rb, 0);
    }
    // Every byte is written below (each column's converted row) before it is read.
    let act = &mut act_buf[..cols * rb];
    {
        let act_ptr = SyncPtr(act.as_mut_ptr());
        let per = cols.div_ceil(host.n_threads.max(1) as usize).max(1);
        let n_tasks = cols.div_ceil(per) as u32;
        let (kernels, col_index) = (&kernels, &col_index);
        let xp = SyncPtr(x.data);
        let qerr = std::sync::Mutex::new(None::<String>);
        parallel_for(host, n_tasks, |t| {
            let mut col = Vec::new();
            for c in t as usize * per..((t as usize + 1) * per).min(cols) {
                let (i1, i2, i3) = col_index[c];
                let base =
                    xp.0.wrapping_offset((i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]) as isize);
                let src: &[f32] = if x.nb[0] == 4 && base as usize % 4 == 0 {
                    // SAFETY: a validated contiguous f32 row of k elements.
                    unsafe { core::slice::from_raw_parts(base as *const f32, k) }
                } else {
                    col.clear();
                    col.extend((0..k).map(|e| {
                        // SAFETY: element e of a validated f32 row.
                        unsafe {
                            (base.wrapping_offset(e as isize * x.nb[0] as isize) as *const f32)
                                .read_unaligned()
                        }
                    }));
                    &col
                };
                // SAFETY: column c owns bytes c*rb..(c+1)*rb.
                let dst = unsafe { core::slice::from_raw_parts_mut(act_ptr.0.add(c * rb), rb) };
                if crate::simd_quantize_row(kernels[c], dt, src, dst) {
                    continue;
                }
                if let Err(e) = quant::quantize_activations_for(kernels[c], dt, src, dst) {
                    qerr.lock().unwrap().get_or_insert(e.to_string());
                }
            }
        });
        if let Some(e) = qerr.into_inner().unwrap() {
            return Err(Error::Unsupported(format!("mat_mul: {e}")));
        }
    }

    // AVX-512 Q4_K/Q6_K prompt columns in packed 16-column tiles (kq512).
    let n16 = packed_tiles(isa, dt, &kernels);
    let nb = k / 256;
    // Repacked Q4_K on AMX: its own packing of the tiles.
    let amx = repacked && n16 > 0 && crate::amx::available();
    // Row-major Q6_K on AMX: the tiles of each task's 16-row groups, packed by the task.
    let q6amx = !repacked
        && !legacy
        && dt == DType::Q6_K
        && n16 > 0
        && n % 16 == 0
        && crate::amx::available();
    let pack = match (amx, q6amx) {
        (true, _) => Pack::AmxQ4K,
        (_, true) => Pack::AmxQ6K,
        _ => Pack::Vnni,
    };
    let packed = pack_tiles(host, pack, n16, nb, act, rb);
    // The legacy formats' per-block activation terms, once for every row group (their runs of
    // four columns).
    let mut terms_buf = TERMS_BUF.with(|b| b.take());
    let terms = match legacy && cols >= 4 {
        true => crate::legacy16::terms(dt, act, rb, cols, k / 32, &mut terms_buf),
        false => &[][..],
    };

    // Prompt-sized calls: 32 weight rows per task (they stay in L1 while the columns stream
    // by). Decode-sized calls (one column, or one per sequence of a batched step): long runs
    // of the weight per task (its prefetches run ahead within its own rows), shrinking
    // towards the end so that the threads finish together (see `decode_bounds`).
    let w_stride = w.nb[1] as usize;
    let mut bounds = BOUNDS_BUF.with(|b| b.take());
    bounds.clear();
    if n16 == 0 && cols <= DECODE_COLS {
        let most = (TASK_OUT / cols / 16 * 16).min(MAX_ROWS_PER_GEMV_TASK);
        let least = MIN_GEMV_TASK_BYTES.div_ceil(w_stride.max(1));
        decode_bounds(n, host.n_threads.max(1) as usize, most, least, &mut bounds);
    } else {
        bounds.extend((0..n).step_by(ROWS_PER_TASK));
        bounds.push(n);
    }
    let n_tasks = (bounds.len() - 1) as u32;
    let (act, kernels, col_index) = (&*act, &kernels, &col_index);
    // The 16-row and tile kernels write any column stride: where column c starts c rows of
    // the output apart (a plain 2-D output), they write there directly instead of into the
    // task buffer and then a copy (3 MB a step for SmolLM2's logits of 16 sequences). The
    // row-wise kernels (`simd_tile`) fill the buffer.
    let ld = out.nb[1] as usize / 4;
    let direct = out.nb[0] == 4
        && out.nb[1] % 4 == 0
        && col_index.iter().enumerate().all(|(c, &(i1, i2, i3))| {
            i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3] == c as i64 * out.nb[1]
        });
    let (wp, op) = (SyncPtr(w.data), SyncPtr(out.data));
    let bounds_ = &bounds[..];
    parallel_for(host, n_tasks, |t| {
        let (r0, r1) = (bounds_[t as usize], bounds_[t as usize + 1]);
        let nr = r1 - r0;
        // The task's output buffer: per thread, allocated once (a zeroed stack array cost a
        // 16 KiB memset per task, ~2% of a SmolLM2 decode step); every kernel below writes
        // all `nr x (c1 - c0)` floats it hands back before they are read.
        let mut buf = TASK_BUF.with(|b| b.take());
        buf.resize(TASK_OUT, 0.0);
        let wrow = wp.0.wrapping_add(r0 * w_stride) as *const u8;
        // The tile configuration, once for all of the task's tile calls.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `amx` and `q6amx` hold only where amx::available().
        let (tiles32, tiles64) = unsafe {
            (
                amx.then(|| crate::amx::Tiles::<32>::load()),
                q6amx.then(|| crate::amx::Tiles::<64>::load()),
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let tiles32: Option<crate::amx::Tiles<32>> = None;
        #[allow(unused_mut)] // assigned on x86-64 only
        let mut rows = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if q6amx {
            // The task's rows as AMX tiles, once for all its columns (nr is whole groups:
            // n and the task size are multiples of 16).
            use crate::q6kamx::{pack_rows, ROW_BLOCK};
            rows = ROWS_BUF.with(|b| b.take());
            rows.resize(nr / 16 * nb * ROW_BLOCK, 0);
            for g in 0..nr / 16 {
                // SAFETY: AVX-512 (packed_tiles checked); rows r0 + 16g .. + 16 of nb blocks.
                unsafe {
                    pack_rows(
                        wrow.add(16 * g * w_stride),
                        w_stride,
                        nb,
                        rows.as_mut_ptr().add(g * nb * ROW_BLOCK),
                    )
                };
            }
        }
        let mut c0 = 0;
        while c0 < cols {
            let c1 = if c0 < n16 * PACKED_COLS {
                // AMX takes two tiles at once where there are two (their weights unpacked
                // and loaded once).
                match (amx || q6amx) && c0 + 2 * PACKED_COLS <= n16 * PACKED_COLS {
                    true => c0 + 2 * PACKED_COLS,
                    false => c0 + PACKED_COLS,
                }
            } else {
                (c0 + COLS_PER_STEP).min(cols)
            };
            let buf = &mut buf[..nr * (c1 - c0)];
            // Where this chunk's (c1 - c0) columns of nr floats go, os apart: rows r0..r1 of
            // the output's columns (only this task writes them), or the task buffer.
            let (dst, os) = match direct {
                true => (op.0.wrapping_add((c0 * ld + r0) * 4) as *mut f32, ld),
                false => (buf.as_mut_ptr(), nr),
            };
            let mut in_buf = !direct;
            if legacy {
                let g0 = r0 / crate::legacy16::ROWS;
                let nb32 = k / 32;
                let bb = crate::legacy16::block_bytes(dt);
                let wg = wp.0.wrapping_add(g0 * nb32 * bb) as *const u8;
                let a = act[c0 * rb..].as_ptr();
                // SAFETY: the ISA check_prepared accepted for the layout; rows r0..r1 are whole
                // 16-row groups of the repacked weight; dst holds (c1 - c0) columns of nr
                // floats os apart.
                unsafe {
                    crate::legacy16::columns(
                        isa == Isa::Avx512,
                        dt,
                        wg,
                        nr / crate::legacy16::ROWS,
                        nb32,
                        a,
                        rb,
                        c1 - c0,
                        terms.get(c0 * nb32..).unwrap_or(&[]),
                        dst,
                        os,
                    )
                };
            } else if repacked {
                // SAFETY: as below, on the repacked weight: groups of 16 rows starting at r0.
                unsafe {
                    repacked_cols(
                        isa,
                        tiles32.as_ref(),
                        r0,
                        nr,
                        c0,
                        c1,
                        kernels,
                        n16,
                        nb,
                        wp.0,
                        act,
                        rb,
                        &packed,
                        dst,
                        os,
                    )
                };
            } else if c0 < n16 * PACKED_COLS && q6amx {
                #[cfg(target_arch = "x86_64")]
                {
                    use crate::q6kamx::{tile, ACT_BLOCK, ROW_BLOCK};
                    let ps = nb * ACT_BLOCK;
                    let p = packed[c0 / PACKED_COLS * ps..].as_ptr();
                    let t = tiles64.as_ref().expect("loaded where q6amx");
                    for g in 0..nr / 16 {
                        let (w, o) = (rows[g * nb * ROW_BLOCK..].as_ptr(), dst.add(16 * g));
                        // SAFETY: AMX (checked); w holds nb packed blocks and p (c1 - c0) / 16
                        // tiles of them, ps apart; dst holds c1 - c0 columns of nr floats os
                        // apart, group g's rows at 16 g.
                        unsafe {
                            match c1 - c0 {
                                32 => tile::<2>(t, w, nb, p, ps, o, os),
                                _ => tile::<1>(t, w, nb, p, ps, o, os),
                            }
                        };
                    }
                }
            } else if c0 < n16 * PACKED_COLS {
                let tile = packed[c0 / PACKED_COLS * nb * PACKED_BLOCK..].as_ptr();
                // SAFETY: AVX-512 (packed_tiles checked); rows r0..r1 of nb blocks; the tile
                // holds nb packed blocks; dst holds 16 columns of nr floats os apart.
                unsafe { gemm_packed(dt, wrow, w_stride, nr, tile, nb, dst, os) };
            } else {
                in_buf = true;
                let a = act[c0 * rb..].as_ptr();
                // SAFETY: the CPU supports `isa` (checked by the caller); the kernels exist.
                unsafe {
                    crate::simd_tile(isa, &kernels[c0..c1], dt, k, wrow, w_stride, a, rb, nr, buf)
                };
            }
            for c in (c0..c1).filter(|_| in_buf) {
                let (i1, i2, i3) = col_index[c];
                let col_off = i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3];
                let vals = &buf[(c - c0) * nr..(c - c0 + 1) * nr];
                if out.nb[0] == 4 {
                    let dst = op.0.wrapping_offset((r0 as i64 * 4 + col_off) as isize);
                    // SAFETY: rows r0..r1 of column c, contiguous, written by this task only.
                    unsafe {
                        core::ptr::copy_nonoverlapping(vals.as_ptr() as *const u8, dst, nr * 4)
                    };
                    continue;
                }
                for (j, &v) in vals.iter().enumerate() {
                    let off = (r0 + j) as i64 * out.nb[0] + col_off;
                    // SAFETY: each (row, column) is written by exactly one task.
                    unsafe { (op.0.wrapping_offset(off as isize) as *mut f32).write_unaligned(v) };
                }
            }
            c0 = c1;
        }
        TASK_BUF.with(|b| b.set(buf));
        if q6amx {
            ROWS_BUF.with(|b| b.set(rows));
        }
    });
    ACT_BUF.with(|b| b.set(act_buf));
    TERMS_BUF.with(|b| b.set(terms_buf));
    BOUNDS_BUF.with(|b| b.set(bounds));
    Ok(())
}

/// Where the tasks of a decode-sized call on `n` rows start (then `n`), for `t` threads, at
/// most `most` rows (a multiple of 16) per task: whole 16-row groups (the kernels' row
/// groups), each task a `2t`-th of the rows left (guided self-scheduling), so the first are
/// long runs and the last are short, down to `least` rows. Tasks go out in order, so a
/// thread that is behind at the end takes a short task, not a long one: with equal tasks
/// (about four per thread) the two threads of a Qwen2.5-1.5B decode waited on each other
/// 250-580 ms in ~10 s of decoding, this way ~110 ms, and tg64 went 25.9 -> 26.4 t/s
/// (medians of 5 interleaved rounds).
fn decode_bounds(n: usize, t: usize, most: usize, least: usize, out: &mut Vec<usize>) {
    let groups = n.div_ceil(16);
    let most_g = (most / 16).max(1);
    let least_g = least.div_ceil(16).clamp(1, most_g);
    let mut g = 0;
    while g < groups {
        out.push(g * 16);
        let left = groups - g;
        g += left.div_ceil(2 * t).clamp(least_g, most_g).min(left);
    }
    out.push(n);
}

#[cfg(target_arch = "x86_64")]
use crate::kq512::{Q8K_T16_BLOCK as PACKED_BLOCK, T16 as PACKED_COLS};
#[cfg(not(target_arch = "x86_64"))]
const PACKED_BLOCK: usize = 0;
#[cfg(not(target_arch = "x86_64"))]
const PACKED_COLS: usize = 16;

/// # Safety
/// As `kq512::gemm_t16_avx512`; `dt` is Q4_K or Q6_K.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_packed(
    dt: DType,
    w: *const u8,
    ws: usize,
    nr: usize,
    tile: *const u8,
    nb: usize,
    out: *mut f32,
    ostride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    crate::kq512::gemm_t16_avx512(dt, w, ws, nr, tile, nb, out, ostride);
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "packed tiles are x86-64 only: {dt} {w:?} {ws} {nr} {tile:?} {nb} {out:?} {ostride}"
    )
}

/// Columns `c0..c1` of rows `r0..r0 + nr` (whole 16-row groups) on the repacked weight
/// `w`: 16-column tiles for the first `n16 * 16` columns (on AMX where `amx`, else the
/// packed tiles), single columns (ggml's GEMM chain below `cols / 4 * 4`, the GEMV chain
/// above) for the rest.
///
/// # Safety
/// The CPU supports `isa` (packed tiles: AVX-512 only, see [`packed_tiles`]); `w` is the
/// repacked weight of `nb` blocks per row.
#[allow(clippy::too_many_arguments)]
unsafe fn repacked_cols(
    isa: Isa,
    amx: Option<&crate::amx::Tiles<32>>,
    r0: usize,
    nr: usize,
    c0: usize,
    c1: usize,
    kernels: &[quant::Kernel],
    n16: usize,
    nb: usize,
    w: *mut u8,
    act: &[u8],
    rb: usize,
    packed: &[u8],
    dst: *mut f32,
    os: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::q4k16::{GROUP_BLOCK, ROWS};
        let g0 = r0 / ROWS;
        let ng = nr / ROWS;
        let wg = w.add(g0 * nb * GROUP_BLOCK) as *const u8;
        if let Some(tiles) = amx.filter(|_| c0 < n16 * PACKED_COLS) {
            let ps = nb * crate::q4k16::AMX_BLOCK;
            let tile = packed[c0 / PACKED_COLS * ps..].as_ptr();
            for g in 0..ng {
                let (wgg, o) = (wg.add(g * nb * GROUP_BLOCK), dst.add(g * ROWS));
                match c1 - c0 {
                    32 => crate::q4k16::tile_amx::<2>(tiles, wgg, nb, tile, ps, o, os),
                    _ => crate::q4k16::tile_amx::<1>(tiles, wgg, nb, tile, ps, o, os),
                }
            }
            return;
        }
        if c0 < n16 * PACKED_COLS {
            let tile = packed[c0 / PACKED_COLS * nb * PACKED_BLOCK..].as_ptr();
            for g in 0..ng {
                let wgg = wg.add(g * nb * GROUP_BLOCK);
                crate::q4k16::tile_avx512(wgg, nb, tile, dst.add(g * ROWS), os);
            }
            return;
        }
        // Runs of eight, four or two columns of one chain share each unpacked weight line (decode
        // steps of several sequences); the rest one at a time.
        let mut c = c0;
        while c < c1 {
            let gemm = kernels[c] == quant::Kernel::RepackGemm;
            let out = dst.add((c - c0) * os);
            let a = act[c * rb..].as_ptr();
            let run = |m: usize| c + m <= c1 && kernels[c..c + m].iter().all(|&k| k == kernels[c]);
            if isa != Isa::Avx512 {
                // AVX2: four columns at a time (16 ymm registers), the rest one by one.
                let m = if run(4) { 4 } else { 1 };
                if m == 4 {
                    crate::q4k16::columns_avx2::<4>(gemm, wg, ng, nb, a, rb, out, os);
                } else {
                    crate::q4k16::columns_avx2::<1>(gemm, wg, ng, nb, a, rb, out, os);
                }
                c += m;
                continue;
            }
            if run(8) {
                crate::q4k16::columns_avx512::<8>(gemm, wg, ng, nb, a, rb, out, os);
                c += 8;
                continue;
            }
            if run(4) {
                crate::q4k16::columns_avx512::<4>(gemm, wg, ng, nb, a, rb, out, os);
                c += 4;
                continue;
            }
            if run(2) {
                crate::q4k16::columns_avx512::<2>(gemm, wg, ng, nb, a, rb, out, os);
                c += 2;
                continue;
            }
            crate::q4k16::column_avx512(gemm, wg, ng, nb, act[c * rb..].as_ptr(), out);
            c += 1;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "repacked weights are x86-64 only: {isa:?} {} {r0} {nr} {c0} {c1} {} {n16} {nb} {w:?} {} {rb} {} {}",
        amx.is_some(),
        kernels.len(),
        act.len(),
        packed.len(),
        dst as usize + os
    )
}

/// How many leading 16-column tiles go through the packed AVX-512 K-quant GEMMs: all of
/// them when their columns take ggml's Q4_K repack GEMM or Q6_K tiled chain.
fn packed_tiles(isa: Isa, dt: DType, kernels: &[quant::Kernel]) -> usize {
    let chain = match dt {
        DType::Q4_K => quant::Kernel::RepackGemm,
        DType::Q6_K => quant::Kernel::Tiled,
        _ => return 0,
    };
    if !cfg!(target_arch = "x86_64") || isa != Isa::Avx512 {
        return 0;
    }
    let n = kernels.len() / PACKED_COLS;
    if kernels[..n * PACKED_COLS].iter().all(|&k| k == chain) {
        n
    } else {
        0
    }
}

/// How prompt columns of Q4_K/Q6_K are packed into 16-column tiles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pack {
    /// For the VNNI kernels (`kq512::pack_q8k_t16`).
    Vnni,
    /// For repacked Q4_K on AMX (`q4k16::pack_amx`).
    AmxQ4K,
    /// For row-major Q6_K on AMX (`q6kamx::pack_act`).
    AmxQ6K,
}

/// The packed tiles of the first `n16 * 16` activation rows (each `rb` bytes of Q8_K), for
/// the kernels `pack` names.
fn pack_tiles(host: &HostApi, pack: Pack, n16: usize, nb: usize, act: &[u8], rb: usize) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    let block = match pack {
        Pack::AmxQ4K => crate::q4k16::AMX_BLOCK,
        Pack::AmxQ6K => crate::q6kamx::ACT_BLOCK,
        Pack::Vnni => PACKED_BLOCK,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let block = PACKED_BLOCK;
    #[allow(unused_mut)]
    let mut packed = vec![0u8; n16 * nb * block];
    #[cfg(target_arch = "x86_64")]
    if n16 > 0 {
        let dst = SyncPtr(packed.as_mut_ptr());
        let src = SyncPtr(act.as_ptr() as *mut u8);
        // SAFETY: tile t reads activation rows 16t..16t+16 and writes only its own blocks.
        unsafe {
            parallel_for(host, n16 as u32, |t| {
                let t = t as usize;
                let (a, d) = (src.0.add(t * PACKED_COLS * rb), dst.0.add(t * nb * block));
                match pack {
                    Pack::AmxQ4K => crate::q4k16::pack_amx(a, rb, nb, d),
                    Pack::AmxQ6K => crate::q6kamx::pack_act(a, rb, nb, d),
                    Pack::Vnni => crate::kq512::pack_q8k_t16(a, rb, nb, d),
                }
            })
        };
    }
    let _ = (host, pack, act, rb);
    packed
}

#[cfg(test)]
mod tests {
    use super::decode_bounds;

    fn bounds(n: usize, t: usize, most: usize, least: usize) -> Vec<usize> {
        let mut v = Vec::new();
        decode_bounds(n, t, most, least, &mut v);
        v
    }

    /// Whole 16-row groups, every row once, no task over the size limit, long tasks first and
    /// short ones last (down to the least size), at least one task per thread.
    #[test]
    fn decode_tasks_shrink_towards_the_end() {
        // Qwen2.5-1.5B's gate/up: 560 groups, 2 threads, 64 groups at most, 2 at least.
        let b = bounds(8960, 2, 1024, 32);
        let sizes: Vec<usize> = b.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(&sizes[..5], &[1024; 5]);
        assert_eq!(sizes[5], 960); // 240 groups left: a quarter of them
        assert_eq!(sizes.last(), Some(&32));
        for (n, t, most, least) in [
            (576usize, 2usize, 1024usize, 16usize),
            (192, 2, 1024, 64),
            (1536, 2, 1024, 16),
            (151936, 2, 1024, 16),
            (49152, 2, 256, 16),
            (16, 2, 1024, 16),
            (8, 4, 1024, 16),
            (1000, 4, 1024, 100),
            (896, 3, 64, 16),
        ] {
            let b = bounds(n, t, most, least);
            assert_eq!((b[0], *b.last().unwrap()), (0, n), "{n}");
            let sizes: Vec<usize> = b.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(sizes.len() >= t.min(n.div_ceil(16)), "{n} {t}: {sizes:?}");
            for (i, w) in sizes.windows(2).enumerate() {
                assert!(w[0] >= w[1] || i + 2 == sizes.len(), "{n}: {sizes:?}");
            }
            for (i, &s) in sizes.iter().enumerate() {
                assert!(s <= most && s > 0, "{n}: {sizes:?}");
                assert!(b[i].is_multiple_of(16), "{n}: {b:?}");
                // The last task takes what is left; the others at least `least` (in groups).
                if i + 1 < sizes.len() {
                    assert!(s >= least.div_ceil(16) * 16 || s == most, "{n}: {sizes:?}");
                }
            }
        }
    }
}
