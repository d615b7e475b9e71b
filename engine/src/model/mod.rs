//! Model graphs, one file per architecture, and what they share: hyper-parameters read from
//! GGUF metadata, weight lookup with shape checks, and the attention block.

pub mod gemma3;
pub mod llama;
pub mod moe;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3moe;

mod common;
mod hparams;

pub use hparams::HParams;

use crate::error::{EngineError, Result};
use crate::exec::Exec;
use crate::kv::KvCache;
use crate::tensor::{Act, Weight};
use loader::GgufFile;

/// A decoder-only graph. `forward` runs `tokens` at positions `pos0..`, appends their keys and
/// values to `kv`, and returns logits `[n_vocab, out_rows.len()]` for the tokens at the given
/// indices (an empty list computes no logits).
pub trait Graph: Send + Sync {
    fn forward(
        &self,
        ex: &Exec,
        kv: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        out_rows: &[usize],
    ) -> Result<Act>;
}

type Builder = fn(&GgufFile, &HParams) -> Result<Box<dyn Graph>>;

/// Architectures mollm runs, by GGUF `general.architecture`.
pub const ARCHITECTURES: &[(&str, &str, Builder)] = &[
    (
        "llama",
        "Llama 2/3 family, SmolLM (RMSNorm, rope, SwiGLU, GQA)",
        llama::build,
    ),
    (
        "qwen2",
        "Qwen2 / Qwen2.5 (llama plus QKV bias, neox rope)",
        qwen2::build,
    ),
    (
        "qwen3",
        "Qwen3 dense (q/k head norms, neox rope, no QKV bias)",
        qwen3::build,
    ),
    (
        "qwen3moe",
        "Qwen3-MoE (Qwen3 attention, routed top-k SwiGLU experts)",
        qwen3moe::build,
    ),
    (
        "gemma3",
        "Gemma 3 (sliding-window + global layers, q/k norms, GeGLU, sandwich norms)",
        gemma3::build,
    ),
];

/// Refuses a file whose architecture mollm has no graph for, naming what it does have.
pub fn check_architecture(gguf: &GgufFile) -> Result<()> {
    let arch = gguf.architecture()?;
    if ARCHITECTURES.iter().any(|(name, _, _)| *name == arch) {
        return Ok(());
    }
    Err(EngineError::Model {
        file: gguf.path.display().to_string(),
        msg: format!(
            "unknown architecture '{arch}' (supported: {})",
            ARCHITECTURES
                .iter()
                .map(|a| a.0)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

pub fn build_graph(gguf: &GgufFile, hp: &HParams) -> Result<Box<dyn Graph>> {
    check_architecture(gguf)?;
    let (_, _, build) = ARCHITECTURES
        .iter()
        .find(|(name, _, _)| *name == hp.arch)
        .expect("checked");
    build(gguf, hp)
}

/// Looks a weight up by name and checks its shape (ggml order).
pub(crate) fn weight(gguf: &GgufFile, name: &str, shape: &[i64]) -> Result<Weight> {
    let file = || gguf.path.display().to_string();
    let info = gguf.tensor(name).ok_or_else(|| EngineError::Model {
        file: file(),
        msg: format!("missing tensor '{name}'"),
    })?;
    let got: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
    let mut want = shape.to_vec();
    while want.len() > 1 && *want.last().unwrap() == 1 && want.len() > got.len() {
        want.pop();
    }
    if got != want {
        return Err(EngineError::Model {
            file: file(),
            msg: format!("tensor '{name}' has shape {got:?}, expected {want:?}"),
        });
    }
    let data = gguf.tensor_data(info);
    Ok(Weight {
        desc: abi::TensorDesc::contiguous(data.as_ptr() as *mut u8, info.dtype, shape),
        file_mapped: gguf.is_file_mapped(),
    })
}

pub(crate) fn weight_opt(gguf: &GgufFile, name: &str, shape: &[i64]) -> Result<Option<Weight>> {
    if gguf.tensor(name).is_none() {
        return Ok(None);
    }
    weight(gguf, name, shape).map(Some)
}
