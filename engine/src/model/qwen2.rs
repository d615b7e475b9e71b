//! Qwen2 / Qwen2.5: the llama layout plus biases on q, k and v, neox-style rope, and (for most
//! sizes) an output matrix of its own.

use super::{decoder, HParams};
use crate::error::Result;
use crate::exec::RopeParams;
use crate::graph::build::{gated_ffn, AttnSpec};
use crate::graph::GraphFile;
use abi::{GLU_SILU, ROPE_NEOX};

pub fn build(hp: &HParams, has: &dyn Fn(&str) -> bool) -> Result<GraphFile> {
    let mut rope = RopeParams::new(ROPE_NEOX, hp.n_rot as i64, hp.rope_base, hp.n_ctx_train as i64);
    rope.freq_scale = hp.rope_freq_scale;
    let spec = AttnSpec {
        head_dim: hp.head_dim,
        n_head: hp.n_head,
        n_head_kv: hp.n_head_kv,
        eps: hp.eps,
        rope,
        window: 0,
        kq_scale: 1.0 / (hp.head_dim as f32).sqrt(),
        q_scale: None,
        qkv_bias: true,
        qk_norm: false,
    };
    let ffn = |b: &mut _, x: &str, il| gated_ffn(b, x, il, GLU_SILU);
    Ok(decoder::pre_norm(hp, &spec, &ffn, has))
}
