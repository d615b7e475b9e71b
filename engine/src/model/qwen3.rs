//! Qwen3 (dense): the Qwen2 layout without QKV biases, with an RMSNorm over each head of q and
//! k (`attn_q_norm`, `attn_k_norm`, one weight per head dimension) before neox rope.

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::{gated_ffn, AttnSpec};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

/// Qwen3's attention (shared with Qwen3-MoE).
pub fn attn_spec(hp: &HParams) -> AttnSpec {
    decoder::attn_spec(hp, ROPE_NEOX, false, true)
}

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let ffn = |b: &mut _, x: &str, il| gated_ffn(b, x, il, GLU_SILU);
    Ok(decoder::pre_norm(hp, &attn_spec(hp), &ffn, has))
}
