//! Gemma 3: embeddings scaled by sqrt(n_embd); RMS norms on q and k per head; sandwich norms
//! (before and after both attention and FFN); GeGLU; local layers with a sliding window and
//! their own rope base, every sixth layer (by default) global, linear rope scaling (4B and up)
//! on the global layers only. Queries are scaled before the attention product, which then uses
//! scale 1, as llama.cpp does; by `attention.scale` where the file has it (Hugging Face's
//! `query_pre_attn_scalar`), else by llama.cpp's rule.

use super::{decoder, HParams};
use crate::error::Result;
use crate::exec::RopeParams;
use crate::graph::build::{self, gated_ffn, w, AttnSpec, Builder, TOKENS};
use crate::graph::GraphFile;
use abi::{GLU_GELU_TANH, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    // llama.cpp's `f_attention_scale` for every size but 27B: 1/sqrt(head_dim).
    let q_scale = hp.attn_scale.unwrap_or(if hp.n_layer == 62 {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim as f32).sqrt()
    });
    let rope = |base: f32, scale: f32| {
        let mut r = RopeParams::new(ROPE_NEOX, hp.n_rot as i64, base, hp.n_ctx_train as i64);
        r.freq_scale = scale;
        r
    };
    let mut b = Builder::new(&hp.arch);
    decoder::constants(&mut b, hp);
    let embd = b.get_rows("inp_embd", &w("token_embd.weight"), TOKENS);
    let mut inp_l = b.scale("inp_scaled", &embd, (hp.n_embd as f32).sqrt());
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
        let local = hp.swa_layers[il];
        let spec = AttnSpec {
            head_dim: hp.head_dim,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            eps: hp.eps,
            // Linear rope scaling applies to the global layers only.
            rope: if local {
                rope(hp.rope_base_swa, 1.0)
            } else {
                rope(hp.rope_base, hp.rope_freq_scale)
            },
            window: if local { hp.n_swa } else { 0 },
            kq_scale: 1.0,
            q_scale: Some(q_scale),
            qkv_bias: false,
            qk_norm: true,
            output_gate: false,
        };
        let normed = b.rms_norm("attn_norm", &inp_l, &n("attn_norm"), hp.eps);
        let mut cur = build::attention(&mut b, &normed, il, &spec);
        if il == hp.n_layer - 1 {
            cur = build::select_outputs(&mut b, "attn_out_rows", &cur);
            inp_l = build::select_outputs(&mut b, "inp_rows", &inp_l);
        }
        let post = b.rms_norm("attn_post_norm", &cur, &n("post_attention_norm"), hp.eps);
        let sa_out = b.add("sa_out", &post, &inp_l);
        let normed = b.rms_norm("ffn_norm", &sa_out, &n("ffn_norm"), hp.eps);
        let ffn = gated_ffn(&mut b, &normed, il, GLU_GELU_TANH);
        let post = b.rms_norm("ffn_post_norm", &ffn, &n("post_ffw_norm"), hp.eps);
        inp_l = b.add("l_out", &post, &sa_out);
    }
    let out = build::logits(&mut b, &inp_l, hp.eps, has("output.weight"));
    Ok(b.finish(out))
}
