//! RWKV-7 (llama.cpp's `rwkv7`): no attention and no KV cache. The embeddings pass a
//! LayerNorm, then each layer mixes time (a LayerNorm; the token shift against the previous
//! token, kept per sequence; six lerps into r, w, k, v, a, g; their projections and LoRAs;
//! the generalized delta rule `rwkv_wkv7` on a per-sequence state of one [N, N] block per
//! head; group norm; output projection) and channels (a LayerNorm, the token shift, one lerp,
//! squared ReLU between two projections), each added to the residual. Layers after the first
//! mix their values with layer 0's.

use super::{decoder, HParams};
use crate::error::Result;
use crate::graph::build::{self, w, Builder, TOKENS};
use crate::graph::GraphFile;

pub fn build(hp: &HParams, _has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let (e, s) = (hp.n_embd, hp.wkv_head_size);
    let mut b = Builder::new(&hp.arch);
    decoder::constants(&mut b, hp);
    let emb = b.get_rows("inp_embd", &w("token_embd.weight"), TOKENS);
    let mut inp_l = b.layer_norm(
        "inp_norm",
        &emb,
        &w("token_embd_norm.weight"),
        &w("token_embd_norm.bias"),
        hp.eps,
    );
    let mut v_first: Option<String> = None;
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let t = |name: &str| w(&format!("blk.{il}.{name}"));
        let att_state = b.state(e);
        let ffn_state = b.state(e);
        let wkv_state = b.state(e * s);
        let norm = |b: &mut Builder, name: &str, x: &str, which: &str| {
            let (wt, bs) = (t(&format!("{which}.weight")), t(&format!("{which}.bias")));
            b.layer_norm(name, x, &wt, &bs, hp.eps)
        };

        // Time mixing.
        let att_norm = norm(&mut b, "attn_norm", &inp_l, "attn_norm");
        let sx = b.node(
            "att_shift",
            "token_shift",
            &[&att_norm],
            &[("state", att_state as f64)],
        );
        let mu = t("time_mix_lerp_fused.weight");
        let lerps: Vec<String> = ["xr", "xw", "xk", "xv", "xa", "xg"]
            .iter()
            .enumerate()
            .map(|(k, name)| b.node(name, "lerp", &[&sx, &att_norm, &mu], &[("index", k as f64)]))
            .collect();
        let [xr, xw, xk, xv, xa, xg] = &lerps[..] else {
            unreachable!("six lerps")
        };
        let lora = |b: &mut Builder, name: &str, x: &str, which: &str| {
            let h = b.matmul(
                &format!("{name}_lora_in"),
                &t(&format!("time_mix_{which}1.weight")),
                x,
            );
            (
                b.matmul(
                    &format!("{name}_lora"),
                    &t(&format!("time_mix_{which}2.weight")),
                    &h,
                ),
                h,
            )
        };
        let r = b.matmul("r", &t("time_mix_receptance.weight"), xr);
        let w_in = b.matmul("w_lora_in", &t("time_mix_w1.weight"), xw);
        let w_tanh = b.node("w_tanh", "tanh", &[&w_in], &[]);
        let w_lo = b.matmul("w_lora", &t("time_mix_w2.weight"), &w_tanh);
        let k = b.matmul("k", &t("time_mix_key.weight"), xk);
        let v = b.matmul("v", &t("time_mix_value.weight"), xv);
        let v_mix = v_first.as_ref().map(|_| lora(&mut b, "v", xv, "v").0);
        let g_in = b.matmul("g_lora_in", &t("time_mix_g1.weight"), xg);
        let g_sig = b.node("g_sigmoid", "sigmoid", &[&g_in], &[]);
        let g = b.matmul("g", &t("time_mix_g2.weight"), &g_sig);
        let (a_lo, _) = lora(&mut b, "a", xa, "a");
        let mut ins: Vec<String> = vec![
            r,
            w_lo,
            k,
            v.clone(),
            a_lo,
            g,
            t("time_mix_w0.weight"),
            t("time_mix_a0.weight"),
            t("time_mix_k_k.weight"),
            t("time_mix_k_a.weight"),
            t("time_mix_r_k.weight"),
            t("time_mix_ln.weight"),
            t("time_mix_ln.bias"),
        ];
        match (&v_first, v_mix) {
            (Some(vf), Some(vm)) => ins.extend([vf.clone(), vm, t("time_mix_v0.weight")]),
            _ => {
                // llama.cpp requires layer 0's value-mix LoRA and never reads it.
                for p in ["v0", "v1", "v2"] {
                    b.unused(&format!("blk.{il}.time_mix_{p}.weight"));
                }
                v_first = Some(v);
            }
        }
        let ins: Vec<&str> = ins.iter().map(String::as_str).collect();
        let mixed = b.node(
            "time_mix",
            "rwkv7_time_mix",
            &ins,
            &[("state", wkv_state as f64), ("head_size", s as f64)],
        );
        let cur = b.matmul("time_mix_out", &t("time_mix_output.weight"), &mixed);
        let mut ffn_inp = b.add("ffn_inp", &cur, &inp_l);

        // Channel mixing; after the last layer's shift, only the rows that give logits.
        let mut ffn_norm = norm(&mut b, "ffn_norm", &ffn_inp, "attn_norm_2");
        let mut fsx = b.node(
            "ffn_shift",
            "token_shift",
            &[&ffn_norm],
            &[("state", ffn_state as f64)],
        );
        if il == hp.n_layer - 1 {
            ffn_inp = build::select_outputs(&mut b, "ffn_inp_rows", &ffn_inp);
            ffn_norm = build::select_outputs(&mut b, "ffn_norm_rows", &ffn_norm);
            fsx = build::select_outputs(&mut b, "ffn_shift_rows", &fsx);
        }
        let xk = b.node(
            "ffn_xk",
            "lerp",
            &[&fsx, &ffn_norm, &t("channel_mix_lerp_k.weight")],
            &[("index", 0.0)],
        );
        let kf = b.matmul("ffn_key", &t("channel_mix_key.weight"), &xk);
        let kf = b.node("ffn_relu_sqr", "relu_sqr", &[&kf], &[]);
        let cur = b.matmul("ffn_value", &t("channel_mix_value.weight"), &kf);
        inp_l = b.add("l_out", &cur, &ffn_inp);
    }
    b.layer(None);
    let normed = b.layer_norm(
        "result_norm",
        &inp_l,
        &w("output_norm.weight"),
        &w("output_norm.bias"),
        hp.eps,
    );
    b.embd(&normed);
    let logits = b.matmul("result_output", &w("output.weight"), &normed);
    Ok(b.finish(logits))
}
