//! Block quantization formats with scalar twins.
//!
//! PUBLIC API CONTRACT (other crates code against these signatures; keep them):
//! - `dequantize_row(dtype, src, dst)`: `src` holds exactly `dst.len()` elements of `dtype`.
//! - `quantize_row(dtype, src, dst)`: ggml's reference quantizer for that format.
//! - `vec_dot_type(dtype)`: the format activations are converted to before a dot product with
//!   a weight row of `dtype`, exactly as ggml's CPU backend does.
//! - `quantize_activations(dtype, src, dst)`: converts an f32 activation row into
//!   `vec_dot_type(dtype)` the way ggml's x86 CPU path does (its rounding included).
//! - `vec_dot(dtype, n, w, act)`: dot product of a weight row of `dtype` with an activation row
//!   already in `vec_dot_type(dtype)`, as ggml computes it.

use abi::DType;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The format has no implementation for this operation.
    Unsupported { dtype: DType, what: &'static str },
    /// Buffer sizes do not match the element count.
    Size { dtype: DType, elements: usize, bytes: usize },
}

impl core::fmt::Display for QuantError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            QuantError::Unsupported { dtype, what } => write!(f, "{what} is not implemented for {dtype}"),
            QuantError::Size { dtype, elements, bytes } => {
                write!(f, "{elements} elements of {dtype} do not fit {bytes} bytes")
            }
        }
    }
}

impl std::error::Error for QuantError {}

pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let _ = (dtype, src, dst);
    todo!("quant: dequantize_row")
}

pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (dtype, src, dst);
    todo!("quant: quantize_row")
}

pub fn vec_dot_type(dtype: DType) -> DType {
    let _ = dtype;
    todo!("quant: vec_dot_type")
}

pub fn quantize_activations(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (dtype, src, dst);
    todo!("quant: quantize_activations")
}

pub fn vec_dot(dtype: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let _ = (dtype, n, w, act);
    todo!("quant: vec_dot")
}
