//! Qwen3-MoE: Qwen3's attention (q/k head norms, neox rope, no biases) with a routed
//! mixture-of-experts FFN in every layer (`moe::Experts`: softmax router, top-k, weights
//! renormalized as the checkpoint says, SwiGLU experts).

use super::common::positions;
use super::moe::Experts;
use super::qwen3::{rope_params, Attention};
use super::{weight, weight_opt, Graph, HParams};
use crate::error::{EngineError, Result};
use crate::exec::Exec;
use crate::kv::KvCache;
use crate::tensor::{Act, Weight};
use loader::GgufFile;

pub struct Layer {
    pub attn: Attention,
    pub ffn_norm: Weight,
    pub experts: Experts,
}

pub struct Qwen3Moe {
    hp: HParams,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<Layer>,
}

pub fn build(g: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    if hp.n_expert == 0 {
        return Err(EngineError::Model {
            file: g.path.display().to_string(),
            msg: "qwen3moe: missing metadata key 'qwen3moe.expert_count'".into(),
        });
    }
    let (e, v) = (hp.n_embd as i64, hp.n_vocab as i64);
    let tok_embd = weight(g, "token_embd.weight", &[e, v])?;
    let layers = (0..hp.n_layer)
        .map(|i| {
            Ok(Layer {
                attn: Attention::load(g, hp, i)?,
                ffn_norm: weight(g, &format!("blk.{i}.ffn_norm.weight"), &[e])?,
                experts: Experts::load(g, hp, i)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(Qwen3Moe {
        hp: hp.clone(),
        tok_embd,
        output_norm: weight(g, "output_norm.weight", &[e])?,
        output: weight_opt(g, "output.weight", &[e, v])?.unwrap_or(tok_embd),
        layers,
    }))
}

impl Graph for Qwen3Moe {
    fn forward(
        &self,
        ex: &Exec,
        kv: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        out_rows: &[usize],
    ) -> Result<Act> {
        let hp = &self.hp;
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let pos = positions(pos0, tokens.len());
        let rope = rope_params(hp);
        let mut inp_l = ex.get_rows(&self.tok_embd, &ids)?;
        for (il, l) in self.layers.iter().enumerate() {
            let mut inp_sa = inp_l;
            let mut attn_out = l
                .attn
                .forward(ex, hp, &mut kv.layers[il], &inp_sa, &pos, &rope)?;
            if il == self.layers.len() - 1 {
                if out_rows.is_empty() {
                    return Ok(Act::zeros(&[hp.n_vocab as i64, 0]));
                }
                attn_out = attn_out.select_rows(out_rows);
                inp_sa = inp_sa.select_rows(out_rows);
            }
            let ffn_inp = ex.add(&attn_out, &inp_sa)?;
            let ffn_norm = ex.rms_norm(&ffn_inp, &l.ffn_norm, hp.eps)?;
            let moe_out = l.experts.forward(ex, hp, &ffn_norm)?;
            inp_l = ex.add(&moe_out, &ffn_inp)?;
        }
        let result_norm = ex.rms_norm(&inp_l, &self.output_norm, hp.eps)?;
        ex.matmul(&self.output, &result_norm)
    }
}
