//! `HostApi::parallel_for` for Rust closures (the backend never starts threads of its own):
//! the reference's, one copy. Kernels capture raw tensor pointers, so the closure form here is
//! the one without a `Sync` bound (`parallel_for_shared`, unsafe).

pub use backend_kit::par::{panic_message, parallel_for_shared as parallel_for, SyncPtr};
