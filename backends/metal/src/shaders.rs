//! The WGSL kernels, one file per op family (named as the reference's ops), and the helpers
//! every kernel gets prepended (`common.wgsl`).

pub const COMMON: &str = include_str!("shaders/common.wgsl");

/// Kernel name -> source.
const KERNELS: &[(&str, &str)] = &[
    ("matmul_q", include_str!("shaders/matmul_q.wgsl")),
    ("matmul_f", include_str!("shaders/matmul_f.wgsl")),
    ("get_rows_q", include_str!("shaders/get_rows_q.wgsl")),
    ("get_rows_f", include_str!("shaders/get_rows_f.wgsl")),
    ("rms_norm", include_str!("shaders/rms_norm.wgsl")),
    ("rope", include_str!("shaders/rope.wgsl")),
    ("attention", include_str!("shaders/attention.wgsl")),
    ("set_rows", include_str!("shaders/set_rows.wgsl")),
    ("set_rows_dev", include_str!("shaders/set_rows_dev.wgsl")),
    ("gather_words", include_str!("shaders/gather_words.wgsl")),
    ("glu", include_str!("shaders/glu.wgsl")),
    ("elementwise", include_str!("shaders/elementwise.wgsl")),
    ("softmax", include_str!("shaders/softmax.wgsl")),
    ("argmax", include_str!("shaders/argmax.wgsl")),
    ("matmul_x", include_str!("shaders/matmul_x.wgsl")),
    ("matmul_k", include_str!("shaders/matmul_k.wgsl")),
    ("quantize", include_str!("shaders/quantize.wgsl")),
    ("fma_probe", include_str!("shaders/fma_probe.wgsl")),
];

pub fn source(name: &str) -> Option<&'static str> {
    KERNELS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Every kernel's name (tests compile them all).
#[cfg(test)]
pub fn names() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().map(|(n, _)| *n)
}
