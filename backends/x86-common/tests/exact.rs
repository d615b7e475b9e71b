//! The SIMD kernels against quant's scalar twins (`quant::dot_with`), bit for bit, and the
//! backend's mat_mul against the reference backend's, bit for bit.

use abi::{BackendTable, DType, Op, OpCall, OpParams, Status, TensorDesc};
use mollm_x86_common::{dot_rows, dot_tile, Isa, HEADER_AVX2, HEADER_AVX512};
use quant::Kernel;

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
    }
    /// Normal samples with ~1% outliers up to 60x.
    fn data(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.normal() * scale;
                if self.next_u64() % 97 == 0 {
                    v * (1.0 + 60.0 * self.uniform())
                } else {
                    v
                }
            })
            .collect()
    }
}

fn isas() -> Vec<Isa> {
    let v: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.detected())
        .collect();
    if v.is_empty() {
        eprintln!("this CPU has neither AVX2 nor AVX-512: SIMD kernels not tested");
    }
    v
}

/// Byte offsets of the f16 scale fields in a block of `dt`.
fn scale_fields(dt: DType) -> &'static [usize] {
    match dt {
        DType::Q4_1 => &[0, 2],
        DType::Q8_0 | DType::Q5_0 | DType::Q4_0 => &[0],
        DType::Q6_K => &[208],
        DType::Q4_K => &[0, 2],
        _ => unreachable!(),
    }
}

/// `rows` weight rows: even rows quantized from data with outliers, odd rows random bytes
/// (every quant and sub-scale bit pattern) with finite random f16 scales.
fn weights(rng: &mut Rng, dt: DType, n: usize, rows: usize) -> Vec<u8> {
    let rb = quant::row_bytes(dt, n).unwrap();
    let info = dt.info();
    let mut w = vec![0u8; rb * rows];
    for (r, row) in w.chunks_exact_mut(rb).enumerate() {
        if r % 2 == 0 {
            let s = 0.05 + rng.uniform();
            let x = rng.data(n, s);
            quant::quantize_row(dt, &x, row).unwrap();
        } else {
            row.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
            for blk in row.chunks_exact_mut(info.block_bytes as usize) {
                for &off in scale_fields(dt) {
                    let v = (rng.uniform() - 0.3) * 0.1 * (1.0 + 4.0 * rng.uniform());
                    blk[off..off + 2].copy_from_slice(&quant::f32_to_fp16(v).to_le_bytes());
                }
            }
        }
    }
    w
}

fn kernels_of(dt: DType) -> &'static [Kernel] {
    match dt {
        DType::Q4_1 => &[Kernel::VecDot],
        DType::Q8_0 | DType::Q5_0 => &[Kernel::VecDot, Kernel::TinyBlas],
        DType::Q4_0 => &[
            Kernel::VecDot,
            Kernel::TinyBlas,
            Kernel::RepackGemv,
            Kernel::RepackGemm,
        ],
        DType::Q6_K => &[Kernel::VecDot, Kernel::Tiled],
        DType::Q4_K => &[
            Kernel::VecDot,
            Kernel::RepackGemv,
            Kernel::RepackGemm,
            Kernel::Tiled,
        ],
        _ => unreachable!(),
    }
}

