//! mollm native CPU backend for AArch64 with i8mm (cdylib `mollm_arm_i8mm`): SDOT for decode
//! GEMV, SMMLA 2×2 tiles for the prompt chains whose integers are sums over 16 or more
//! elements. Everything lives in `mollm-arm-common`; the library loads on any CPU and scores 0
//! where the CPU lacks i8mm (every Armv8.0–8.5 core, and every non-ARM CPU), so the host keeps
//! `arm-neon` there and `mollm devices` says "CPU lacks i8mm".

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const abi::BackendHeader {
    &mollm_arm_common::HEADER_I8MM
}
