//! Qwen3.5 (dense and MoE) and Qwen3-Next (llama.cpp's `qwen35`, `qwen35moe`, `qwen3next`):
//! a pre-norm decoder whose layers are mostly gated delta-net linear attention, with full
//! attention every few layers (`attention.recurrent_layers`, or each
//! `full_attention_interval`-th). Attention layers take each head's query and an output gate
//! from `attn_q`, norm q and k per head, and multiply the output by sigmoid(gate). Delta-net
//! layers project q, k and v (`attn_qkv`), run them through a causal convolution with silu
//! whose window each sequence keeps, then through the gated delta rule on a per-sequence
//! state; the output is RMS-normed per head and multiplied by silu(z) (`attn_gate`) before
//! `ssm_out`. FFNs are SwiGLU (qwen35) or routed experts plus a sigmoid-gated shared expert.
//! The pre-FFN norm is `post_attention_norm`; the rows that produce logits are chosen after
//! the final norm, as llama.cpp does for these models.

use super::{decoder, hparams::Ssm, HParams};
use crate::error::{EngineError, Result};
use crate::graph::build::{self, gated_ffn, moe_ffn, w, Builder, TOKENS};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let arch = hp.arch.as_str();
    let invalid = |msg: String| EngineError::Invalid(format!("{arch}: {msg}"));
    let ssm = hp
        .ssm
        .ok_or_else(|| invalid(format!("missing metadata key '{arch}.ssm.conv_kernel'")))?;
    let moe = arch != "qwen35";
    if moe && hp.n_expert == 0 {
        return Err(invalid(format!(
            "missing metadata key '{arch}.expert_count'"
        )));
    }
    if arch != "qwen3next" {
        check_sections(hp)?;
    }
    let mut spec = decoder::attn_spec(hp, ROPE_NEOX, false, true);
    spec.output_gate = true;
    let mut b = Builder::new(arch);
    decoder::constants(&mut b, hp);
    let mut x = b.get_rows("inp_embd", &w("token_embd.weight"), TOKENS);
    for il in 0..hp.n_layer {
        b.layer(Some(il));
        let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
        let normed = b.rms_norm("attn_norm", &x, &n("attn_norm"), hp.eps);
        let cur = match hp.recurrent_layers[il] {
            true => delta_net(&mut b, &normed, il, hp, &ssm, has),
            false => build::attention(&mut b, &normed, il, &spec),
        };
        let h = b.add("attn_residual", &cur, &x);
        let normed = b.rms_norm("attn_post_norm", &h, &n("post_attention_norm"), hp.eps);
        let out = match moe {
            false => gated_ffn(&mut b, &normed, il, GLU_SILU),
            true => {
                // Softmax router, renormalized top-k, as llama.cpp's graph hard-codes.
                let routed = moe_ffn(&mut b, &normed, il, hp.n_expert_used, true, GLU_SILU);
                let shared = build::shared_expert(&mut b, &normed, il, GLU_SILU, true);
                b.add("ffn_out", &routed, &shared)
            }
        };
        x = b.add("post_ffn", &out, &h);
    }
    b.layer(None);
    let normed = b.rms_norm("result_norm", &x, &w("output_norm.weight"), hp.eps);
    let rows = build::select_outputs(&mut b, "result_rows", &normed);
    b.embd(&rows);
    let out = match has("output.weight") {
        true => "output.weight",
        false => "token_embd.weight",
    };
    let logits = b.matmul("result_output", &w(out), &rows);
    Ok(b.finish(logits))
}