#[test]
fn simd_kernels_match_scalar_twins_bit_for_bit() {
    let isas = isas();
    let mut rng = Rng::new(7);
    let mut checked = 0usize;
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q5_0,
        DType::Q6_K,
        DType::Q4_K,
    ] {
        let sizes: &[usize] = if dt.info().block_len == 32 {
            &[32, 64, 96, 160, 512, 1024, 1536, 4096]
        } else {
            &[256, 512, 768, 1536, 4096]
        };
        for &n in sizes {
            for rows in [1usize, 5, 17] {
                let w = weights(&mut rng, dt, n, rows);
                let rb = w.len() / rows;
                for &kernel in kernels_of(dt) {
                    let s = 0.1 + 2.0 * rng.uniform();
                    let x = rng.data(n, s);
                    let vt = quant::vec_dot_type(dt);
                    let mut act = vec![0u8; quant::row_bytes(vt, n).unwrap()];
                    quant::quantize_activations_for(kernel, dt, &x, &mut act).unwrap();
                    let want: Vec<f32> = w
                        .chunks_exact(rb)
                        .map(|row| quant::dot_with(kernel, dt, n, row, &act))
                        .collect();
                    for &isa in &isas {
                        let mut got = vec![f32::NAN; rows];
                        dot_rows(isa, kernel, dt, n, &w, &act, &mut got);
                        for r in 0..rows {
                            assert_eq!(
                                got[r].to_bits(),
                                want[r].to_bits(),
                                "{isa:?} {dt} {kernel:?} n={n} row {r}: {} vs {}",
                                got[r],
                                want[r]
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{checked} outputs bit-identical");
}

/// The multi-column entry (`dot_tile`): every (row, column) equals the scalar twin, for row
/// and column counts around the tile sizes, columns of mixed kernels included.
#[test]
fn simd_tiles_match_scalar_twins_bit_for_bit() {
    let isas = isas();
    let mut rng = Rng::new(11);
    let mut checked = 0usize;
    for dt in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q5_0,
        DType::Q6_K,
        DType::Q4_K,
    ] {
        let n = if dt.info().block_len == 32 { 160 } else { 512 };
        for rows in [1usize, 3, 4, 9, 32] {
            for (cols, mixed) in [1usize, 3, 4, 5, 8, 13, 17, 8, 9, 16, 19]
                .into_iter()
                .enumerate()
                .map(|(i, c)| (c, i < 7))
            {
                let w = weights(&mut rng, dt, n, rows);
                let rb = w.len() / rows;
                let ks = kernels_of(dt);
                // Runs of four columns of each kernel, then (decode steps of several
                // sequences) every column on the first kernel.
                let kernels: Vec<Kernel> = match mixed {
                    true => (0..cols).map(|c| ks[(c / 4) % ks.len()]).collect(),
                    false => vec![ks[0]; cols],
                };
                let vt = quant::vec_dot_type(dt);
                let ab = quant::row_bytes(vt, n).unwrap();
                let mut act = vec![0u8; ab * cols];
                for (c, a) in act.chunks_exact_mut(ab).enumerate() {
                    let s = 0.1 + 2.0 * rng.uniform();
                    let x = rng.data(n, s);
                    quant::quantize_activations_for(kernels[c], dt, &x, a).unwrap();
                }
                for &isa in &isas {
                    let mut got = vec![f32::NAN; rows * cols];
                    dot_tile(isa, &kernels, dt, n, &w, &act, &mut got);
                    for c in 0..cols {
                        for r in 0..rows {
                            let want = quant::dot_with(
                                kernels[c],
                                dt,
                                n,
                                &w[r * rb..(r + 1) * rb],
                                &act[c * ab..(c + 1) * ab],
                            );
                            assert_eq!(
                                got[c * rows + r].to_bits(),
                                want.to_bits(),
                                "{isa:?} {dt} {:?} rows={rows} cols={cols} ({r}, {c})",
                                kernels[c]
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{checked} outputs bit-identical");
}

// ---------------------------------------------------------------- through the table

fn f32_desc(v: &mut [f32], shape: &[i64]) -> TensorDesc {
    TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, DType::F32, shape)
}

struct Instance {
    table: &'static BackendTable,
    ctx: *mut core::ffi::c_void,
}

impl Instance {
    fn new(table: &'static BackendTable, host: &abi::HostApi) -> Instance {
        let mut ctx = core::ptr::null_mut();
        assert_eq!((table.init)(host, &mut ctx), 0);
        Instance { table, ctx }
    }
    fn run(&self, call: &OpCall) -> Status {
        Status::from_raw((self.table.compute)(self.ctx, call))
    }
    fn supports(&self, call: &OpCall) -> Status {
        Status::from_raw((self.table.supports.unwrap())(self.ctx, call))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        (self.table.shutdown)(self.ctx)
    }
}

fn tables() -> Vec<(Isa, &'static BackendTable)> {
    let mut v = Vec::new();
    for (isa, h) in [(Isa::Avx2, &HEADER_AVX2), (Isa::Avx512, &HEADER_AVX512)] {
        h.check_layout().unwrap();
        if isa.detected() {
            v.push((isa, unsafe { &*h.table }));
        }
    }
    v
}

/// `mat_mul` of weight `wd` with `x` (`k x cols`) on the reference and on `me` (given `wme`:
/// `wd` itself or the descriptor `me` prepared from it): `me` must accept the call and match
/// bit for bit; a prepared weight must be refused by the reference.
#[allow(clippy::too_many_arguments)]
fn check_mat_mul(
    refi: &Instance,
    me: &Instance,
    wd: TensorDesc,
    wme: TensorDesc,
    x: &mut [f32],
    (k, n, cols): (usize, usize, usize),
    label: &str,
) {
    check_mat_mul_chain(refi, me, wd, wme, x, (k, n, cols), label, 0)
}

/// [`check_mat_mul`] with mat_mul's `chain_cols` attribute.
#[allow(clippy::too_many_arguments)]
fn check_mat_mul_chain(
    refi: &Instance,
    me: &Instance,
    wd: TensorDesc,
    wme: TensorDesc,
    x: &mut [f32],
    (k, n, cols): (usize, usize, usize),
    label: &str,
    chain: i64,
) {
    let xd = f32_desc(x, &[k as i64, cols as i64]);
    let mut want = vec![0f32; n * cols];
    let mut got = vec![f32::NAN; n * cols];
    let od_ref = f32_desc(&mut want, &[n as i64, cols as i64]);
    let od = f32_desc(&mut got, &[n as i64, cols as i64]);
    let p = abi::MatMulAttrs { chain_cols: chain }.to_params();
    let (ins_ref, ins, outs_ref, outs) = ([wd, xd], [wme, xd], [od_ref], [od]);
    let call_ref = OpCall::new(Op::MatMul, &ins_ref, &outs_ref, p);
    assert_eq!(
        refi.run(&call_ref),
        Status::Ok,
        "reference: {}",
        mollm_x86_common::last_error_string(&reference::TABLE, refi.ctx)
    );
    if wme.buffer != 0 {
        let foreign = OpCall::new(Op::MatMul, &ins, &outs_ref, p);
        assert_ne!(
            refi.run(&foreign),
            Status::Ok,
            "the reference took a prepared weight"
        );
    }
    let call = OpCall::new(Op::MatMul, &ins, &outs, p);
    assert_eq!(me.supports(&call), Status::Ok, "{label} cols {cols}");
    assert_eq!(
        me.run(&call),
        Status::Ok,
        "{}",
        mollm_x86_common::last_error_string(me.table, me.ctx)
    );
    for i in 0..n * cols {
        assert_eq!(
            got[i].to_bits(),
            want[i].to_bits(),
            "{label} {k}x{n} cols {cols} elem {i}: {} vs {}",
            got[i],
            want[i]
        );
    }
}

#[test]
fn mat_mul_matches_reference_backend_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let refi = Instance::new(&reference::TABLE, &host);
    let mut rng = Rng::new(11);
    let cases: &[(DType, usize, usize)] = &[
        (DType::Q4_1, 576, 72),
        (DType::Q4_1, 96, 13),
        (DType::Q8_0, 576, 64),
        (DType::Q5_0, 896, 40),
        (DType::Q6_K, 512, 72),
        (DType::Q6_K, 768, 48), // whole 16-row groups: AMX tiles where the CPU has them
        (DType::Q4_K, 512, 64), // repacked (rows % 8 == 0): GEMV / GEMM
        (DType::Q4_K, 768, 36), // not repacked: vec_dot / tiled
        (DType::Q4_0, 576, 64), // repacked (rows % 8 == 0): ggml's repack chain
        (DType::Q4_0, 96, 13),  // vec_dot / tinyBLAS
    ];
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        for &(dt, k, n) in cases {
            let mut w = weights(&mut rng, dt, k, n);
            let wd = TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]);
            for cols in [1usize, 2, 3, 4, 5, 7, 8, 9, 17, 35, 50] {
                let mut x = rng.data(k * cols, 1.0);
                check_mat_mul(
                    &refi,
                    &me,
                    wd,
                    wd,
                    &mut x,
                    (k, n, cols),
                    &format!("{isa:?} {dt}"),
                );
            }
        }
    }
}

#[test]
fn other_ops_and_formats_are_unsupported_and_bad_calls_invalid() {
    let host = reference::serial_host();
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        let (k, n) = (64usize, 8usize);
        let mut w = vec![0u8; quant::row_bytes(DType::Q5_1, k).unwrap() * n];
        let wd = TensorDesc::contiguous(w.as_mut_ptr(), DType::Q5_1, &[k as i64, n as i64]);
        let mut x = vec![0f32; k];
        let xd = f32_desc(&mut x, &[k as i64, 1]);
        let mut o = vec![0f32; n];
        let od = f32_desc(&mut o, &[n as i64, 1]);
        let (ins, outs) = ([wd, xd], [od]);
        let call = OpCall::new(Op::MatMul, &ins, &outs, OpParams::default());
        assert_eq!(me.supports(&call), Status::Unsupported, "{isa:?}");
        assert_eq!(me.run(&call), Status::Unsupported, "{isa:?}");
        assert!(mollm_x86_common::last_error_string(table, me.ctx).contains("q5_1"));
        // wrong output shape
        let od_bad = f32_desc(&mut o, &[n as i64 - 1, 1]);
        let outs_bad = [od_bad];
        let bad = OpCall::new(Op::MatMul, &ins, &outs_bad, OpParams::default());
        assert_eq!(me.run(&bad), Status::InvalidArgument);
        // another op
        let mut y = vec![0f32; k];
        let yd = f32_desc(&mut y, &[k as i64, 1]);
        let p = abi::RmsNormAttrs { eps: 1e-6 }.to_params();
        let (rin, rout) = ([xd], [yd]);
        let rms = OpCall::new(Op::RmsNorm, &rin, &rout, p);
        assert_eq!(me.supports(&rms), Status::Unsupported);
    }
}

#[test]
fn prepared_q4_k_weights_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let refi = Instance::new(&reference::TABLE, &host);
    let mut rng = Rng::new(12);
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        let prep = table
            .prepare_weight
            .expect("CPU backends offer prepare_weight");
        for &(k, n) in &[(512usize, 64usize), (768, 48), (256, 16), (512, 24)] {
            let dt = DType::Q4_K;
            let mut w = weights(&mut rng, dt, k, n);
            let wd = TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]);
            let mut pd = wd;
            let st = Status::from_raw(prep(me.ctx, &wd, &mut pd));
            if isa != Isa::Avx512 && n % 16 != 0 {
                // AVX2 repacks Q4_K in 16-row groups only (AVX-512 copies the others).
                assert_eq!(st, Status::Unsupported, "{isa:?} {n} rows");
                continue;
            }
            assert_eq!(
                st,
                Status::Ok,
                "{}",
                mollm_x86_common::last_error_string(table, me.ctx)
            );
            assert_ne!(pd.buffer, 0);
            for cols in [1usize, 2, 3, 4, 5, 8, 16, 17, 20, 33, 35] {
                let mut x = rng.data(k * cols, 1.0);
                check_mat_mul(&refi, &me, wd, pd, &mut x, (k, n, cols), "prepared");
            }
            // Decode steps of several sequences: every column on the one-column chain.
            for cols in [2usize, 4, 5, 8, 9, 16, 19] {
                let mut x = rng.data(k * cols, 1.0);
                let l = "prepared, chain_cols 1";
                check_mat_mul_chain(&refi, &me, wd, pd, &mut x, (k, n, cols), l, 1);
            }
            // a handle this instance never gave out, and a freed one, are refused
            let mut bogus = pd;
            bogus.buffer += 1000;
            let mut o = vec![0f32; n];
            let mut x = rng.data(k, 1.0);
            let (xd, od) = (
                f32_desc(&mut x, &[k as i64, 1]),
                f32_desc(&mut o, &[n as i64, 1]),
            );
            let (ins, outs) = ([bogus, xd], [od]);
            let call = OpCall::new(Op::MatMul, &ins, &outs, OpParams::default());
            assert_eq!(me.run(&call), Status::InvalidArgument);
            (table.buffer_free.unwrap())(me.ctx, pd.buffer);
            let (ins, outs) = ([pd, xd], [od]);
            let call = OpCall::new(Op::MatMul, &ins, &outs, OpParams::default());
            assert_eq!(me.run(&call), Status::InvalidArgument);
        }
    }
}

/// Q4_1, Q5_0 and Q8_0 weights in 16-row groups (other row counts keep the row layout):
/// every column count, on the decode chain of several sequences too, equals the reference.
#[test]
fn prepared_legacy_weights_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let refi = Instance::new(&reference::TABLE, &host);
    let mut rng = Rng::new(13);
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        let prep = table
            .prepare_weight
            .expect("CPU backends offer prepare_weight");
        let cases = [(576usize, 64usize), (96, 16), (1536, 48), (64, 24)];
        // Q6_K is copied as it is on AVX-512 (the 1.5B's 191 MB output matrix among them).
        for (dt, &(k, n)) in [DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q6_K]
            .into_iter()
            .flat_map(|d| cases.iter().map(move |c| (d, c)))
            .filter(|&(d, &(k, _))| k % d.info().block_len as usize == 0)
        {
            let mut w = weights(&mut rng, dt, k, n);
            let wd = TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]);
            let mut pd = wd;
            let st = Status::from_raw(prep(me.ctx, &wd, &mut pd));
            // AVX2 repacks whole 16-row groups only (AVX-512 copies what it does not repack).
            if isa != Isa::Avx512 && (n % 16 != 0 || dt == DType::Q6_K) {
                assert_eq!(st, Status::Unsupported, "{isa:?}");
                continue;
            }
            assert_eq!(
                st,
                Status::Ok,
                "{isa:?} {}",
                mollm_x86_common::last_error_string(table, me.ctx)
            );
            for cols in [1usize, 2, 3, 4, 5, 8, 15, 16, 17, 18, 33, 35, 50] {
                let mut x = rng.data(k * cols, 1.0);
                check_mat_mul(
                    &refi,
                    &me,
                    wd,
                    pd,
                    &mut x,
                    (k, n, cols),
                    &format!("prepared {dt}"),
                );
            }
            for cols in [2usize, 5, 16, 19] {
                let mut x = rng.data(k * cols, 1.0);
                let l = &format!("prepared {dt}, chain_cols 1");
                check_mat_mul_chain(&refi, &me, wd, pd, &mut x, (k, n, cols), l, 1);
            }
            // Whole 16-row groups are repacked, AVX-512 copies the rest: both read rows.
            let reads = n % 16 == 0 || isa == Isa::Avx512;
            check_get_rows(&refi, &me, wd, pd, (k, n), &mut rng, reads);
            (table.buffer_free.unwrap())(me.ctx, pd.buffer);
        }
    }
}

