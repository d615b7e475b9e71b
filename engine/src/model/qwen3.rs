//! Qwen3 (dense): the Qwen2 layout without QKV biases, with an RMSNorm over each head of q and
//! k (`attn_q_norm`, `attn_k_norm`, one weight per head dimension) before neox rope.

use super::common::{cached_attention, gated_ffn, positions};
use super::{weight, weight_opt, Graph, HParams};
use crate::error::Result;
use crate::exec::{Exec, RopeParams};
use crate::kv::{KvCache, LayerCache};
use crate::tensor::{Act, Weight};
use abi::{GLU_SILU, ROPE_NEOX};
use loader::GgufFile;

/// Qwen3's attention block (shared with Qwen3-MoE).
pub struct Attention {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub attn_q_norm: Weight,
    pub attn_k_norm: Weight,
}

impl Attention {
    pub fn load(g: &GgufFile, hp: &HParams, il: usize) -> Result<Attention> {
        let (e, hd) = (hp.n_embd as i64, hp.head_dim as i64);
        let (q_dim, kv_dim) = (hd * hp.n_head as i64, hd * hp.n_head_kv as i64);
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        Ok(Attention {
            attn_norm: weight(g, &n("attn_norm"), &[e])?,
            wq: weight(g, &n("attn_q"), &[e, q_dim])?,
            wk: weight(g, &n("attn_k"), &[e, kv_dim])?,
            wv: weight(g, &n("attn_v"), &[e, kv_dim])?,
            wo: weight(g, &n("attn_output"), &[q_dim, e])?,
            attn_q_norm: weight(g, &n("attn_q_norm"), &[hd])?,
            attn_k_norm: weight(g, &n("attn_k_norm"), &[hd])?,
        })
    }

    /// `attn_output(attention(norm(x)))` for the tokens at `pos`.
    pub fn forward(
        &self,
        ex: &Exec,
        hp: &HParams,
        cache: &mut LayerCache,
        x: &Act,
        pos: &[i32],
        rope: &RopeParams,
    ) -> Result<Act> {
        let t = pos.len() as i64;
        let (hd, nh, nkv) = (hp.head_dim as i64, hp.n_head as i64, hp.n_head_kv as i64);
        let attn_norm = ex.rms_norm(x, &self.attn_norm, hp.eps)?;
        let q = ex.matmul(&self.wq, &attn_norm)?.reshape(&[hd, nh, t]);
        let k = ex.matmul(&self.wk, &attn_norm)?.reshape(&[hd, nkv, t]);
        let v = ex.matmul(&self.wv, &attn_norm)?.reshape(&[hd, nkv, t]);
        let q_normed = ex.rms_norm(&q, &self.attn_q_norm, hp.eps)?;
        let q_roped = ex.rope(&q_normed, pos, rope)?;
        let k_normed = ex.rms_norm(&k, &self.attn_k_norm, hp.eps)?;
        let k_roped = ex.rope(&k_normed, pos, rope)?;
        let kq_scale = 1.0 / (hd as f32).sqrt();
        let attn = cached_attention(ex, cache, &q_roped, k_roped, v, pos, 0, kq_scale)?;
        ex.matmul(&self.wo, &attn)
    }
}

/// Neox rope over `n_rot` dimensions with the file's base and scaling.
pub fn rope_params(hp: &HParams) -> RopeParams {
    let mut rope = RopeParams::new(
        ROPE_NEOX,
        hp.n_rot as i64,
        hp.rope_base,
        hp.n_ctx_train as i64,
    );
    rope.freq_scale = hp.rope_freq_scale;
    rope
}

/// A Qwen3-family layer: Qwen3's attention, then some FFN (dense SwiGLU, or routed experts
/// in Qwen3-MoE) on the normalized residual.
pub trait Block: Send + Sync {
    fn attn(&self) -> &Attention;
    fn ffn_norm(&self) -> &Weight;
    fn ffn(&self, ex: &Exec, hp: &HParams, x: &Act) -> Result<Act>;
}

/// The Qwen3 decoder over layers of kind `L`.
pub struct Decoder<L> {
    hp: HParams,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<L>,
}

impl<L: Block> Decoder<L> {
    /// Embeddings, output norm and output matrix (tied to the embeddings when absent) around
    /// `layers`.
    pub fn new(g: &GgufFile, hp: &HParams, layers: Vec<L>) -> Result<Decoder<L>> {
        let (e, v) = (hp.n_embd as i64, hp.n_vocab as i64);
        let tok_embd = weight(g, "token_embd.weight", &[e, v])?;
        Ok(Decoder {
            hp: hp.clone(),
            tok_embd,
            output_norm: weight(g, "output_norm.weight", &[e])?,
            output: weight_opt(g, "output.weight", &[e, v])?.unwrap_or(tok_embd),
            layers,
        })
    }
}

impl<L: Block> Graph for Decoder<L> {
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
            let mut attn_out =
                l.attn()
                    .forward(ex, hp, &mut kv.layers[il], &inp_sa, &pos, &rope)?;
            if il == self.layers.len() - 1 {
                if out_rows.is_empty() {
                    return Ok(Act::zeros(&[hp.n_vocab as i64, 0]));
                }
                attn_out = attn_out.select_rows(out_rows);
                inp_sa = inp_sa.select_rows(out_rows);
            }
            let ffn_inp = ex.add(&attn_out, &inp_sa)?;
            let ffn_norm = ex.rms_norm(&ffn_inp, l.ffn_norm(), hp.eps)?;
            let ffn_out = l.ffn(ex, hp, &ffn_norm)?;
            inp_l = ex.add(&ffn_out, &ffn_inp)?;
        }
        let result_norm = ex.rms_norm(&inp_l, &self.output_norm, hp.eps)?;
        ex.matmul(&self.output, &result_norm)
    }
}

/// A dense Qwen3 layer.
pub struct Layer {
    pub attn: Attention,
    pub ffn_norm: Weight,
    pub ffn_gate: Weight,
    pub ffn_up: Weight,
    pub ffn_down: Weight,
}

impl Block for Layer {
    fn attn(&self) -> &Attention {
        &self.attn
    }
    fn ffn_norm(&self) -> &Weight {
        &self.ffn_norm
    }
    fn ffn(&self, ex: &Exec, _hp: &HParams, x: &Act) -> Result<Act> {
        gated_ffn(
            ex,
            x,
            &self.ffn_gate,
            &self.ffn_up,
            &self.ffn_down,
            GLU_SILU,
        )
    }
}

pub fn build(g: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    let (e, ff) = (hp.n_embd as i64, hp.n_ff as i64);
    let layers = (0..hp.n_layer)
        .map(|i| {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            Ok(Layer {
                attn: Attention::load(g, hp, i)?,
                ffn_norm: weight(g, &n("ffn_norm"), &[e])?,
                ffn_gate: weight(g, &n("ffn_gate"), &[e, ff])?,
                ffn_up: weight(g, &n("ffn_up"), &[e, ff])?,
                ffn_down: weight(g, &n("ffn_down"), &[ff, e])?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Box::new(Decoder::new(g, hp, layers)?))
}
