//! The backend on a Vulkan adapter (lavapipe in CI: `MOLLM_REQUIRE_VULKAN=1` makes a missing
//! adapter a failure instead of a skip), and what it says where there is no device.

use super::*;
use abi::{DeviceKind, Op, OpCall, OpParams, TensorDesc};
use mollm_gpu_common::{host, ops, weights, weights::DevWeight, Device, Launch};

/// Opens the Vulkan adapter for this test process; false (with a note) when there is none.
fn device() -> bool {
    if !cfg!(target_vendor = "apple") {
        std::env::set_var(ADAPTER_ENV, "vulkan");
    }
    match gpu::gpu() {
        Ok(_) => true,
        Err(why) => {
            assert!(
                !abi::settings::REQUIRE_VULKAN.on(false),
                "MOLLM_REQUIRE_VULKAN=1 but no adapter: {why}"
            );
            eprintln!("SKIPPED: no Vulkan adapter here ({why}); install mesa-vulkan-drivers");
            false
        }
    }
}

#[test]
fn header_and_the_reason_without_a_device() {
    // SAFETY: a static header.
    let h = unsafe { &*mollm_backend_entry() };
    h.check_layout().unwrap();
    let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
    assert_eq!(name.to_str().unwrap(), "metal");
    assert_eq!(h.device_kind, DeviceKind::Gpu as u32);
    if !cfg!(target_vendor = "apple") {
        let why = gpu::requested(None).unwrap_err();
        assert!(why.starts_with("no Metal device"), "{why}");
        assert!(gpu::requested(Some("metal")).is_err());
    }
    assert_eq!(gpu::requested(Some("vulkan")), Ok(wgpu::Backends::VULKAN));
    let bad = gpu::requested(Some("cuda")).unwrap_err();
    assert!(bad.contains("expected metal or vulkan"), "{bad}");
}

#[test]
fn every_kernel_compiles() {
    if !device() {
        return;
    }
    gpu::gpu().unwrap().compile_all().unwrap();
}

fn report(cases: u64) -> conformance::Report {
    let host = reference::serial_host();
    conformance::check_backend_report(&TABLE, &host, cases).unwrap()
}

/// Every op passes the gate (per-op tolerances) for every format the kernels take, on the
/// prepared-weight path too; the formats it declines are skipped with the reason, and so are
/// the recurrent models' ops (ssm_conv, gated_delta_net, rwkv_wkv7, norm, l2_norm,
/// token_shift), which have no kernel.
#[test]
fn conformance_on_the_device() {
    if !device() {
        return;
    }
    let r = report(abi::WEIGHT_DTYPES.len() as u64);
    eprintln!("{r}");
    assert!(r.ok(), "{r}");
    let no_kernel = [
        Op::SsmConv,
        Op::GatedDeltaNet,
        Op::RwkvWkv7,
        Op::Norm,
        Op::L2Norm,
        Op::TokenShift,
    ];
    for &op in Op::ALL.iter().filter(|op| !no_kernel.contains(op)) {
        assert!(
            r.passed.iter().any(|p| p.op == op),
            "{} never ran\n{r}",
            op.name()
        );
    }
    use abi::DType::*;
    // No GPU kernel yet: declined with the reason, and the CPU runs them.
    for op in no_kernel {
        let why = r.skipped(op, F32);
        assert!(
            !why.is_empty() && why.iter().all(|w| w.contains("not implemented on GPU")),
            "{}: {why:?}\n{r}",
            op.name()
        );
    }
    for dt in [
        F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, W4G32, W4G128, W8PC,
    ] {
        assert!(r.passed(Op::MatMul, dt), "mat_mul {dt} did not pass\n{r}");
    }
    for dt in [Q2_K, Q3_K] {
        let why = r.skipped(Op::MatMul, dt);
        assert!(
            why.iter().any(|w| w.contains("not taken by metal")),
            "{dt}: {why:?}"
        );
    }
}