/// `get_rows` on a prepared table (a tied embedding read from its repack or copy): the
/// reference's rows of the original bit for bit where `repacked`, declined otherwise; an
/// id past the table is an error, not a read out of bounds.
fn check_get_rows(
    refi: &Instance,
    me: &Instance,
    wd: TensorDesc,
    pd: TensorDesc,
    (k, n): (usize, usize),
    rng: &mut Rng,
    repacked: bool,
) {
    let mut ids: Vec<i32> = (0..7)
        .map(|_| (rng.data(1, 1.0)[0].abs() * 1e4) as i32 % n as i32)
        .collect();
    ids.extend([0, n as i32 - 1]);
    let idd = TensorDesc::contiguous(ids.as_mut_ptr() as *mut u8, DType::I32, &[ids.len() as i64]);
    let mut want = vec![0f32; k * ids.len()];
    let mut got = vec![f32::NAN; k * ids.len()];
    let shape = [k as i64, ids.len() as i64];
    let (od_ref, od) = (f32_desc(&mut want, &shape), f32_desc(&mut got, &shape));
    let p = OpParams::default();
    let (ins_ref, ins) = ([wd, idd], [pd, idd]);
    let (outs_ref, outs) = ([od_ref], [od]);
    assert_eq!(
        refi.run(&OpCall::new(Op::GetRows, &ins_ref, &outs_ref, p)),
        Status::Ok
    );
    let st = me.run(&OpCall::new(Op::GetRows, &ins, &outs, p));
    if !repacked {
        assert_eq!(
            st,
            Status::Unsupported,
            "get_rows on a prepared {:?} table",
            wd.dtype()
        );
        return;
    }
    assert_eq!(
        st,
        Status::Ok,
        "get_rows on a prepared {:?} table",
        wd.dtype()
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got),
        bits(&want),
        "get_rows on a prepared {:?} {k}x{n} table",
        wd.dtype()
    );
    let mut bad = [n as i32];
    let badd = TensorDesc::contiguous(bad.as_mut_ptr() as *mut u8, DType::I32, &[1]);
    let od1 = f32_desc(&mut got[..k], &[k as i64, 1]);
    let st = me.run(&OpCall::new(Op::GetRows, &[pd, badd], &[od1], p));
    assert_eq!(
        st,
        Status::InvalidArgument,
        "get_rows: id {n} of a {n}-row table"
    );
}

