//! `cfg(x86)`: the crate's x86 kernels (`src/x86/`) are built, which takes the `x86` feature
//! (the x86 backends ask for it) and an x86-64 target. `cfg(neon)`: the same for the AArch64
//! kernels (`src/arm/`), the `neon` feature (the ARM backends ask for it) on an AArch64 target.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(x86)");
    println!("cargo::rustc-check-cfg=cfg(neon)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if std::env::var_os("CARGO_FEATURE_X86").is_some() && arch == "x86_64" {
        println!("cargo::rustc-cfg=x86");
    }
    if std::env::var_os("CARGO_FEATURE_NEON").is_some() && arch == "aarch64" {
        println!("cargo::rustc-cfg=neon");
    }
}
