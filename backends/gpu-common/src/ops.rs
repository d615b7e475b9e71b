//! One function per op: its operands on the device (host ones uploaded, device ones copied in
//! queue order, see [`crate::mem`]), its kernels queued, its result delivered: scattered into
//! host memory after a wait, or copied into a device buffer with none.

use crate::host::{self, bytes};
use crate::weights::{DevWeight, Layout};
use crate::{Ctx, Device, Error, Launch};
use abi::{DType, Op, OpParams, TensorDesc};
use numerics::rope::{corr_dims, rope_cache};
use std::sync::{Arc, OnceLock};

/// get_rows tables above this many bytes are refused (they would be decoded and uploaded on
/// every call: only mat_mul weights are offered to `prepare_weight`).
pub const GET_ROWS_MAX_BYTES: u64 = 16 << 20;

/// Why the GPUs decline ssm_conv (in `check`, so `supports` already says so): no kernel has
/// been written for it yet; a CPU backend takes the call.
pub const NO_SSM_CONV: &str =
    "ssm_conv is not implemented on GPU backends yet (no kernel: a CPU backend runs it)";

/// Why the GPUs decline gated_delta_net (in `check` too), as [`NO_SSM_CONV`].
pub const NO_GATED_DELTA_NET: &str =
    "gated_delta_net is not implemented on GPU backends yet (no kernel: a CPU backend runs it)";

/// Why the GPUs decline rwkv_wkv7 (in `check` too), as [`NO_SSM_CONV`].
pub const NO_RWKV_WKV7: &str =
    "rwkv_wkv7 is not implemented on GPU backends yet (no kernel: a CPU backend runs it)";

/// Why the GPUs decline RWKV-7's other ops (norm, l2_norm, token_shift; in `check` too), as
/// [`NO_SSM_CONV`]: they run beside rwkv_wkv7, which has no kernel either.
pub const NO_RWKV_OPS: &str = "norm, l2_norm and token_shift are not implemented on GPU \
                               backends yet (no kernel: a CPU backend runs them)";

fn dt(t: &TensorDesc) -> DType {
    t.dtype().expect("validated")
}

fn n_el(t: &TensorDesc) -> usize {
    t.numel().expect("validated") as usize
}

/// # Safety
/// A validated call on valid host memory (and weights this context prepared).
pub unsafe fn run<D: Device>(
    ctx: &Ctx<D>,
    op: Op,
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    match op {
        Op::MatMul => mat_mul(ctx, &ins[0], &ins[1], &outs[0], p),
        Op::GetRows => get_rows(ctx, &ins[0], &ins[1], &outs[0]),
        Op::RmsNorm => {
            let (x, w, out) = (&ins[0], &ins[1], &outs[0]);
            let k = x.ne[0] as u32;
            let rows = x.nrows() as u32;
            let meta = [k, rows, abi::RmsNormAttrs::from_params(p).eps.to_bits()];
            rowwise(ctx, "rms_norm", &meta, &[x, w], out, rows)
        }
        Op::Softmax => {
            let (x, out) = (&ins[0], &outs[0]);
            let rows = x.nrows() as u32;
            let meta = [
                x.ne[0] as u32,
                rows,
                abi::SoftmaxAttrs::from_params(p).scale.to_bits(),
            ];
            rowwise(ctx, "softmax", &meta, &[x], out, rows)
        }
        Op::Argmax => {
            let (x, out) = (&ins[0], &outs[0]);
            let rows = x.nrows() as u32;
            rowwise(ctx, "argmax", &[x.ne[0] as u32, rows], &[x], out, rows)
        }
        Op::Glu => glu(
            ctx,
            &ins[0],
            &ins[1],
            &outs[0],
            abi::GluAttrs::from_params(p).act,
        ),
        Op::Add | Op::Mul | Op::Scale => elementwise(ctx, op, ins, &outs[0], p),
        Op::Rope => rope(ctx, &ins[0], &ins[1], &outs[0], p),
        Op::Attention => crate::attention::run(ctx, ins, &outs[0], p),
        Op::SetRows => set_rows(ctx, &ins[0], &ins[1], &ins[2], &outs[0]),
        Op::SsmConv => Err(Error::Unsupported(NO_SSM_CONV.into())),
        Op::GatedDeltaNet => Err(Error::Unsupported(NO_GATED_DELTA_NET.into())),
        Op::RwkvWkv7 => Err(Error::Unsupported(NO_RWKV_WKV7.into())),
        Op::Norm | Op::L2Norm | Op::TokenShift => Err(Error::Unsupported(NO_RWKV_OPS.into())),
    }
}