/// `prepare_weight_into` (the expert cache's slots): repacked in place, over the weight's own
/// bytes, it computes what the reference computes on the original; a layout larger than the
/// room given is declined with the memory untouched; a misaligned destination is refused.
#[test]
fn weights_repacked_in_place_match_the_reference() {
    let host = reference::serial_host();
    let refi = Instance::new(&reference::TABLE, &host);
    let mut rng = Rng::new(14);
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        let into = table
            .prepare_weight_into
            .expect("CPU backends offer prepare_weight_into");
        for (dt, k, n) in [(DType::Q4_1, 576usize, 64usize), (DType::Q4_K, 512, 32)] {
            let mut orig = weights(&mut rng, dt, k, n);
            let od = TensorDesc::contiguous(orig.as_mut_ptr(), dt, &[k as i64, n as i64]);
            // A 64-aligned slot with room to spare, holding the weight.
            let room = orig.len() + 4096;
            let mut slot = vec![0u64; room / 8 + 8];
            let base = (slot.as_mut_ptr() as usize).next_multiple_of(64) as *mut u8;
            // SAFETY: `room` bytes from `base` lie in `slot`.
            let bytes = unsafe { std::slice::from_raw_parts_mut(base, room) };
            bytes[..orig.len()].copy_from_slice(&orig);
            let wd = TensorDesc::contiguous(base, dt, &[k as i64, n as i64]);
            let mut pd = wd;
            // Too little room: declined, nothing written.
            let st = Status::from_raw(into(me.ctx, &wd, base, 64, &mut pd));
            assert_eq!(st, Status::Unsupported, "{isa:?} {dt}");
            assert_eq!(&bytes[..orig.len()], &orig[..]);
            let st = Status::from_raw(into(me.ctx, &wd, base.wrapping_add(8), room - 8, &mut pd));
            assert_eq!(st, Status::InvalidArgument, "{isa:?} {dt} misaligned");
            let st = Status::from_raw(into(me.ctx, &wd, base, room, &mut pd));
            assert_eq!(
                st,
                Status::Ok,
                "{isa:?} {dt}: {}",
                mollm_x86_common::last_error_string(table, me.ctx)
            );
            assert_eq!((pd.data, pd.buffer != 0), (base, true));
            for cols in [1usize, 2, 5, 16, 17] {
                let mut x = rng.data(k * cols, 1.0);
                let l = format!("{dt} repacked in place");
                check_mat_mul(&refi, &me, od, pd, &mut x, (k, n, cols), &l);
            }
            // Freeing the handle frees nothing of the caller's memory.
            (table.buffer_free.unwrap())(me.ctx, pd.buffer);
            bytes[0] ^= 1;
        }
    }
}