/// A deliberately wrong kernel is refused by the gate, naming the op and the element.
#[test]
fn a_broken_kernel_is_refused() {
    if !device() {
        return;
    }
    ops::BROKEN.with(|b| *b.borrow_mut() = Some("rms_norm"));
    let r = report(2);
    ops::BROKEN.with(|b| *b.borrow_mut() = None);
    let failed: Vec<_> = r.failed.iter().map(|(op, _)| *op).collect();
    assert_eq!(failed, vec![Op::RmsNorm], "{r}");
    assert!(r.failed[0].1.contains("element 0"), "{r}");
}

/// A weight too large for one storage binding runs in chunks of rows, with the same result.
#[test]
fn weights_split_into_chunks() {
    if !device() {
        return;
    }
    let gpu = gpu::gpu().unwrap();
    let (k, n) = (64usize, 40usize);
    let src: Vec<f32> = (0..k * n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let row = quant::row_bytes(abi::DType::Q8_0, k).unwrap();
    let mut w = vec![0u8; row * n];
    for (r, d) in src.chunks(k).zip(w.chunks_mut(row)) {
        quant::quantize_row(abi::DType::Q8_0, r, d).unwrap();
    }
    let whole =
        DevWeight::upload(gpu, abi::DType::Q8_0, k, n, |r| &w[r * row..(r + 1) * row]).unwrap();
    assert_eq!(whole.chunks.len(), 1);
    let split = weights::DevWeight::upload_chunked(gpu, abi::DType::Q8_0, k, n, 7, |r| {
        &w[r * row..(r + 1) * row]
    })
    .unwrap();
    assert_eq!(split.chunks.len(), 6);
    assert_eq!(split.chunks[5].rows, 5);
    let x: Vec<f32> = (0..k * 3).map(|i| (i as f32 * 0.37).sin()).collect();
    let sums = vec![0f32; 3 * k / 32];
    let run = |l: &[Launch<'_, wgpu::Buffer>], ob: &wgpu::Buffer, size| gpu.run(l, ob, size);
    let a = ops::product(gpu, &whole, host::bytes(&x), host::bytes(&sums), 3, run).unwrap();
    let b = ops::product(gpu, &split, host::bytes(&x), host::bytes(&sums), 3, run).unwrap();
    assert_eq!(a, b, "the same rows, the same kernel: the same bits");
    // And the values are the weight's: column 1, row 39 against the reference dequantization.
    let mut deq = vec![0f32; k];
    quant::dequantize_row(abi::DType::Q8_0, &w[39 * row..40 * row], &mut deq).unwrap();
    let want: f32 = deq.iter().zip(&x[k..2 * k]).map(|(a, b)| a * b).sum();
    let got = host::f32s(&a)[n + 39];
    assert!(
        (got - want).abs() < 1e-4 * want.abs().max(1.0),
        "{got} vs {want}"
    );
}

/// How far the device's mat_mul is from the reference's, per format (printed; bounded).
#[test]
fn mat_mul_error_against_the_reference() {
    if !device() {
        return;
    }
    let host = reference::serial_host();
    let mut inst = core::ptr::null_mut();
    assert_eq!((TABLE.init)(&host, &mut inst), 0);
    let (k, n, m) = (768usize, 256usize, 16usize);
    let mut seed = 12345u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 2.0
    };
    let w: Vec<f32> = (0..k * n).map(|_| rnd() * 0.1).collect();
    let mut x: Vec<f32> = (0..k * m).map(|_| rnd()).collect();
    for v in x.iter_mut().step_by(97) {
        *v *= 30.0;
    }
    use abi::DType::*;
    for dt in [Q4_1, Q8_0, Q4_K, Q6_K, Q5_0] {
        let rb = quant::row_bytes(dt, k).unwrap();
        let mut wb = vec![0u8; rb * n];
        for (r, d) in w.chunks(k).zip(wb.chunks_mut(rb)) {
            quant::quantize_row(dt, r, d).unwrap();
        }
        let wd = TensorDesc::contiguous(wb.as_mut_ptr(), dt, &[k as i64, n as i64]);
        let xd = TensorDesc::contiguous(x.as_mut_ptr() as *mut u8, F32, &[k as i64, m as i64]);
        let mut got = vec![0f32; n * m];
        let mut want = vec![0f32; n * m];
        let od = TensorDesc::contiguous(got.as_mut_ptr() as *mut u8, F32, &[n as i64, m as i64]);
        let rd = TensorDesc::contiguous(want.as_mut_ptr() as *mut u8, F32, &[n as i64, m as i64]);
        let p = OpParams::default();
        assert_eq!(
            (TABLE.compute)(inst, &OpCall::new(Op::MatMul, &[wd, xd], &[od], p)),
            0
        );
        unsafe { reference::run(&host, Op::MatMul, &[wd, xd], &[rd], &p).unwrap() };
        let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{dt}: max |device - reference| = {err:e} ({:e} of the largest output)",
            err / scale
        );
        assert!(err / scale < 1e-4, "{dt}: {err} of {scale}");
    }
    (TABLE.shutdown)(inst);
}

