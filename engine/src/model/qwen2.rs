//! Qwen2 / Qwen2.5: the llama layout plus biases on q, k and v, neox-style rope, and (for most
//! sizes) an output matrix of its own.

use super::common::{cached_attention, gated_ffn, positions};
use super::{weight, weight_opt, Graph, HParams};
use crate::error::Result;
use crate::exec::{Exec, RopeParams};
use crate::kv::KvCache;
use crate::tensor::{Act, Weight};
use abi::{GLU_SILU, ROPE_NEOX};
use loader::GgufFile;

pub struct Layer {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub bq: Weight,
    pub wk: Weight,
    pub bk: Weight,
    pub wv: Weight,
    pub bv: Weight,
    pub wo: Weight,
    pub ffn_norm: Weight,
    pub ffn_gate: Weight,
    pub ffn_up: Weight,
    pub ffn_down: Weight,
}

pub struct Qwen2 {
    hp: HParams,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<Layer>,
}

pub fn build(g: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    let (e, hd) = (hp.n_embd as i64, hp.head_dim as i64);
    let (q_dim, kv_dim) = (hd * hp.n_head as i64, hd * hp.n_head_kv as i64);
    let v = hp.n_vocab as i64;
    let tok_embd = weight(g, "token_embd.weight", &[e, v])?;
    let layers = (0..hp.n_layer)
        .map(|i| {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let b = |s: &str| format!("blk.{i}.{s}.bias");
            Ok(Layer {
                attn_norm: weight(g, &n("attn_norm"), &[e])?,
                wq: weight(g, &n("attn_q"), &[e, q_dim])?,
                bq: weight(g, &b("attn_q"), &[q_dim])?,
                wk: weight(g, &n("attn_k"), &[e, kv_dim])?,
                bk: weight(g, &b("attn_k"), &[kv_dim])?,
                wv: weight(g, &n("attn_v"), &[e, kv_dim])?,
                bv: weight(g, &b("attn_v"), &[kv_dim])?,
                wo: weight(g, &n("attn_output"), &[q_dim, e])?,
                ffn_norm: weight(g, &n("ffn_norm"), &[e])?,
                ffn_gate: weight(g, &n("ffn_gate"), &[e, hp.n_ff as i64])?,
                ffn_up: weight(g, &n("ffn_up"), &[e, hp.n_ff as i64])?,
                ffn_down: weight(g, &n("ffn_down"), &[hp.n_ff as i64, e])?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(Qwen2 {
        hp: hp.clone(),
        tok_embd,
        output_norm: weight(g, "output_norm.weight", &[e])?,
        output: weight_opt(g, "output.weight", &[e, v])?.unwrap_or(tok_embd),
        layers,
    }))
}

impl Graph for Qwen2 {
    fn forward(
        &self,
        ex: &Exec,
        kv: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        out_rows: &[usize],
    ) -> Result<Act> {
        let hp = &self.hp;
        let t = tokens.len() as i64;
        let (hd, nh, nkv) = (hp.head_dim as i64, hp.n_head as i64, hp.n_head_kv as i64);
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let pos = positions(pos0, tokens.len());
        let mut rope = RopeParams::new(
            ROPE_NEOX,
            hp.n_rot as i64,
            hp.rope_base,
            hp.n_ctx_train as i64,
        );
        rope.freq_scale = hp.rope_freq_scale;
        let kq_scale = 1.0 / (hd as f32).sqrt();

        let mut inp_l = ex.get_rows(&self.tok_embd, &ids)?;
        for (il, l) in self.layers.iter().enumerate() {
            let mut inp_sa = inp_l;
            let attn_norm = ex.rms_norm(&inp_sa, &l.attn_norm, hp.eps)?;
            let q = ex
                .linear(&l.wq, Some(&l.bq), &attn_norm)?
                .reshape(&[hd, nh, t]);
            let k = ex
                .linear(&l.wk, Some(&l.bk), &attn_norm)?
                .reshape(&[hd, nkv, t]);
            let v = ex
                .linear(&l.wv, Some(&l.bv), &attn_norm)?
                .reshape(&[hd, nkv, t]);
            let q = ex.rope(&q, &pos, &rope)?;
            let k = ex.rope(&k, &pos, &rope)?;
            let attn = cached_attention(ex, &mut kv.layers[il], &q, k, v, &pos, 0, kq_scale)?;
            let mut attn_out = ex.matmul(&l.wo, &attn)?;
            if il == self.layers.len() - 1 {
                if out_rows.is_empty() {
                    return Ok(Act::zeros(&[hp.n_vocab as i64, 0]));
                }
                attn_out = attn_out.select_rows(out_rows);
                inp_sa = inp_sa.select_rows(out_rows);
            }
            let ffn_inp = ex.add(&attn_out, &inp_sa)?;
            let ffn_norm = ex.rms_norm(&ffn_inp, &l.ffn_norm, hp.eps)?;
            let ffn_out = gated_ffn(ex, &ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down, GLU_SILU)?;
            inp_l = ex.add(&ffn_out, &ffn_inp)?;
        }
        let result_norm = ex.rms_norm(&inp_l, &self.output_norm, hp.eps)?;
        ex.matmul(&self.output, &result_norm)
    }
}
