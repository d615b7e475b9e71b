//! LFM2 and LFM2-MoE (llama.cpp's `lfm2`, `lfm2moe`): a pre-norm decoder whose layers are
//! either attention (q/k head norms, neox rope, GQA; a sliding window on every attention layer
//! when an `lfm2` file names one) or a gated short convolution (`in_proj` into b, c and x,
//! `c * conv(b * x)` over a window of `shortconv.l_cache` tokens kept per sequence,
//! `out_proj`); the per-layer KV head count is 0 for the latter. SwiGLU FFNs; in LFM2-MoE the
//! layers from `leading_dense_block_count` on route to experts by sigmoid probabilities with a
//! selection bias. The final norm is `token_embd_norm`.

use super::{decoder, HParams};
use crate::error::{EngineError, Result};
use crate::graph::build::{self, gated_ffn, moe_ffn_sigmoid, w, Builder, TOKENS};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let moe = hp.arch == "lfm2moe";
    if moe && (hp.n_expert == 0 || hp.expert_gating != 2) {
        return Err(EngineError::Invalid(format!(
            "lfm2moe: {} experts with gating {} (llama.cpp's converter writes experts with sigmoid gating, expert_gating_func 2)",
            hp.n_expert, hp.expert_gating
        )));
    }
    // llama.cpp reads the sliding window for lfm2 only.
    let window = if moe { 0 } else { hp.n_swa };
    let mut b = Builder::new(&hp.arch);
    decoder::constants(&mut b, hp);
    let mut inp_l = b.get_rows("inp_embd", &w("token_embd.weight"), TOKENS);
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let mut inp_sa = inp_l.clone();
        let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
        let normed = b.rms_norm("attn_norm", &inp_l, &n("attn_norm"), hp.eps);
        let mut cur = match hp.n_head_kv_layers[il] {
            0 => short_conv(&mut b, &normed, il, hp),
            n_head_kv => {
                let mut spec = decoder::attn_spec(hp, ROPE_NEOX, false, true);
                spec.n_head_kv = n_head_kv;
                spec.window = window;
                build::attention(&mut b, &normed, il, &spec)
            }
        };
        if il == hp.n_layer - 1 {
            cur = build::select_outputs(&mut b, "attn_out_rows", &cur);
            inp_sa = build::select_outputs(&mut b, "inp_sa_rows", &inp_sa);
        }
        let ffn_inp = b.add("ffn_inp", &cur, &inp_sa);
        let normed = b.rms_norm("ffn_norm", &ffn_inp, &n("ffn_norm"), hp.eps);
        let out = match moe && il >= hp.n_layer_dense_lead {
            true => moe_ffn_sigmoid(&mut b, &normed, il, hp.n_expert_used, GLU_SILU),
            false => gated_ffn(&mut b, &normed, il, GLU_SILU),
        };
        inp_l = b.add("l_out", &out, &ffn_inp);
    }
    b.layer(None);
    let normed = b.rms_norm("result_norm", &inp_l, &w("token_embd_norm.weight"), hp.eps);
    b.embd(&normed);
    let out = if has("output.weight") {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let logits = b.matmul("result_output", &w(out), &normed);
    Ok(b.finish(logits))
}

/// `out_proj(c * conv(b * x))` with `[b; c; x] = in_proj(x)`, the window in recurrent state.
fn short_conv(b: &mut Builder, x: &str, il: usize, hp: &HParams) -> String {
    let n = |t: &str| w(&format!("blk.{il}.shortconv.{t}.weight"));
    let state = b.state((hp.shortconv_l_cache - 1) * hp.n_embd);
    let bcx = b.matmul("conv_in_proj", &n("in_proj"), x);
    let y = b.node(
        "conv_out",
        "short_conv",
        &[&bcx, &n("conv")],
        &[("state", state as f64)],
    );
    b.matmul("conv_out_proj", &n("out_proj"), &y)
}