/// Names a kernel whose results are made wrong on purpose, to test that the conformance gate
/// refuses it (and the engine then runs that op on the CPU).
pub const BROKEN_ENV: &str = abi::settings::GPU_BROKEN.name;

thread_local! {
    /// The same for one thread (unit tests, which share a process).
    pub static BROKEN: std::cell::RefCell<Option<&'static str>> = const { std::cell::RefCell::new(None) };
}

/// Whether `kernel` is to be broken ([`BROKEN_ENV`]).
fn broken(kernel: &str) -> bool {
    BROKEN.with(|b| *b.borrow() == Some(kernel))
        || abi::settings::GPU_BROKEN.list().iter().any(|k| k == kernel)
}

/// Kernels whose operands are the meta words, the inputs packed, and the output: `groups`
/// groups.
unsafe fn rowwise<D: Device>(
    ctx: &Ctx<D>,
    kernel: &'static str,
    meta: &[u32],
    inputs: &[&TensorDesc],
    out: &TensorDesc,
    groups: u32,
) -> Result<(), Error> {
    let mut bufs = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        bufs.push(ctx.input(t, &format!("input {i}"))?);
    }
    let size = (n_el(out) * 4) as u64;
    let ob = ctx.dev.empty("output", size)?;
    let mut refs: Vec<&D::Buf> = bufs.iter().collect();
    refs.push(&ob);
    let launch = Launch {
        kernel,
        meta: meta.to_vec(),
        bufs: refs,
        groups,
    };
    ctx.deliver(&[launch], &ob, out, |r| {
        if broken(kernel) && r.len() >= 4 {
            // A wrong kernel's result: the first element off by a quarter (and one more).
            let x = f32::from_le_bytes(r[..4].try_into().unwrap());
            r[..4].copy_from_slice(&(x * 1.25 + 1.0).to_le_bytes());
        }
    })
}

/// act(gate) * up, rows of gate's `ne[0]`; GELU reads ggml's table (the reference's own
/// values), uploaded once per context.
unsafe fn glu<D: Device>(
    ctx: &Ctx<D>,
    gate: &TensorDesc,
    up: &TensorDesc,
    out: &TensorDesc,
    act: i64,
) -> Result<(), Error> {
    let gpu = ctx.dev;
    let n = n_el(gate) as u32;
    let table = match ctx.gelu.get() {
        Some(t) => t,
        None => {
            let t = gpu.upload("gelu table", bytes(numerics::gelu_table()))?;
            ctx.gelu.get_or_init(|| t)
        }
    };
    let gb = ctx.input(gate, "gate")?;
    let ub = ctx.input(up, "up")?;
    let size = n as u64 * 4;
    let ob = gpu.empty("output", size)?;
    let launch = Launch {
        kernel: "glu",
        meta: vec![n, act as u32, gate.ne[0].max(1) as u32],
        bufs: vec![&gb, &ub, table, &ob],
        groups: n.div_ceil(64),
    };
    ctx.deliver(&[launch], &ob, out, |_| {})
}