/// Weights of `dt` quantized row by row (as the converter and `Owned::quantized` do), each
/// case checked on every tier against the reference for every column count in `cols`.
fn check_row_quantized(
    seed: u64,
    cases: &[(DType, usize, usize)],
    scales: (f32, f32),
    cols: &[usize],
) {
    check_row_quantized_as(seed, cases, scales, cols, false)
}

/// As [`check_row_quantized`]; with `prepared`, through `prepare_weight` where the tier
/// offers it (the AVX-512 backend's repacked layouts).
fn check_row_quantized_as(
    seed: u64,
    cases: &[(DType, usize, usize)],
    (w_scale, x_scale): (f32, f32),
    cols: &[usize],
    prepared: bool,
) {
    let host = reference::scoped_threads_host(2);
    let refi = Instance::new(&reference::TABLE, &host);
    let mut rng = Rng::new(seed);
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        for &(dt, k, n) in cases {
            let src = rng.data(k * n, w_scale);
            let rb = quant::row_bytes(dt, k).unwrap();
            let mut w = vec![0u8; rb * n];
            for r in 0..n {
                quant::quantize_row(dt, &src[r * k..(r + 1) * k], &mut w[r * rb..(r + 1) * rb])
                    .unwrap();
            }
            let wd = TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]);
            let mut pd = wd;
            if prepared {
                let prep = table
                    .prepare_weight
                    .expect("CPU backends offer prepare_weight");
                let st = Status::from_raw(prep(me.ctx, &wd, &mut pd));
                if isa != Isa::Avx512 {
                    assert_eq!(st, Status::Unsupported, "{isa:?} repacks nothing");
                    continue;
                }
                assert_eq!(st, Status::Ok, "{dt} {k}x{n}");
            }
            for &c in cols {
                let mut x = rng.data(k * c, x_scale);
                check_mat_mul(
                    &refi,
                    &me,
                    wd,
                    pd,
                    &mut x,
                    (k, n, c),
                    &format!("{isa:?} {dt}"),
                );
            }
            if prepared {
                (table.buffer_free.unwrap())(me.ctx, pd.buffer);
            }
        }
    }
}