/// Whether the reference's own order is what the kernels follow for this case, so the device
/// must give its bits: all but libm's `expf` / `tanhf` (softmax and SiLU tails of a row's
/// last k % 16 elements, attention over a cache not a whole number of 16-row blocks, soft
/// capping) and the formats whose kernels sum in their own order (Q2_K, Q3_K, Q5_K,
/// mollm's W4/W8, F32/F16/BF16 weights).
fn exact_case(c: &conformance::cases::Case) -> bool {
    use abi::DType::*;
    match c.op {
        Op::MatMul => matches!(
            conformance::cases::format(c),
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q6_K
        ),
        Op::Glu => {
            abi::GluAttrs::from_params(&c.params).act != abi::GLU_SILU
                || c.inputs[0].shape[0] % 16 == 0
        }
        Op::Softmax => c.inputs[0].shape[0] % 16 == 0,
        Op::Attention => {
            c.inputs[1].shape[2] % 16 == 0
                && abi::AttentionAttrs::from_params(&c.params).softcap == 0.0
        }
        _ => true,
    }
}

/// Every op whose kernel follows the reference's float chain gives the reference's bits on
/// the device (lavapipe: its `fma` rounds twice, so this also checks the emulated one).
#[test]
fn ops_match_the_reference_bit_for_bit() {
    if !device() {
        return;
    }
    let host = reference::serial_host();
    let dev = conformance::Instance::open(&TABLE, &host).unwrap();
    let refr = conformance::Instance::open(&reference::TABLE, &host).unwrap();
    let (mut bad, mut exact) = (Vec::new(), 0);
    for &op in Op::ALL {
        for (name, mut c) in conformance::cases::cases(op, 24) {
            if !exact_case(&c) || conformance::declines(&dev, &mut c).is_some() {
                continue;
            }
            let want = refr.run(&mut c.clone()).unwrap();
            let got = dev.run(&mut c).unwrap();
            let (mut n, mut diff) = (0, 0);
            for (g, w) in got.iter().zip(&want) {
                for (a, b) in g.chunks(4).zip(w.chunks(4)) {
                    n += 1;
                    diff += (a != b) as usize;
                }
            }
            exact += 1;
            if diff > 0 {
                bad.push(format!(
                    "{} {name} ({}): {diff} of {n} values differ",
                    op.name(),
                    c.label
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(exact > 200, "only {exact} cases were checked");
}

/// `fma_x`, the kernels' fma rounded once: on this device (whose own `fma` may round twice:
/// lavapipe's does) it equals the CPU's `mul_add` on triples of every sign and a wide spread
/// of magnitudes, cancellations and ties included.
#[test]
fn emulated_fma_rounds_once() {
    if !device() {
        return;
    }
    let gpu = gpu::gpu().unwrap();
    let mut rng = conformance::cases::Rng::new(7);
    let mut abc = Vec::new();
    for i in 0..200_000u32 {
        let mut f = |span: u64| {
            let m = 1.0 + rng.below(1 << 23) as f32 / (1u32 << 23) as f32;
            let e = rng.below(span) as i32 - span as i32 / 2;
            let s = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            s * m * 2f32.powi(e)
        };
        let (a, b) = (f(40), f(40));
        let c = match i % 4 {
            // c cancelling most of a*b: the hard cases.
            0 => -(a * b) * (1.0 + f(2) * 2f32.powi(-20)),
            1 => -(a * b),
            _ => f(60),
        };
        abc.push([a, b, c, 0.0]);
    }
    // Products of few bits whose exact value ties between two floats.
    let t = 1.0 + 2f32.powi(-12);
    abc.push([t, t, -(1.0 + 2f32.powi(-11)), 0.0]);
    abc.push([t, t, 0.0, 0.0]);
    abc.push([t, -t, 1.0, 0.0]);
    let got = gpu.fma(&abc, true).unwrap();
    let bad: Vec<_> = abc
        .iter()
        .zip(&got)
        .filter(|([a, b, c, _], g)| a.mul_add(*b, *c).to_bits() != g.to_bits())
        .take(5)
        .map(|([a, b, c, _], g)| {
            format!(
                "fma({a:e}, {b:e}, {c:e}) = {:e}, got {g:e}",
                a.mul_add(*b, *c)
            )
        })
        .collect();
    assert!(bad.is_empty(), "fma_x differs:\n{}", bad.join("\n"));
    eprintln!("device fma rounds once: {}", gpu.fma_fused);
}

/// The block formats' matmul in every chain the reference picks by shape (vec_dot, tinyBLAS,
/// repack GEMV and GEMM, tiled: rows a multiple of 8 or not, 1 to 9 columns) gives the
/// reference's bits on the device.
#[test]
fn block_format_matmuls_match_the_reference_in_every_chain() {
    if !device() {
        return;
    }
    use abi::DType::*;
    use conformance::cases::{Case, Owned, Rng};
    let host = reference::serial_host();
    let dev = conformance::Instance::open(&TABLE, &host).unwrap();
    let refr = conformance::Instance::open(&reference::TABLE, &host).unwrap();
    let mut r = Rng::new(11);
    let mut bad = Vec::new();
    for dt in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K] {
        for n in [8i64, 13] {
            for m in [1i64, 3, 4, 7, 8, 9] {
                let k = dt.info().block_len as i64 * 2;
                let mut c = Case {
                    op: Op::MatMul,
                    label: format!("{dt} k={k} n={n} m={m}"),
                    inputs: vec![
                        Owned::quantized(dt, &[k, n], &r.vec((k * n) as usize, 0.5)),
                        Owned::f32(&[k, m], &r.vec((k * m) as usize, 1.0)),
                    ],
                    outputs: vec![Owned::zeros(F32, &[n, m])],
                    params: OpParams::default(),
                };
                assert!(conformance::declines(&dev, &mut c).is_none(), "{}", c.label);
                let want = refr.run(&mut c.clone()).unwrap();
                let got = dev.run(&mut c).unwrap();
                if got != want {
                    bad.push(c.label.clone());
                }
            }
        }
    }
    assert!(bad.is_empty(), "differ from the reference: {bad:?}");
}

/// Operands in device memory (`buffer_alloc`, ABI 1.7) give the bytes of the same call in
/// host memory, for every op with a kernel (all but the recurrent models' ops):
/// the engine's activations and KV cache can stay on the device.
#[test]
fn every_op_takes_device_operands() {
    if !device() {
        return;
    }
    let host = reference::serial_host();
    let dev = conformance::Instance::open(&TABLE, &host).unwrap();
    let mut missing = Vec::new();
    for &op in Op::ALL {
        let mut moved = 0;
        for (name, mut c) in conformance::cases::cases(op, 6) {
            if conformance::declines(&dev, &mut c).is_some() {
                continue;
            }
            let mut on_dev = c.clone();
            let want = dev.run(&mut c).unwrap();
            if let Some(got) = dev.run_on_device(&mut on_dev).unwrap() {
                assert_eq!(got, want, "{} {name} ({})", op.name(), c.label);
                moved += 1;
            }
        }
        // The recurrent models' ops have no GPU kernel (every case declined
        // above).
        let no_kernel = matches!(
            op,
            Op::SsmConv | Op::GatedDeltaNet | Op::RwkvWkv7 | Op::Norm | Op::L2Norm | Op::TokenShift
        );
        if moved == 0 && !no_kernel {
            missing.push(op.name());
        }
    }
    assert!(
        missing.is_empty(),
        "no case ran on device operands: {missing:?}"
    );
}