unsafe fn mat_mul<D: Device>(
    ctx: &Ctx<D>,
    w: &TensorDesc,
    x: &TensorDesc,
    out: &TensorDesc,
    p: &OpParams,
) -> Result<(), Error> {
    let gpu = ctx.dev;
    let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
    let cols = x.nrows() as usize;
    if cols == 0 || n == 0 {
        return Ok(());
    }
    let dev: Arc<DevWeight<D::Buf>> = if w.buffer != 0 {
        ctx.weight(w.buffer)?
    } else {
        Arc::new(DevWeight::upload(gpu, dt(w), k, n, |r| host::row(w, r))?)
    };
    let group = match dev.layout {
        Layout::Grouped { group } => group,
        Layout::Dense => 0,
    };
    let done = |l: &[Launch<'_, D::Buf>], ob: &D::Buf, _: u64| ctx.deliver(l, ob, out, |_| {});
    match exact_chain(dt(w), k, n, cols, abi::MatMulAttrs::from_params(p).chain()) {
        Some(chain) => {
            let xb = ctx.input(x, "activations")?;
            product_exact(gpu, &dev, dt(w), &chain, &xb, cols, done)
        }
        None => {
            let (xs, sums) = dot_format(dt(w), k, group, &ctx.host_bytes(x)?)?;
            product(gpu, &dev, bytes(&xs), bytes(&sums), cols, done)
        }
    }
}

/// Whether a mat_mul call converts its activations on the device (an exact chain).
pub fn exact(ins: &[TensorDesc], p: &OpParams) -> bool {
    let (w, x) = (&ins[0], &ins[1]);
    let Some(d) = w.dtype() else { return false };
    let (k, n, cols) = (
        w.ne[0] as usize,
        w.ne[1] as usize,
        x.nrows().max(0) as usize,
    );
    exact_chain(d, k, n, cols, abi::MatMulAttrs::from_params(p).chain()).is_some()
}

/// Columns one `matmul_x` invocation computes (it reads the row's weights once for them):
/// MOLLM_GPU_X_TILE (1..=8), default 8 (lavapipe, SmolLM2 pp128: 5.8 t/s at 1, 7.6 at 4, 8.0
/// at 8).
fn x_tile() -> u32 {
    static T: OnceLock<u32> = OnceLock::new();
    tile(&T, &abi::settings::GPU_X_TILE, 8)
}

/// Columns one `matmul_k` invocation computes: MOLLM_GPU_K_TILE (1..=4), default 4.
fn k_tile() -> u32 {
    static T: OnceLock<u32> = OnceLock::new();
    tile(&T, &abi::settings::GPU_K_TILE, 4)
}

/// `env`'s tile size (1..=`max`), read once into `cell`; `max` where unset.
fn tile(cell: &OnceLock<u32>, env: &abi::settings::Setting, max: u32) -> u32 {
    *cell.get_or_init(|| env.int_or(max as u64).clamp(1, max as u64) as u32)
}

/// How a block-format product follows the reference's float order (see [`exact_chain`]).
pub enum Chain {
    /// Q4_0..Q8_0 (`matmul_x`): 8 accumulator lanes (`vec_dot`, tinyBLAS) or 1 (Q4_0's
    /// repack layout), the same for every column.
    Legacy { lanes: u32 },
    /// Q4_K / Q6_K (`matmul_k`): each column's chain (0..=5, as the kernel numbers them).
    K { modes: Vec<u32> },
}

/// The chain of the x86 kernel the reference uses for each column of this call
/// (`quant::matmul_kernel_in`). `None`: another format, or columns of a legacy format that
/// mix chains; then the order-free kernels run.
fn exact_chain(dt: DType, k: usize, n: usize, cols: usize, chain: usize) -> Option<Chain> {
    use quant::Kernel;
    let kernel = |c| quant::matmul_kernel_in(dt, k, n, cols, c, chain);
    match dt {
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 if k % 32 == 0 => {
            let lanes = |c| match kernel(c) {
                Kernel::VecDot | Kernel::TinyBlas => Some(8),
                Kernel::RepackGemv | Kernel::RepackGemm => Some(1),
                Kernel::Tiled => None,
            };
            let first = lanes(0)?;
            (1..cols)
                .all(|c| lanes(c) == Some(first))
                .then_some(Chain::Legacy { lanes: first })
        }
        DType::Q4_K | DType::Q6_K if k % 256 == 0 => (0..cols)
            .map(|c| match (dt, kernel(c)) {
                (DType::Q4_K, Kernel::VecDot) => Some(0),
                (DType::Q4_K, Kernel::RepackGemv) => Some(1),
                (DType::Q4_K, Kernel::RepackGemm) => Some(2),
                (DType::Q4_K, Kernel::Tiled) => Some(3),
                (DType::Q6_K, Kernel::VecDot) => Some(4),
                (DType::Q6_K, Kernel::Tiled) => Some(5),
                _ => None,
            })
            .collect::<Option<Vec<u32>>>()
            .map(|modes| Chain::K { modes }),
        _ => None,
    }
}

/// The launch that quantizes `cols` f32 columns of `k` (`xb`) on the device as ggml's x86
/// build quantizes them for `dt`'s dot products (`quantize.wgsl` / `quantize.cu`): codes into
/// `xq`, per block scales into `xs`. `modes`: each column's `matmul_k` chain (Q8_K only).
fn quantize_launch<'a, B>(
    dt: DType,
    k: usize,
    cols: usize,
    xb: &'a B,
    modes: &'a B,
    xq: &'a B,
    xs: &'a B,
) -> Launch<'a, B> {
    let kind = match quant::vec_dot_type(dt) {
        DType::Q8_0 => 0,
        DType::Q8_1 => 1,
        _ => 2,
    };
    let blocks = cols * k / if kind == 2 { 256 } else { 32 };
    Launch {
        kernel: "quantize",
        meta: vec![k as u32, cols as u32, kind],
        bufs: vec![xb, modes, xq, xs],
        groups: (blocks as u32).div_ceil(64),
    }
}

