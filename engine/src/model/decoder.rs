//! The pre-norm decoder most architectures share (llama.cpp's llama, qwen2, qwen3, qwen3moe
//! builders): embeddings; per layer `x + attn(norm(x))`, then `h + ffn(norm(h))`; only the
//! rows that produce logits go through the last layer's FFN; final norm and output matrix.

use super::HParams;
use crate::exec::RopeParams;
use crate::graph::build::{self, w, AttnSpec, Builder, TOKENS};
use crate::graph::GraphFile;

/// The FFN of one layer, on the normalized input.
pub type Ffn<'a> = &'a dyn Fn(&mut Builder, &str, usize) -> String;

/// Attention as the pre-norm decoders have it: rope of `rope_mode` over `n_rot` dimensions
/// with the file's base and linear scaling, 1/sqrt(head_dim) inside the product, no window.
pub fn attn_spec(hp: &HParams, rope_mode: i64, qkv_bias: bool, qk_norm: bool) -> AttnSpec {
    let mut rope = RopeParams::new(
        rope_mode,
        hp.n_rot as i64,
        hp.rope_base,
        hp.n_ctx_train as i64,
    );
    rope.freq_scale = hp.rope_freq_scale;
    AttnSpec {
        head_dim: hp.head_dim,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        eps: hp.eps,
        rope,
        window: 0,
        kq_scale: 1.0 / (hp.head_dim as f32).sqrt(),
        q_scale: None,
        qkv_bias,
        qk_norm,
        output_gate: false,
    }
}

/// Declares the hyper-parameters every graph names in its dimensions.
pub fn constants(b: &mut Builder, hp: &HParams) {
    b.constant("n_embd", hp.n_embd);
    b.constant("n_head", hp.n_head);
    b.constant("n_head_kv", hp.n_head_kv);
    b.constant("head_dim", hp.head_dim);
    b.constant("n_ff", hp.n_ff);
    b.constant("n_vocab", hp.n_vocab);
    b.constant("n_layer", hp.n_layer);
    b.constant("n_ctx_train", hp.n_ctx_train);
    if let Some(p) = hp.pooling_type {
        b.constant("pooling_type", p);
    }
    if hp.n_layer_mtp > 0 {
        b.constant("n_layer_mtp", hp.n_layer_mtp);
    }
}

pub fn pre_norm(hp: &HParams, spec: &AttnSpec, ffn: Ffn, has: &dyn Fn(&str) -> bool) -> GraphFile {
    let mut b = Builder::new(&hp.arch);
    constants(&mut b, hp);
    let mut inp_l = b.get_rows("inp_embd", &w("token_embd.weight"), TOKENS);
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let mut inp_sa = inp_l.clone();
        let normed = b.rms_norm(
            "attn_norm",
            &inp_l,
            &w(&format!("blk.{il}.attn_norm.weight")),
            hp.eps,
        );
        let mut cur = build::attention(&mut b, &normed, il, spec);
        if il == hp.n_layer - 1 {
            cur = build::select_outputs(&mut b, "attn_out_rows", &cur);
            inp_sa = build::select_outputs(&mut b, "inp_sa_rows", &inp_sa);
        }
        let ffn_inp = b.add("ffn_inp", &cur, &inp_sa);
        let normed = b.rms_norm(
            "ffn_norm",
            &ffn_inp,
            &w(&format!("blk.{il}.ffn_norm.weight")),
            hp.eps,
        );
        let out = ffn(&mut b, &normed, il);
        inp_l = b.add("l_out", &out, &ffn_inp);
    }
    let out = build::logits(&mut b, &inp_l, hp.eps, has("output.weight"));
    b.finish(out)
}
