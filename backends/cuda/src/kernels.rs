//! The CUDA kernels (CUDA C in `kernels/`, one file per op family as the reference's ops and
//! the metal backend's WGSL), compiled at run time by NVRTC: each file with `common.cuh`
//! prepended, no system headers.

pub const COMMON: &str = include_str!("kernels/common.cuh");

/// (file, source, the `extern "C"` kernels it defines).
pub const FILES: &[(&str, &str, &[&str])] = &[
    (
        "matmul.cu",
        include_str!("kernels/matmul.cu"),
        &["matmul_q", "matmul_f", "matmul_x", "matmul_k", "quantize"],
    ),
    (
        "rows.cu",
        include_str!("kernels/rows.cu"),
        &["get_rows_q", "get_rows_f", "rms_norm", "softmax", "argmax"],
    ),
    (
        "elementwise.cu",
        include_str!("kernels/elementwise.cu"),
        &["rope", "glu", "elementwise", "set_rows", "set_rows_dev"],
    ),
    (
        "attention.cu",
        include_str!("kernels/attention.cu"),
        &["attention", "gather_words"],
    ),
];

/// A file's whole source as NVRTC compiles it.
pub fn source(file: &str) -> Option<String> {
    FILES
        .iter()
        .find(|(f, _, _)| *f == file)
        .map(|(_, s, _)| format!("{COMMON}\n{s}"))
}

/// The virtual architectures PTX is made for (Volta and later; the driver JIT-compiles PTX
/// for the GPU it has, so the oldest one runs everywhere, the newer ones run better).
pub const ARCHS: &[&str] = &["compute_70", "compute_80", "compute_90"];
