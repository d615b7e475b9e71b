//! mollm's CUDA backend (cdylib `mollm_cuda`): the kernels are CUDA C (`kernels/`, the same op
//! families and operand order as the metal backend's WGSL), compiled to PTX at run time by
//! NVRTC ([`nvrtc`]) or taken prebuilt from `MOLLM_CUDA_PTX`, and launched through the driver
//! API ([`driver`]); the host side of every op is `mollm-gpu-common`'s. The driver and NVRTC are
//! opened at run time, never linked, so the library builds and loads on machines without
//! CUDA, where `mollm devices` shows why it cannot run (ABI 1.3's `unavailable_reason`). The
//! conformance gate checks its kernels wherever a GPU is; this repository's CI has none, so
//! there it checks that every kernel compiles.

pub mod driver;
pub mod kernels;
pub mod nvrtc;

use abi::{BackendHeader, BackendTable};
use mollm_gpu_common::GpuBackend;

/// The cuda backend for `mollm-gpu-common`.
pub struct Cuda;

impl GpuBackend for Cuda {
    type Dev = driver::Cuda;
    const NAME: &'static str = "cuda";
    // Above metal's 40: on a machine with both (Vulkan on an NVIDIA GPU), CUDA first.
    const SCORE: u32 = 50;
    fn device() -> Result<&'static driver::Cuda, &'static str> {
        driver::cuda()
    }
}

static TABLE: BackendTable = mollm_gpu_common::table::<Cuda>();
static HEADER: BackendHeader = mollm_gpu_common::header(c"cuda", &TABLE);

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::{DeviceKind, Status};

    #[test]
    fn header_is_well_formed_and_it_says_why_it_cannot_run() {
        // SAFETY: a static header.
        let h = unsafe { &*mollm_backend_entry() };
        h.check_layout().unwrap();
        let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
        assert_eq!(name.to_str().unwrap(), "cuda");
        assert_eq!(h.device_kind, DeviceKind::Gpu as u32);
        let t = unsafe { &*h.table };
        let Err(why) = driver::cuda() else {
            eprintln!("a CUDA device opened: {}", driver::cuda().unwrap().name);
            assert_eq!((t.score.unwrap())(), Cuda::SCORE);
            return;
        };
        assert_eq!((t.score.unwrap())(), 0, "no device: never chosen");
        let mut buf = [0u8; 8];
        let n = (t.unavailable_reason.unwrap())(buf.as_mut_ptr(), buf.len());
        assert_eq!(n, why.len());
        assert_eq!(&buf[..], &why.as_bytes()[..8], "truncated, not overrun");
        // A machine without the driver library says so in those words.
        if ["libcuda.so.1", "libcuda.so"]
            .iter()
            .all(|n| unsafe { libloading::Library::new(n) }.is_err())
        {
            assert!(why.starts_with("no CUDA driver"), "{why}");
        }
        let mut ctx = core::ptr::null_mut();
        let host = backend_kit::serial_host();
        assert_eq!((t.init)(&host, &mut ctx), Status::Unsupported as i32);
    }

    /// Where a device opens, every op passes the conformance gate.
    #[test]
    fn conformance_on_the_device() {
        if driver::cuda().is_err() {
            return;
        }
        let host = backend_kit::serial_host();
        let r = conformance::check_backend_report(&TABLE, &host, abi::WEIGHT_DTYPES.len() as u64)
            .unwrap();
        eprintln!("{r}");
        assert!(r.ok(), "{r}");
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::*;

    /// Every kernel compiles with NVRTC for every architecture PTX is made for, and the PTX
    /// defines each kernel the host will launch. Skipped (with a note) where NVRTC is missing,
    /// unless MOLLM_REQUIRE_NVRTC=1 (CI, after scripts/install-nvrtc.sh).
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        match nvrtc::describe() {
            Ok(d) => eprintln!("{d}"),
            Err(why) => {
                assert!(
                    !abi::settings::REQUIRE_NVRTC.on(false),
                    "MOLLM_REQUIRE_NVRTC=1 but {why}"
                );
                eprintln!("SKIPPED: {why} (scripts/install-nvrtc.sh fetches it)");
                return;
            }
        }
        for (file, _, entries) in kernels::FILES {
            let src = kernels::source(file).unwrap();
            for arch in kernels::ARCHS {
                let ptx = nvrtc::ptx(file, &src, arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    ptx.contains(&format!(".target sm_{}", &arch[8..])),
                    "{file} {arch}"
                );
                for e in *entries {
                    assert!(
                        ptx.contains(&format!(".entry {e}(")),
                        "{file} {arch}: no {e}"
                    );
                }
            }
        }
    }

    /// A kernel that does not compile is an error carrying NVRTC's log, not a panic.
    #[test]
    fn a_compile_error_comes_back_with_the_log() {
        if nvrtc::describe().is_err() {
            return;
        }
        let e = nvrtc::ptx(
            "bad.cu",
            "extern \"C\" __global__ void f() { undefined_thing(); }",
            "compute_70",
        )
        .unwrap_err();
        assert!(e.contains("bad.cu") && e.contains("undefined_thing"), "{e}");
    }
}