#[test]
fn float_mat_mul_matches_reference_backend_bit_for_bit() {
    check_row_quantized(
        13,
        &[
            (DType::F32, 100, 9),
            (DType::F16, 64, 8),
            (DType::F16, 7, 3),
        ],
        (1.0, 1.0),
        &[1, 2, 5, 17],
    );
}

/// mollm's W4G32 / W4G128 / W8PC weights (quantized per row, as the converter writes them):
/// the AVX2 and AVX-512 VNNI kernels against the reference, bit for bit, with full chunks of
/// eight groups and partial last chunks, one column (GEMV) and prompts.
#[test]
fn mollm_format_mat_mul_matches_reference_backend_bit_for_bit() {
    check_row_quantized(
        17,
        &[
            (DType::W4G32, 576, 40), // 18 groups: two full chunks and a tail
            (DType::W4G32, 32, 5),
            (DType::W4G128, 1024, 24), // 8 groups exactly
            (DType::W4G128, 896, 9),   // 7: only a partial chunk
            (DType::W4G128, 2304, 3),  // 18
            (DType::W8PC, 576, 33),
            (DType::W8PC, 64, 2),
        ],
        (0.7, 2.0),
        &[1, 2, 7, 17],
    );
}

/// W4G32 / W4G128 / W8PC weights repacked into 16-row groups by the AVX-512 backend
/// (`mollm_x86_common::wr16`), and row counts that are not a multiple of 16 (copied as they
/// are), against the reference, bit for bit: full and partial chunks of eight groups, GEMV and
/// the four-column GEMM tile with leftover columns.
#[test]
fn prepared_mollm_format_weights_match_reference_bit_for_bit() {
    check_row_quantized_as(
        19,
        &[
            (DType::W4G32, 576, 48),   // 18 groups
            (DType::W4G32, 32, 16),    // one group
            (DType::W4G128, 1024, 32), // 8 groups exactly
            (DType::W4G128, 896, 16),  // 7: only a partial chunk
            (DType::W4G128, 2304, 64), // 18
            (DType::W4G128, 256, 24),  // not repacked: 24 rows
            (DType::W8PC, 576, 32),    // 18 groups of 32 in 9 blocks
            (DType::W8PC, 64, 16),     // one block
            (DType::W8PC, 128, 8),     // not repacked: copied
        ],
        (0.7, 2.0),
        &[1, 2, 4, 5, 9],
        true,
    );
}

/// The AVX-512 activation quantization of the repacked path gives `Acts::quantize`'s codes,
/// scales and sums exactly: random columns, an all-zero group, a group whose amax is
/// subnormal (127/amax overflows), exact .5 ties (amax 127 makes the factor 1), big values.
#[test]
fn simd_activation_groups_match_the_scalar_ones() {
    if !Isa::Avx512.detected() {
        eprintln!("SKIP: no AVX-512 here");
        return;
    }
    let mut rng = Rng::new(23);
    for dt in [DType::W4G32, DType::W4G128, DType::W8PC] {
        let k = 512;
        let cols = 3;
        let mut x = rng.data(k * cols, 3.0);
        x[..128].fill(0.0);
        for (i, v) in x[128..256].iter_mut().enumerate() {
            *v = f32::from_bits(1 + i as u32) * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        for (i, v) in x[256..384].iter_mut().enumerate() {
            *v = (i as f32 - 64.0) + 0.5;
        }
        x[256] = 127.0;
        x[600] = 3.0e30;
        let xd = f32_desc(&mut x, &[k as i64, cols as i64]);
        // SAFETY: a contiguous F32 activation on this CPU (AVX-512 detected).
        let simd = unsafe { mollm_x86_common::wr16::quantize_acts(dt, &xd) }.unwrap();
        let scalar = unsafe { mollm_cpu_common::wmatmul::Acts::quantize(dt, &xd) }.unwrap();
        assert_eq!(simd.aq, scalar.aq, "{dt} codes");
        assert_eq!(simd.asum, scalar.asum, "{dt} sums");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&simd.ad), bits(&scalar.ad), "{dt} scales");
        assert_eq!((simd.ga, simd.gpad), (scalar.ga, scalar.gpad));
    }
}

