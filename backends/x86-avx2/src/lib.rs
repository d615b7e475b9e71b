//! mollm native CPU backend for x86-64 with AVX2 (cdylib `mollm_x86_avx2`).
//!
//! The host loads this library and calls [`mollm_backend_entry`]; everything else lives in
//! `mollm-x86-common` (kernels behind `#[target_feature]`, run-time CPU detection in
//! `score`, so the library loads on any x86-64 and reports score 0 where it cannot run).

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const abi::BackendHeader {
    &mollm_x86_common::HEADER_AVX2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_well_formed() {
        let h = unsafe { &*mollm_backend_entry() };
        h.check_layout().unwrap();
        let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
        assert_eq!(name.to_str().unwrap(), "x86-avx2");
        assert_eq!(h.device_kind, abi::DeviceKind::Cpu as u32);
        assert_ne!(h.cpu_features, 0);
        let t = unsafe { &*h.table };
        let s = (t.score.unwrap())();
        assert_eq!(s > 0, mollm_x86_common::Isa::Avx2.detected());
    }
}
