//! What every backend written in Rust shares with the reference backend, none of it an op's
//! meaning: the C function table's plumbing ([`glue`]: decoding calls, the error slot, no panic
//! across the boundary), the host's thread pool for closures ([`par`]), and tensor checks and
//! addressing with the one error type ([`tensor`]).

pub mod glue;
pub mod par;
pub mod tensor;

pub use par::{parallel_for, scoped_threads_host, serial_host};
pub use tensor::Error;