/// Qwen3.5's rope is llama.cpp's interleaved multi-section rope; on text (every section at
/// the token's position) it is neox rope wherever each rotated pair falls in a section. A
/// pair left to the fourth section would stay unrotated, which mollm's rope does not do.
fn check_sections(hp: &HParams) -> Result<()> {
    let s = &hp.rope_sections;
    if s.len() < 3 || s[..3].iter().all(|&x| x == 0) {
        return Err(EngineError::Invalid(format!(
            "{}: '{}.rope.dimension_sections' must give the sections of its rope, got {s:?}",
            hp.arch, hp.arch
        )));
    }
    let total: usize = s.iter().take(4).sum();
    let rotated = |j: usize| {
        let sector = j % total;
        (sector % 3 == 0 && sector < 3 * s[0])
            || (sector % 3 == 1 && sector < 3 * s[1])
            || (sector % 3 == 2 && sector < 3 * s[2])
    };
    match (0..hp.n_rot / 2).find(|&j| !rotated(j)) {
        None => Ok(()),
        Some(j) => Err(EngineError::Invalid(format!(
            "{}: rope sections {s:?} leave dimension pair {j} of {} unrotated on text, which mollm's rope does not do yet",
            hp.arch,
            hp.n_rot / 2
        ))),
    }
}

/// The gated delta-net mixer of layer `il` on the normalized input `x`.
fn delta_net(
    b: &mut Builder,
    x: &str,
    il: usize,
    hp: &HParams,
    ssm: &Ssm,
    has: &dyn Fn(&str) -> bool,
) -> String {
    let name = |t: &str| format!("blk.{il}.{t}");
    let n = |t: &str| w(&name(t));
    let (s, hk, hv) = (ssm.head_dim, ssm.k_heads, ssm.v_heads);
    let qkv = b.matmul("linear_attn_qkv_mixed", &n("attn_qkv.weight"), x);
    let z = b.matmul("z", &n("attn_gate.weight"), x);
    // Qwen3-Next packs beta and alpha per key head: [beta (r) | alpha (r)] with r value heads
    // each, so its value heads stay grouped by key head.
    let grouped = has(&name("ssm_ba.weight"));
    let (beta, alpha) = match grouped {
        true => {
            let ba = b.matmul("ba", &n("ssm_ba.weight"), x);
            let r = (hv / hk) as f64;
            let part = |b: &mut Builder, nm: &str, offset: f64| {
                let attrs = [("period", 2.0 * r), ("offset", offset), ("len", r)];
                b.node(nm, "rows", &[&ba], &attrs)
            };
            (part(b, "beta", 0.0), part(b, "alpha", r))
        }
        false => (
            b.matmul("beta", &n("ssm_beta.weight"), x),
            b.matmul("alpha", &n("ssm_alpha.weight"), x),
        ),
    };
    let conv_state = b.state((ssm.conv_kernel - 1) * ssm.conv_channels());
    let conv = b.node(
        "conv_output_silu",
        "causal_conv",
        &[&qkv, &n("ssm_conv1d.weight")],
        &[("state", conv_state as f64), ("silu", 1.0)],
    );
    let state = b.state(s * s * hv);
    let o = b.node(
        "attn_output",
        "delta_net",
        &[&conv, &beta, &alpha, &n("ssm_dt.bias"), &w(&name("ssm_a"))],
        &[
            ("state", state as f64),
            ("k_heads", hk as f64),
            ("head_dim", s as f64),
            ("eps", hp.eps as f64),
            ("grouped", if grouped { 1.0 } else { 0.0 }),
        ],
    );
    // rms(o) * ssm_norm * silu(z), per value head.
    let heads = [s.to_string(), hv.to_string(), "T".to_string()];
    let heads: Vec<&str> = heads.iter().map(String::as_str).collect();
    let o = b.reshape("attn_output", &o, &heads);
    let normed = b.rms_norm("attn_out_norm", &o, &n("ssm_norm.weight"), hp.eps);
    let z = b.reshape("z", &z, &heads);
    let gated = b.glu("attn_out_gated", &z, &normed, GLU_SILU);
    let flat = (s * hv).to_string();
    let gated = b.reshape("final_output", &gated, &[&flat, "T"]);
    b.matmul("linear_attn_out", &n("ssm_out.weight"), &gated)
}
