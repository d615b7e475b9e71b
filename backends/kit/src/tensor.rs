//! Tensors described by [`abi::TensorDesc`] (ggml order, byte strides): the error type of
//! every Rust backend, layout and data checks, row addressing and widening.

use abi::{DType, TensorDesc};

/// Why a call cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Malformed call: [`abi::Status::InvalidArgument`].
    Invalid(String),
    /// Well-formed but not implemented here: [`abi::Status::Unsupported`].
    Unsupported(String),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Invalid(m) | Error::Unsupported(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = core::result::Result<T, Error>;

pub fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(msg.into()))
}

/// Layout checks that need no data: host memory, non-negative strides that are whole elements,
/// block formats with contiguous rows. `name` is used in messages.
pub fn check_layout(t: &TensorDesc, name: &str) -> Result<()> {
    let dt = t
        .dtype()
        .ok_or_else(|| Error::Invalid(format!("{name}: unknown dtype id {}", t.dtype)))?;
    if t.buffer != 0 {
        return Err(Error::Unsupported(format!(
            "{name}: device buffers are not supported by the reference"
        )));
    }
    let info = dt.info();
    if t.nb.iter().any(|&b| b < 0) {
        return Err(Error::Unsupported(format!(
            "{name}: negative strides {:?}",
            t.nb
        )));
    }
    if info.quantized || !matches!(dt, DType::F32 | DType::I32) {
        // Block formats and 16-bit rows: elements of one row must be packed.
        if t.ne[0] > 1 && t.nb[0] != info.block_bytes as i64 {
            return Err(Error::Unsupported(format!(
                "{name}: {dt} rows must be contiguous (nb[0] = {})",
                t.nb[0]
            )));
        }
    } else {
        let es = info.block_bytes as i64;
        for d in 0..abi::MAX_DIMS {
            if t.ne[d] > 1 && t.nb[d] % es != 0 {
                return Err(Error::Invalid(format!(
                    "{name}: stride nb[{d}] = {} is not a multiple of {es}",
                    t.nb[d]
                )));
            }
        }
    }
    Ok(())
}

/// Checks that a tensor about to be read or written has usable memory.
pub fn check_data(t: &TensorDesc, name: &str) -> Result<()> {
    if t.numel().unwrap_or(0) == 0 {
        return Ok(());
    }
    if t.data.is_null() {
        return invalid(format!("{name}: null data pointer"));
    }
    let align = match t.dtype() {
        Some(DType::F32) | Some(DType::I32) => 4,
        Some(DType::F16) | Some(DType::BF16) => 2,
        _ => 1,
    };
    if (t.data as usize) % align != 0 {
        return invalid(format!("{name}: data pointer is not {align}-byte aligned"));
    }
    Ok(())
}

/// Row index `r` (over dims 1..3) to `(i1, i2, i3)`.
#[inline]
pub fn split_row(t: &TensorDesc, r: i64) -> (i64, i64, i64) {
    let (n1, n2) = (t.ne[1], t.ne[2]);
    (r % n1, (r / n1) % n2, r / (n1 * n2))
}

/// Byte address of element `(0, i1, i2, i3)`.
#[inline]
pub fn row_ptr(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> *mut u8 {
    t.data
        .wrapping_offset((i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]) as isize)
}

/// Element `i` of a 1-D i32 tensor.
///
/// # Safety
/// `t` is a checked i32 tensor valid for reads and `i < ne[0]`.
#[inline]
pub unsafe fn read_i32(t: &TensorDesc, i: i64) -> i32 {
    (t.data.wrapping_offset((i * t.nb[0]) as isize) as *const i32).read()
}

/// The raw bytes of row `i1` of a tensor with packed rows (block formats, f16, f32).
///
/// # Safety
/// `t` is checked, valid for reads, and `nb[0]` is the block size.
#[inline]
pub unsafe fn block_row<'a>(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> &'a [u8] {
    let dt = t.dtype().expect("checked dtype");
    let bytes = dt.row_bytes(t.ne[0] as u64).expect("checked shape") as usize;
    core::slice::from_raw_parts(row_ptr(t, i1, i2, i3), bytes)
}

/// Widens a packed row of f32/f16/bf16 into `dst`.
pub fn widen_row(dt: DType, src: &[u8], dst: &mut [f32]) -> bool {
    match dt {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 if (src.as_ptr() as usize) % 2 == 0 && src.len() >= 2 * dst.len() => {
            use half::slice::HalfFloatSliceExt;
            // SAFETY: aligned, and `dst.len()` f16 values fit in `src`.
            let h =
                unsafe { core::slice::from_raw_parts(src.as_ptr() as *const half::f16, dst.len()) };
            h.convert_to_f32_slice(dst); // exact; uses F16C when the CPU has it
        }
        DType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => return false,
    }
    true
}

/// Splits `n` items into task ranges of about `chunk` items: returns `(n_tasks, chunk)`.
pub fn tasks(n: usize, chunk: usize) -> (u32, usize) {
    let chunk = chunk.max(1);
    (n.div_ceil(chunk) as u32, chunk)
}
