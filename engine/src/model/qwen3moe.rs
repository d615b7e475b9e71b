//! Qwen3-MoE: Qwen3's attention (q/k head norms, neox rope, no biases) with a routed
//! mixture-of-experts FFN in every layer (softmax router, top-k, weights renormalized as the
//! checkpoint says, SwiGLU experts; see [`super::moe`]).

use super::{decoder, qwen3, HParams};
use crate::error::{EngineError, Result};
use crate::graph::build::moe_ffn;
use crate::graph::GraphFile;
use abi::GLU_SILU;

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    if hp.n_expert == 0 {
        return Err(EngineError::Invalid(
            "qwen3moe: missing metadata key 'qwen3moe.expert_count'".into(),
        ));
    }
    let (k, norm) = (hp.n_expert_used, hp.expert_weights_norm);
    let ffn = move |b: &mut _, x: &str, il| moe_ffn(b, x, il, k, norm, GLU_SILU);
    Ok(decoder::pre_norm(hp, &qwen3::attn_spec(hp), &ffn, has))
}