/// The device buffers a quantized activation needs: codes and per-block scales.
fn activation_buffers<D: Device>(
    gpu: &D,
    dt: DType,
    k: usize,
    cols: usize,
) -> Result<(D::Buf, D::Buf), Error> {
    let words = if quant::vec_dot_type(dt) == DType::Q8_K {
        17 * k / 256
    } else {
        2 * k / 32
    };
    Ok((
        gpu.empty("activation codes", (cols * k) as u64)?,
        gpu.empty("activation scales", (cols * words * 4) as u64)?,
    ))
}

/// `dev` (a block format) times `cols` f32 columns `xb`, quantized on the device as the
/// reference quantizes them, each column in the reference's chain (`matmul_x` or `matmul_k`):
/// `done(launches, output buffer, its bytes)` runs them (output `[n, cols]`).
pub fn product_exact<D: Device, R>(
    gpu: &D,
    dev: &DevWeight<D::Buf>,
    dt: DType,
    chain: &Chain,
    xb: &D::Buf,
    cols: usize,
    done: impl FnOnce(&[Launch<'_, D::Buf>], &D::Buf, u64) -> Result<R, Error>,
) -> Result<R, Error> {
    let (k, n) = (dev.k, dev.n);
    let modes = match chain {
        Chain::K { modes } => &modes[..],
        Chain::Legacy { .. } => &[0],
    };
    let mb = gpu.upload("column kernels", bytes(modes))?;
    let (qb, sb) = activation_buffers(gpu, dt, k, cols)?;
    let size = (n * cols * 4) as u64;
    let ob = gpu.empty("output", size)?;
    let products = dev.chunks.iter().map(|c| {
        let missing = || Error::Invalid(format!("{dt}: the weight has no block scales"));
        let meta = vec![k as u32, c.rows, cols as u32, n as u32, c.row0];
        Ok(match chain {
            Chain::Legacy { lanes } => Launch {
                kernel: "matmul_x",
                meta: [
                    meta,
                    vec![
                        *lanes,
                        matches!(dt, DType::Q4_1 | DType::Q5_1) as u32,
                        x_tile(),
                    ],
                ]
                .concat(),
                bufs: vec![
                    &c.values,
                    c.scales.as_ref().ok_or_else(missing)?,
                    &qb,
                    &sb,
                    &ob,
                ],
                groups: c.rows.div_ceil(64) * (cols as u32).div_ceil(x_tile()),
            },
            Chain::K { .. } => Launch {
                kernel: "matmul_k",
                meta: [meta, vec![k_tile()]].concat(),
                bufs: vec![
                    &c.values,
                    c.kscales.as_ref().ok_or_else(missing)?,
                    &qb,
                    &sb,
                    &mb,
                    &ob,
                ],
                groups: c.rows.div_ceil(64) * (cols as u32).div_ceil(k_tile()),
            },
        })
    });
    let launches = std::iter::once(Ok(quantize_launch(dt, k, cols, xb, &mb, &qb, &sb)))
        .chain(products)
        .collect::<Result<Vec<_>, Error>>()?;
    done(&launches, &ob, size)
}

/// The activations as the reference sees them: each column converted to the weight's dot
/// format (Q8_0, Q8_1, Q8_K, F16, ...: `quant::quantize_activations`, ggml's conversion) and
/// decoded back to f32, so that the device's sums differ from the reference's in their order
/// only; and for grouped weights each group's activation sum (`[cols][k / group]`), which the
/// offsets multiply: for Q8_1 the f16 `s` of its blocks, as ggml's Q4_1/Q5_1 dot products use.
/// (On the host for now; a device kernel is the next step.)
fn dot_format(w: DType, k: usize, group: usize, x: &[u8]) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let xs = host::f32s(x);
    let vt = quant::vec_dot_type(w);
    let mut sums = Vec::new();
    let group_sums = |col: &[f32], sums: &mut Vec<f32>| {
        if group > 0 {
            sums.extend(
                col.chunks_exact(group)
                    .map(|g| g.iter().map(|&v| v as f64).sum::<f64>() as f32),
            );
        }
    };
    if vt == DType::F32 {
        for col in xs.chunks_exact(k) {
            group_sums(col, &mut sums);
        }
        return Ok((xs, sums));
    }
    let rb = quant::row_bytes(vt, k)
        .ok_or_else(|| Error::Unsupported(format!("{k} elements are not whole {vt} blocks")))?;
    let mut q = vec![0u8; rb];
    let mut out = vec![0f32; xs.len()];
    for (col, o) in xs.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        quant::quantize_activations(w, col, &mut q)
            .and_then(|_| quant::dequantize_row(vt, &q, o))
            .map_err(|e| Error::Unsupported(format!("activations as {vt}: {e}")))?;
        if vt == DType::Q8_1 && group == 32 {
            let bb = vt.info().block_bytes as usize;
            sums.extend(
                q.chunks_exact(bb)
                    .map(|b| quant::fp16_to_f32(u16::from_le_bytes([b[2], b[3]]))),
            );
        } else {
            group_sums(o, &mut sums);
        }
    }
    Ok((out, sums))
}

