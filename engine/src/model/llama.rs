//! Llama (and SmolLM2): pre-norm decoder, rope on q/k (normal mode: GGUF stores q/k permuted
//! for it), grouped-query attention, SwiGLU FFN, optionally tied output. A layer with a router
//! (`ffn_gate_inp`) has Mixtral-style routed experts instead: softmax router, top
//! `expert_used_count`, the chosen weights renormalized to sum to 1 (llama.cpp's llama graph).

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::{gated_ffn, moe_ffn};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NORMAL};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let spec = decoder::attn_spec(hp, ROPE_NORMAL, false, false);
    let k = hp.n_expert_used;
    let moe = |il: usize| hp.n_expert > 0 && has(&format!("blk.{il}.ffn_gate_inp.weight"));
    let ffn = |b: &mut _, x: &str, il| {
        if moe(il) {
            moe_ffn(b, x, il, k, true, GLU_SILU)
        } else {
            gated_ffn(b, x, il, GLU_SILU)
        }
    };
    Ok(decoder::pre_norm(hp, &spec, &ffn, has))
}
