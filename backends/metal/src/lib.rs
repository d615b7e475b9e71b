//! mollm's Metal backend (cdylib `mollm_metal`): WGSL kernels through wgpu, which drives Metal
//! on Apple machines. Elsewhere it has no device and says so (`unavailable_reason`), unless
//! `MOLLM_METAL_ADAPTER=vulkan` asks for a Vulkan adapter: then the same kernels run there, so
//! that CI checks every one of them on Mesa's software Vulkan device (lavapipe).
//!
//! What it computes: every op of the ABI, for the weight formats in
//! `mollm_gpu_common::weights::layout` (Q2_K and Q3_K are declined, with the reason); the host
//! side of each op is `mollm-gpu-common`'s, shared with the cuda backend. Weights given to `prepare_weight` are
//! decoded and uploaded once at load and stay on the device; everything else is host memory
//! that each call uploads, computes on and reads back (one submission and one wait per op).
//! Keeping activations and the KV cache on the device between ops is the next step
//! (`docs/src/gpu.md`, issue 16). GPU float order differs from the reference's, so the conformance
//! gate holds it to per-op tolerances, not to bits.

mod gpu;
mod shaders;

use abi::{BackendHeader, BackendTable};
use mollm_gpu_common::GpuBackend;

pub use gpu::ADAPTER_ENV;

/// The metal backend for `mollm-gpu-common`.
pub struct Metal;

impl GpuBackend for Metal {
    type Dev = gpu::Gpu;
    const NAME: &'static str = "metal";
    const SCORE: u32 = 40;
    fn device() -> Result<&'static gpu::Gpu, &'static str> {
        gpu::gpu()
    }
}

static TABLE: BackendTable = mollm_gpu_common::table::<Metal>();
static HEADER: BackendHeader = mollm_gpu_common::header(c"metal", &TABLE);

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

#[cfg(test)]
mod tests;
