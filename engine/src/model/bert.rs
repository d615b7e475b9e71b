//! BERT (llama.cpp's `bert`): an encoder, for sentence embeddings (all-MiniLM, BGE). The
//! token, position and token-type embeddings (every token of type 0, as llama.cpp passes
//! them) are summed and LayerNormed; each layer is post-norm: attention with biases that sees
//! the whole input (not causal), added to the layer's input and LayerNormed, then a GELU FFN
//! with biases, added and LayerNormed. There are no logits: the output is the last layer's
//! hidden states, which embeddings pool.

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::{self, w, Builder, POSITIONS, TOKENS, TOKEN_TYPES};
use crate::graph::GraphFile;

pub fn build(hp: &HParams, _has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let mut b = Builder::new(&hp.arch);
    decoder::constants(&mut b, hp);
    let tok = b.get_rows("inp_tok", &w("token_embd.weight"), TOKENS);
    let typ = b.get_rows("inp_type", &w("token_types.weight"), TOKEN_TYPES);
    let x = b.add("inp_typed", &tok, &typ);
    let pos = b.get_rows("inp_pos", &w("position_embd.weight"), POSITIONS);
    let x = b.add("inp_embd", &pos, &x);
    let mut inp_l = b.layer_norm(
        "inp_norm",
        &x,
        &w("token_embd_norm.weight"),
        &w("token_embd_norm.bias"),
        hp.eps,
    );
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let n = |t: &str| w(&format!("blk.{il}.{t}"));
        // `x W + b` of layer il's tensor `t`.
        let linear = |b: &mut Builder, name: &str, t: &str, x: &str| {
            let y = b.matmul(name, &n(&format!("{t}.weight")), x);
            b.add(name, &y, &n(&format!("{t}.bias")))
        };
        let norm = |b: &mut Builder, name: &str, t: &str, x: &str| {
            let (wt, bs) = (n(&format!("{t}.weight")), n(&format!("{t}.bias")));
            b.layer_norm(name, x, &wt, &bs, hp.eps)
        };
        let layer = b.kv_layer(hp.head_dim, hp.n_head);
        let heads = |b: &mut Builder, name: &str, t: &str| {
            let y = linear(b, name, t, &inp_l);
            b.reshape(name, &y, &["head_dim", "n_head", "T"])
        };
        let q = heads(&mut b, "Qcur", "attn_q");
        let k = heads(&mut b, "Kcur", "attn_k");
        let v = heads(&mut b, "Vcur", "attn_v");
        let attrs = [
            ("layer", layer as f64),
            ("window", 0.0),
            ("scale", 1.0 / (hp.head_dim as f64).sqrt()),
            ("softcap", 0.0),
            ("causal", 0.0),
        ];
        let kqv = b.node("kqv_out", "kv_attention", &[&q, &k, &v], &attrs);
        let mut cur = linear(&mut b, "attn_out", "attn_output", &kqv);
        let mut inp = inp_l.clone();
        if il == hp.n_layer - 1 {
            cur = build::select_outputs(&mut b, "attn_out_rows", &cur);
            inp = build::select_outputs(&mut b, "inp_rows", &inp);
        }
        let cur = b.add("attn_res", &cur, &inp);
        let ffn_inp = norm(&mut b, "attn_out_norm", "attn_output_norm", &cur);
        let up = linear(&mut b, "ffn_up", "ffn_up", &ffn_inp);
        let act = b.node("ffn_gelu", "gelu", &[&up], &[]);
        let down = linear(&mut b, "ffn_out", "ffn_down", &act);
        let cur = b.add("ffn_res", &down, &ffn_inp);
        inp_l = norm(&mut b, "layer_out", "layer_output_norm", &cur);
    }
    b.layer(None);
    b.embd(&inp_l);
    Ok(b.finish(inp_l))
}