/// Host buffers (ABI 1.2, what the engine's activation arena comes from): 64-byte aligned,
/// zeroed, writable memory behind a handle; a handle that is not a host buffer has no
/// address; a host buffer is refused where a prepared weight is expected; freeing works.
#[test]
fn host_buffers_are_aligned_host_memory_and_not_weights() {
    let host = reference::scoped_threads_host(2);
    for (_, table) in tables() {
        let me = Instance::new(table, &host);
        let (alloc, ptr, free) = (
            table.buffer_alloc.expect("CPU backends lend host buffers"),
            table
                .buffer_host_ptr
                .expect("CPU backends lend host buffers"),
            table.buffer_free.unwrap(),
        );
        let mut h = 0u64;
        assert_eq!(Status::from_raw(alloc(me.ctx, 5000, &mut h)), Status::Ok);
        assert_ne!(h, 0);
        let p = ptr(me.ctx, h);
        assert!(!p.is_null() && p as usize % 64 == 0);
        // SAFETY: 5000 bytes lent by the backend.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, 5000) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes.fill(7);
        assert!(ptr(me.ctx, h + 1000).is_null());
        assert_eq!(
            Status::from_raw(alloc(me.ctx, 0, &mut h)),
            Status::InvalidArgument
        );
        // Passed as a "prepared weight", the host buffer is refused.
        let mut w = TensorDesc::contiguous(p, DType::Q8_0, &[32, 4]);
        w.buffer = h;
        let mut x = vec![1f32; 32];
        let mut o = vec![0f32; 4];
        let (ins, outs) = ([w, f32_desc(&mut x, &[32, 1])], [f32_desc(&mut o, &[4, 1])]);
        let call = OpCall::new(Op::MatMul, &ins, &outs, OpParams::default());
        assert_ne!(me.run(&call), Status::Ok);
        free(me.ctx, h);
        assert!(ptr(me.ctx, h).is_null());
    }
}

/// `cols` random activation rows of `k` elements, quantized for `kernel` on `dt` weights
/// (Q8_K rows of 292 bytes per 256 elements for the K-quants), one after another.
fn random_acts(rng: &mut Rng, kernel: Kernel, dt: DType, k: usize, cols: usize) -> Vec<u8> {
    let ab = 292 * (k / 256);
    (0..cols)
        .flat_map(|_| {
            let x = rng.data(k, 1.0);
            let mut a = vec![0u8; ab];
            quant::quantize_activations_for(kernel, dt, &x, &mut a).unwrap();
            a
        })
        .collect()
}

