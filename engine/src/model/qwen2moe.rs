//! Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (QKV biases, neox rope) with,
//! in every layer, routed experts (softmax router, top `expert_used_count`, weights NOT
//! renormalized) plus a shared expert behind a sigmoid gate (llama.cpp's qwen2moe graph).

use super::{decoder, HParams};
use crate::error::{EngineError, Result};
use crate::graph::build::{moe_ffn, shared_expert};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    if hp.n_expert == 0 {
        return Err(EngineError::Invalid(
            "qwen2moe: missing metadata key 'qwen2moe.expert_count'".into(),
        ));
    }
    let spec = decoder::attn_spec(hp, ROPE_NEOX, true, false);
    let k = hp.n_expert_used;
    let ffn = move |b: &mut crate::graph::build::Builder, x: &str, il| {
        let routed = moe_ffn(b, x, il, k, false, GLU_SILU);
        let shared = shared_expert(b, x, il, GLU_SILU, false);
        b.add("ffn_out", &routed, &shared)
    };
    Ok(decoder::pre_norm(hp, &spec, &ffn, has))
}
