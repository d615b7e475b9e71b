//! # mollm kernel ABI
//!
//! The one source of truth for what an op is and how a backend is called. Zero dependencies:
//! a backend written in any language that can export a C table implements this crate's
//! `#[repr(C)]` types, and nothing else.
//!
//! Why plain `#[repr(C)]` plus a layout check rather than `abi_stable`: the boundary carries
//! only raw pointers, integers and function pointers (no Rust collections or trait objects),
//! so a magic number, a major version and the size of every struct in [`BackendHeader`] catch
//! the mismatches that matter, and the crate stays dependency-free and usable from C.
//!
//! - [`DType`]: element and block formats.
//! - [`TensorDesc`]: a tensor view (ggml shape order: `ne[0]` innermost).
//! - [`Op`], [`OpSchema`], [`SCHEMAS`]: operators, their operands, attributes and shape rules.
//! - [`BackendHeader`], [`BackendTable`], [`HostApi`], [`OpCall`], [`Status`]: the table.

mod attrs;
pub mod cpu;
mod dtype;
mod ops;
mod paged;
pub mod settings;
mod table;
mod tensor;

pub use attrs::*;
pub use dtype::{DType, DTypeInfo};
pub use ops::*;
pub use paged::{attention_seqs, PagedRows, SeqCall};
pub use table::*;
pub use tensor::{TensorDesc, MAX_DIMS};