/// `dev` times `cols` packed f32 columns `x` (with their group sums, see [`dot_format`]):
/// `done(launches, output buffer, its bytes)` runs them (output `[n, cols]`).
pub fn product<D: Device, R>(
    gpu: &D,
    dev: &DevWeight<D::Buf>,
    x: &[u8],
    sums: &[u8],
    cols: usize,
    done: impl FnOnce(&[Launch<'_, D::Buf>], &D::Buf, u64) -> Result<R, Error>,
) -> Result<R, Error> {
    let (k, n) = (dev.k, dev.n);
    let xb = gpu.upload("activations", x)?;
    let sb = gpu.upload("activation sums", sums)?;
    let size = (n * cols * 4) as u64;
    let ob = gpu.empty("output", size)?;
    let launches: Vec<_> = dev
        .chunks
        .iter()
        .map(|c| {
            let group = match dev.layout {
                Layout::Grouped { group } => group as u32,
                Layout::Dense => 0,
            };
            let groups = c.rows.div_ceil(gpu.matmul_rows_per_group());
            let meta = vec![k as u32, c.rows, cols as u32, group, n as u32, c.row0];
            match &c.scales {
                Some(s) => Launch {
                    kernel: "matmul_q",
                    meta,
                    bufs: vec![&c.values, s, &xb, &sb, &ob],
                    groups,
                },
                None => Launch {
                    kernel: "matmul_f",
                    meta,
                    bufs: vec![&c.values, &xb, &ob],
                    groups,
                },
            }
        })
        .collect();
    done(&launches, &ob, size)
}

/// Rows of a table: a weight prepared at load (`buffer` set: the mat_mul layout, e.g. a tied
/// embedding, read where it lies, chunk by chunk) or a host table uploaded for the call.
unsafe fn get_rows<D: Device>(
    ctx: &Ctx<D>,
    table: &TensorDesc,
    ids: &TensorDesc,
    out: &TensorDesc,
) -> Result<(), Error> {
    let gpu = ctx.dev;
    let (k, v) = (table.ne[0] as usize, table.ne[1] as usize);
    let id = host::i32s(&ctx.host_bytes(ids)?);
    if let Some((m, &bad)) = id
        .iter()
        .enumerate()
        .find(|(_, &i)| i < 0 || i as usize >= v)
    {
        return Err(Error::Invalid(format!(
            "get_rows: ids[{m}] = {bad} outside the table's {v} rows"
        )));
    }
    if table.buffer != 0 && !ctx.is_weight(table.buffer) {
        return rows_of_device_table(ctx, table, &id, out);
    }
    let dev: Arc<DevWeight<D::Buf>> = if table.buffer != 0 {
        ctx.weight(table.buffer)?
    } else {
        Arc::new(DevWeight::upload(gpu, dt(table), k, v, |r| {
            host::row(table, r)
        })?)
    };
    let ib = gpu.upload("ids", bytes(&id))?;
    let size = (k * id.len() * 4) as u64;
    let ob = gpu.empty("output", size)?;
    let (m, groups) = (id.len() as u32, id.len() as u32);
    // Each chunk writes the rows whose ids fall in it.
    let launches: Vec<_> = dev
        .chunks
        .iter()
        .map(|c| match (dev.layout, &c.scales) {
            (Layout::Grouped { group }, Some(s)) => Launch {
                kernel: "get_rows_q",
                meta: vec![k as u32, m, group as u32, c.rows, c.row0],
                bufs: vec![&c.values, s, &ib, &ob],
                groups,
            },
            _ => Launch {
                kernel: "get_rows_f",
                meta: vec![k as u32, m, 0, c.rows, c.row0],
                bufs: vec![&c.values, &ib, &ob],
                groups,
            },
        })
        .collect();
    ctx.deliver(&launches, &ob, out, |_| {})
}

unsafe fn elementwise<D: Device>(
    ctx: &Ctx<D>,
    op: Op,
    ins: &[TensorDesc],
    out: &TensorDesc,
    p: &OpParams,
) -> Result<(), Error> {
    let a = &ins[0];
    let b = ins.get(1).unwrap_or(a);
    let n = n_el(a) as u32;
    let code = match op {
        Op::Add => 0u32,
        Op::Mul => 1,
        _ => 2,
    };
    let d = |t: &TensorDesc| t.ne.map(|x| x as u32);
    // The factor of `scale` (0 for add and mul, which have no attribute).
    let mut meta = vec![n, code, abi::ScaleAttrs::from_params(p).s.to_bits(), 0];
    meta.extend(d(a));
    meta.extend(d(b));
    let inputs: Vec<&TensorDesc> = if op == Op::Scale {
        vec![a, a]
    } else {
        vec![a, b]
    };
    rowwise(ctx, "elementwise", &meta, &inputs, out, n.div_ceil(64))
}

unsafe fn rope<D: Device>(
    ctx: &Ctx<D>,
    x: &TensorDesc,
    pos: &TensorDesc,
    out: &TensorDesc,
    op: &OpParams,
) -> Result<(), Error> {
    let p = abi::RopeAttrs::from_params(op);
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let corr = corr_dims(&p);
    let gpu = ctx.dev;
    let positions = host::i32s(&ctx.host_bytes(pos)?);
    let cache: Vec<f32> = positions
        .iter()
        .flat_map(|&t| rope_cache(t, &p, corr, theta_scale))
        .collect();
    let n = n_el(x) as u32;
    let meta = [
        x.ne[0] as u32,
        x.ne[1] as u32,
        x.ne[2] as u32,
        p.n_dims as u32,
        (p.mode == abi::ROPE_NEOX) as u32,
        n,
    ];
    let xb = ctx.input(x, "x")?;
    let cb = gpu.upload("rope cache", bytes(&cache))?;
    let size = n as u64 * 4;
    let ob = gpu.empty("output", size)?;
    let launch = Launch {
        kernel: "rope",
        meta: meta.to_vec(),
        bufs: vec![&xb, &cb, &ob],
        groups: n.div_ceil(64),
    };
    ctx.deliver(&[launch], &ob, out, |_| {})
}

unsafe fn set_rows<D: Device>(
    ctx: &Ctx<D>,
    src: &TensorDesc,
    idx: &TensorDesc,
    dst_in: &TensorDesc,
    dst: &TensorDesc,
) -> Result<(), Error> {
    let gpu = ctx.dev;
    if dst_in.dtype != dst.dtype {
        return Err(Error::Invalid(
            "set_rows: dst input and output formats differ".into(),
        ));
    }
    let rows = host::i32s(&ctx.host_bytes(idx)?);
    if let Some((m, &r)) = rows
        .iter()
        .enumerate()
        .find(|(_, &r)| r < 0 || r as i64 >= dst.ne[1])
    {
        return Err(Error::Invalid(format!(
            "set_rows: index {r} at {m} outside 0..{}",
            dst.ne[1]
        )));
    }
    let f16 = dt(dst) == DType::F16;
    let n = n_el(src) as u32;
    let sb = ctx.input(src, "src")?;
    if dst.buffer != 0 || dst_in.buffer != 0 {
        return set_rows_device(ctx, &sb, &rows, src.ne[0] as usize, f16, dst_in, dst);
    }
    let ob = gpu.empty("rows", n as u64 * 4)?;
    let launch = Launch {
        kernel: "set_rows",
        meta: vec![n, f16 as u32],
        bufs: vec![&sb, &ob],
        groups: n.div_ceil(64),
    };
    let words = host::i32s(&gpu.run(&[launch], &ob, n as u64 * 4)?);
    let es = if f16 { 2 } else { 4 };
    if dst_in.data != dst.data || dst_in.nb != dst.nb {
        // Distinct tensors: the output starts as a copy of the input cache.
        for r in 0..dst.ne[1] {
            for j in 0..dst.ne[0] {
                let s = dst_in
                    .data
                    .offset((r * dst_in.nb[1] + j * dst_in.nb[0]) as isize);
                let d = dst.data.offset((r * dst.nb[1] + j * dst.nb[0]) as isize);
                core::ptr::copy(s, d, es);
            }
        }
    }
    let k = src.ne[0] as usize;
    for (m, &r) in rows.iter().enumerate() {
        for j in 0..k {
            let d = dst
                .data
                .offset((r as i64 * dst.nb[1] + j as i64 * dst.nb[0]) as isize);
            let w = words[m * k + j] as u32;
            if f16 {
                (d as *mut u16).write_unaligned(w as u16);
            } else {
                (d as *mut u32).write_unaligned(w);
            }
        }
    }
    Ok(())
}

/// set_rows into a device tensor, in place: `set_rows_dev` writes each row's words where
/// `rows` puts it (an f16 row packs two elements a word, so its length must be even).
fn set_rows_device<D: Device>(
    ctx: &Ctx<D>,
    sb: &D::Buf,
    rows: &[i32],
    k: usize,
    f16: bool,
    dst_in: &TensorDesc,
    dst: &TensorDesc,
) -> Result<(), Error> {
    if dst_in.buffer != dst.buffer || dst_in.data != dst.data || dst_in.nb != dst.nb {
        return Err(Error::Unsupported(
            "set_rows: a device destination is written in place only".into(),
        ));
    }
    let es = if f16 { 2 } else { 4 };
    if dst.nb[0] != es || (k * es as usize) % 4 != 0 {
        return Err(Error::Unsupported(format!(
            "set_rows: device rows of {k} {} elements are not whole words",
            dt(dst)
        )));
    }
    let place = ctx.place(dst)?;
    let per_row = (k * es as usize / 4) as u32;
    let words = rows.len() as u32 * per_row;
    let ib = ctx.dev.upload("rows", bytes(rows))?;
    let launch = Launch {
        kernel: "set_rows_dev",
        meta: vec![
            words,
            per_row,
            f16 as u32,
            k as u32,
            (place.off / 4) as u32,
            (dst.nb[1] / 4) as u32,
        ],
        bufs: vec![sb, &ib, &place.buf],
        groups: words.div_ceil(64),
    };
    ctx.dev.enqueue(&[launch])
}

/// get_rows from a table in device memory (activations: the rows that produce logits), one
/// queued copy a row.
///
/// # Safety
/// A host `out` is writable for its shape and strides.
unsafe fn rows_of_device_table<D: Device>(
    ctx: &Ctx<D>,
    table: &TensorDesc,
    ids: &[i32],
    out: &TensorDesc,
) -> Result<(), Error> {
    let el = dt(table).info();
    if el.block_len != 1 || table.nb[0] != el.block_bytes as i64 || table.ne[2] * table.ne[3] != 1 {
        return Err(Error::Unsupported(
            "get_rows: a device table of packed 2-D rows only".into(),
        ));
    }
    let row = table.ne[0] as u64 * el.block_bytes as u64;
    let tp = ctx.place(table)?;
    let size = row * ids.len() as u64;
    let (buf, off) = if out.buffer != 0 {
        let p = ctx.packed(out)?;
        (p.buf, p.off)
    } else {
        (Arc::new(ctx.dev.empty("rows", size)?), 0)
    };
    for (m, &i) in ids.iter().enumerate() {
        let from = tp.off + i as u64 * table.nb[1] as u64;
        ctx.copy_buf(&tp.buf, from, &buf, off + m as u64 * row, row)?;
    }
    if out.buffer == 0 {
        host::scatter(out, &ctx.dev.read(&buf, 0, size)?);
    }
    Ok(())
}
