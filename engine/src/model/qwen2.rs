//! Qwen2 / Qwen2.5: the llama layout plus biases on q, k and v, neox-style rope, and (for most
//! sizes) an output matrix of its own.

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::gated_ffn;
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let spec = decoder::attn_spec(hp, ROPE_NEOX, true, false);
    let ffn = |b: &mut _, x: &str, il| gated_ffn(b, x, il, GLU_SILU);
    Ok(decoder::pre_norm(hp, &spec, &ffn, has))
}
