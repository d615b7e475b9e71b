//! Llama (and SmolLM2): pre-norm decoder, rope on q/k (normal mode: GGUF stores q/k permuted
//! for it), grouped-query attention, SwiGLU FFN, optionally tied output.

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::gated_ffn;
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NORMAL};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let spec = decoder::attn_spec(hp, ROPE_NORMAL, false, false);
    let ffn = |b: &mut _, x: &str, il| gated_ffn(b, x, il, GLU_SILU);
    Ok(decoder::pre_norm(hp, &spec, &ffn, has))
}
