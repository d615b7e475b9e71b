//! mollm native CPU backend for AArch64 with NEON (cdylib `mollm_arm_neon`); uses SDOT where
//! the CPU reports dotprod. Everything lives in `mollm-arm-common`; on other architectures the
//! library builds and scores 0.

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const abi::BackendHeader {
    &mollm_arm_common::HEADER_NEON
}
