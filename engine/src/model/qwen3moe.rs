//! Qwen3-MoE: Qwen3's attention (q/k head norms, neox rope, no biases) with a routed
//! mixture-of-experts FFN in every layer (`moe::Experts`: softmax router, top-k, weights
//! renormalized as the checkpoint says, SwiGLU experts); the decoder is Qwen3's.

use super::moe::Experts;
use super::qwen3::{Attention, Block, Decoder};
use super::{weight, Graph, HParams};
use crate::error::{EngineError, Result};
use crate::exec::Exec;
use crate::tensor::{Act, Weight};
use loader::GgufFile;

pub struct Layer {
    pub attn: Attention,
    pub ffn_norm: Weight,
    pub experts: Experts,
}

impl Block for Layer {
    fn attn(&self) -> &Attention {
        &self.attn
    }
    fn ffn_norm(&self) -> &Weight {
        &self.ffn_norm
    }
    fn ffn(&self, ex: &Exec, hp: &HParams, x: &Act) -> Result<Act> {
        self.experts.forward(ex, hp, x)
    }
}

pub fn build(g: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    if hp.n_expert == 0 {
        return Err(EngineError::Model {
            file: g.path.display().to_string(),
            msg: "qwen3moe: missing metadata key 'qwen3moe.expert_count'".into(),
        });
    }
    let e = hp.n_embd as i64;
    let layers = (0..hp.n_layer)
        .map(|i| {
            Ok(Layer {
                attn: Attention::load(g, hp, i)?,
                ffn_norm: weight(g, &format!("blk.{i}.ffn_norm.weight"), &[e])?,
                experts: Experts::load(g, hp, i)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(Decoder::new(g, hp, layers)?))
}