/// The AMX tile of repacked Q4_K (where this CPU and kernel have AMX) equals the VNNI tile
/// and ggml's GEMM chain bit for bit: on random weights and activations, and at the largest
/// integer sums the format allows (nibbles 15, scales and mins 63, activations -128, bsums
/// -4096 per sub-block), where `s * sc` and `b * m` must stay exact in f32.
#[test]
fn amx_q4_k_tile_matches_vnni_tile_and_the_gemm_chain() {
    use mollm_x86_common::{amx, kq512, q4k16};
    if !Isa::Avx512.detected() || !amx::available() {
        eprintln!("no AMX int8 here (or MOLLM_AMX=0): the AMX tile is not tested");
        return;
    }
    // 32 columns: two tiles, one call of the two-tile kernel and one of the one-tile kernel
    // on the first.
    let (k, rows, cols) = (512usize, 16usize, 32usize);
    let nb = k / 256;
    let (rb, ab) = (quant::row_bytes(DType::Q4_K, k).unwrap(), 292 * nb);
    let mut rng = Rng::new(31);
    let random = (
        weights(&mut rng, DType::Q4_K, k, rows),
        random_acts(&mut rng, Kernel::RepackGemm, DType::Q4_K, k, cols),
    );
    // Extremes: d = dmin = 1.0 (f16 0x3C00), every 6-bit scale and min 63, every nibble 15;
    // activations d = 1.0, every quant -128.
    let mut wx = vec![0u8; rb * rows];
    for b in wx.chunks_exact_mut(144) {
        b[..4].copy_from_slice(&[0x00, 0x3C, 0x00, 0x3C]);
        b[4..].fill(0xFF);
    }
    let mut ax = vec![0u8; ab * cols];
    for b in ax.chunks_exact_mut(292) {
        b[..4].copy_from_slice(&1f32.to_le_bytes());
        b[4..260].fill(0x80);
        for s in b[260..].chunks_exact_mut(2) {
            s.copy_from_slice(&(-2048i16).to_le_bytes());
        }
    }
    for (label, (w, a)) in [("random", random), ("extremes", (wx, ax))] {
        let mut rep = vec![q4k16::Line([0; 64]); q4k16::repacked_bytes(k, rows) / 64];
        let rep_bytes =
            unsafe { std::slice::from_raw_parts_mut(rep.as_mut_ptr() as *mut u8, rep.len() * 64) };
        q4k16::repack(&w, rb, k, rows, rep_bytes);
        let mut packed = vec![0u8; nb * kq512::Q8K_T16_BLOCK];
        let ps = nb * q4k16::AMX_BLOCK;
        let mut packed_amx = vec![0u8; 2 * ps];
        let (mut vnni, mut tiles) = (vec![0f32; rows * 16], vec![0f32; rows * cols]);
        let mut one = vec![0f32; rows * 16];
        // SAFETY: AVX-512 and AMX checked above; the buffers hold what each kernel reads and
        // writes (one 16-row group, 16 columns of nb blocks, outputs of stride `rows`).
        unsafe {
            kq512::pack_q8k_t16(a.as_ptr(), ab, nb, packed.as_mut_ptr());
            let wp = rep_bytes.as_ptr();
            q4k16::tile_avx512(wp, nb, packed.as_ptr(), vnni.as_mut_ptr(), rows);
            let pa = packed_amx.as_mut_ptr();
            q4k16::pack_amx(a.as_ptr(), ab, nb, pa);
            q4k16::pack_amx(a[16 * ab..].as_ptr(), ab, nb, pa.add(ps));
            let t = amx::Tiles::<32>::load();
            q4k16::tile_amx::<2>(&t, wp, nb, pa, ps, tiles.as_mut_ptr(), rows);
            q4k16::tile_amx::<1>(&t, wp, nb, pa, ps, one.as_mut_ptr(), rows);
        }
        for c in 0..cols {
            for r in 0..rows {
                let want = quant::dot_with(
                    Kernel::RepackGemm,
                    DType::Q4_K,
                    k,
                    &w[r * rb..(r + 1) * rb],
                    &a[c * ab..(c + 1) * ab],
                );
                let t = tiles[c * rows + r];
                assert_eq!(t.to_bits(), want.to_bits(), "{label}: AMX row {r} col {c}");
                if c < 16 {
                    let (v, o) = (vnni[c * rows + r], one[c * rows + r]);
                    assert_eq!(v.to_bits(), want.to_bits(), "{label}: VNNI row {r} col {c}");
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "{label}: AMX x1 row {r} col {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn amx_q6_k_tile_matches_the_tiled_chain() {
    use mollm_x86_common::{amx, q6kamx};
    if !Isa::Avx512.detected() || !amx::available() {
        eprintln!("no AMX int8 here (or MOLLM_AMX=0): the AMX Q6_K tile is not tested");
        return;
    }
    // 32 columns: one call of the two-tile kernel, one of the one-tile kernel on the first.
    let (k, rows, cols) = (768usize, 16usize, 32usize);
    let nb = k / 256;
    let (rb, ab) = (quant::row_bytes(DType::Q6_K, k).unwrap(), 292 * nb);
    let mut rng = Rng::new(37);
    let random = (
        weights(&mut rng, DType::Q6_K, k, rows),
        random_acts(&mut rng, Kernel::Tiled, DType::Q6_K, k, cols),
    );
    // Extremes: every code 0 (q - 32 = -32), every scale -128, d = 1.0; activations d = 1.0,
    // every quant -128 (their 16-element sums -2048): the largest |sum| the chain can meet.
    let mut wx = vec![0u8; rb * rows];
    for b in wx.chunks_exact_mut(210) {
        b[..192].fill(0);
        b[192..208].fill(0x80);
        b[208..].copy_from_slice(&[0x00, 0x3C]);
    }
    let mut ax = vec![0u8; ab * cols];
    for b in ax.chunks_exact_mut(292) {
        b[..4].copy_from_slice(&1f32.to_le_bytes());
        b[4..260].fill(0x80);
        for s in b[260..].chunks_exact_mut(2) {
            s.copy_from_slice(&(-2048i16).to_le_bytes());
        }
    }
    for (label, (w, a)) in [("random", random), ("extremes", (wx, ax))] {
        let mut prow = vec![0u8; nb * q6kamx::ROW_BLOCK];
        let ps = nb * q6kamx::ACT_BLOCK;
        let mut pact = vec![0u8; 2 * ps];
        let (mut out, mut one) = (vec![0f32; rows * cols], vec![0f32; rows * 16]);
        // SAFETY: AVX-512 and AMX checked above; the buffers hold what each call reads and
        // writes (16 rows, 16 columns of nb blocks, outputs of stride `rows`).
        unsafe {
            q6kamx::pack_rows(w.as_ptr(), rb, nb, prow.as_mut_ptr());
            let pa = pact.as_mut_ptr();
            q6kamx::pack_act(a.as_ptr(), ab, nb, pa);
            q6kamx::pack_act(a[16 * ab..].as_ptr(), ab, nb, pa.add(ps));
            let t = amx::Tiles::<64>::load();
            q6kamx::tile::<2>(&t, prow.as_ptr(), nb, pa, ps, out.as_mut_ptr(), rows);
            q6kamx::tile::<1>(&t, prow.as_ptr(), nb, pa, ps, one.as_mut_ptr(), rows);
        }
        for c in 0..cols {
            for r in 0..rows {
                let want = quant::dot_with(
                    Kernel::Tiled,
                    DType::Q6_K,
                    k,
                    &w[r * rb..(r + 1) * rb],
                    &a[c * ab..(c + 1) * ab],
                );
                let t = out[c * rows + r];
                assert_eq!(t.to_bits(), want.to_bits(), "{label}: AMX row {r} col {c}");
                if c < 16 {
                    let o = one[c * rows + r];
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "{label}: AMX x1 row {r} col {c}"
                    );
                }
            }
        }
    }
}
