//! Gemma 3: embeddings scaled by sqrt(n_embd); RMS norms on q and k per head; sandwich norms
//! (before and after both attention and FFN); GeGLU; local layers with a sliding window and
//! their own rope base, every sixth layer (by default) global, linear rope scaling (4B and up)
//! on the global layers only. Queries are scaled before the attention product, which then uses
//! scale 1, as llama.cpp does; by `attention.scale` where the file has it (Hugging Face's
//! `query_pre_attn_scalar`), else by llama.cpp's rule.

use super::common::{cached_attention, gated_ffn, positions};
use super::{weight, weight_opt, Graph, HParams};
use crate::error::Result;
use crate::exec::{Exec, RopeParams};
use crate::kv::KvCache;
use crate::tensor::{Act, Weight};
use abi::{GLU_GELU_TANH, ROPE_NEOX};
use loader::GgufFile;

pub struct Layer {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub attn_q_norm: Weight,
    pub attn_k_norm: Weight,
    pub wo: Weight,
    pub attn_post_norm: Weight,
    pub ffn_norm: Weight,
    pub ffn_gate: Weight,
    pub ffn_up: Weight,
    pub ffn_down: Weight,
    pub ffn_post_norm: Weight,
}

pub struct Gemma3 {
    hp: HParams,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<Layer>,
    /// llama.cpp's `f_attention_scale` for every size but 27B: 1/sqrt(head_dim).
    attn_scale: f32,
}

pub fn build(g: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    let (e, hd) = (hp.n_embd as i64, hp.head_dim as i64);
    let (q_dim, kv_dim) = (hd * hp.n_head as i64, hd * hp.n_head_kv as i64);
    let v = hp.n_vocab as i64;
    let ff = hp.n_ff as i64;
    let tok_embd = weight(g, "token_embd.weight", &[e, v])?;
    let layers = (0..hp.n_layer)
        .map(|i| {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            Ok(Layer {
                attn_norm: weight(g, &n("attn_norm"), &[e])?,
                wq: weight(g, &n("attn_q"), &[e, q_dim])?,
                wk: weight(g, &n("attn_k"), &[e, kv_dim])?,
                wv: weight(g, &n("attn_v"), &[e, kv_dim])?,
                attn_q_norm: weight(g, &n("attn_q_norm"), &[hd])?,
                attn_k_norm: weight(g, &n("attn_k_norm"), &[hd])?,
                wo: weight(g, &n("attn_output"), &[q_dim, e])?,
                attn_post_norm: weight(g, &n("post_attention_norm"), &[e])?,
                ffn_norm: weight(g, &n("ffn_norm"), &[e])?,
                ffn_gate: weight(g, &n("ffn_gate"), &[e, ff])?,
                ffn_up: weight(g, &n("ffn_up"), &[e, ff])?,
                ffn_down: weight(g, &n("ffn_down"), &[ff, e])?,
                ffn_post_norm: weight(g, &n("post_ffw_norm"), &[e])?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let attn_scale = if let Some(s) = hp.attn_scale {
        s
    } else if hp.n_layer == 62 {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim as f32).sqrt()
    };
    Ok(Box::new(Gemma3 {
        hp: hp.clone(),
        tok_embd,
        output_norm: weight(g, "output_norm.weight", &[e])?,
        output: weight_opt(g, "output.weight", &[e, v])?.unwrap_or(tok_embd),
        layers,
        attn_scale,
    }))
}

impl Graph for Gemma3 {
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
        let mut rope_global = RopeParams::new(
            ROPE_NEOX,
            hp.n_rot as i64,
            hp.rope_base,
            hp.n_ctx_train as i64,
        );
        // Gemma 3's linear rope scaling (4B and up) applies to the global layers only.
        rope_global.freq_scale = hp.rope_freq_scale;
        let rope_local = RopeParams::new(
            ROPE_NEOX,
            hp.n_rot as i64,
            hp.rope_base_swa,
            hp.n_ctx_train as i64,
        );

        let inp_embd = ex.get_rows(&self.tok_embd, &ids)?;
        let mut inp_l = ex.scale(&inp_embd, (hp.n_embd as f32).sqrt())?;
        for (il, l) in self.layers.iter().enumerate() {
            let local = hp.swa_layers[il];
            let (rope, window) = if local {
                (&rope_local, hp.n_swa)
            } else {
                (&rope_global, 0)
            };

            let attn_norm = ex.rms_norm(&inp_l, &l.attn_norm, hp.eps)?;
            let q = ex.matmul(&l.wq, &attn_norm)?.reshape(&[hd, nh, t]);
            let k = ex.matmul(&l.wk, &attn_norm)?.reshape(&[hd, nkv, t]);
            let v = ex.matmul(&l.wv, &attn_norm)?.reshape(&[hd, nkv, t]);
            let q_normed = ex.rms_norm(&q, &l.attn_q_norm, hp.eps)?;
            let q_roped = ex.rope(&q_normed, &pos, rope)?;
            let k_normed = ex.rms_norm(&k, &l.attn_k_norm, hp.eps)?;
            let k_roped = ex.rope(&k_normed, &pos, rope)?;
            let q_scaled = ex.scale(&q_roped, self.attn_scale)?;
            let attn = cached_attention(
                ex,
                &mut kv.layers[il],
                &q_scaled,
                k_roped,
                v,
                &pos,
                window,
                1.0,
            )?;
            let mut attn_out = ex.matmul(&l.wo, &attn)?;
            if il == self.layers.len() - 1 {
                if out_rows.is_empty() {
                    return Ok(Act::zeros(&[hp.n_vocab as i64, 0]));
                }
                attn_out = attn_out.select_rows(out_rows);
                inp_l = inp_l.select_rows(out_rows);
            }
            let attn_post_norm = ex.rms_norm(&attn_out, &l.attn_post_norm, hp.eps)?;
            let sa_out = ex.add(&attn_post_norm, &inp_l)?;
            let ffn_norm = ex.rms_norm(&sa_out, &l.ffn_norm, hp.eps)?;
            let ffn_out = gated_ffn(
                ex,
                &ffn_norm,
                &l.ffn_gate,
                &l.ffn_up,
                &l.ffn_down,
                GLU_GELU_TANH,
            )?;
            let ffn_post_norm = ex.rms_norm(&ffn_out, &l.ffn_post_norm, hp.eps)?;
            inp_l = ex.add(&ffn_post_norm, &sa_out)?;
        }
        let result_norm = ex.rms_norm(&inp_l, &self.output_norm, hp.eps)?;
        ex.matmul(&self.output, &result_norm)
    }
}
