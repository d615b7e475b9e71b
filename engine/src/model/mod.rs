//! Architectures as graph builders, one short file each: hyper-parameters read from GGUF
//! metadata, and a function writing the model's graph (see [`crate::graph`]) from the blocks
//! in [`crate::graph::build`]. The graph, not this code, is what runs: a package carries its
//! own and needs none of these.

pub mod bert;
pub mod gemma3;
pub mod lfm2;
pub mod llama;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen35;
pub mod qwen3moe;
pub mod rwkv7;

mod decoder;
mod hparams;

pub use hparams::HParams;

use crate::error::{EngineError, Result};
use crate::graph::{GraphFile, Program};
use crate::tensor::Weight;
use loader::ModelFile;

/// Writes an architecture's graph; `has(name)` says whether the file has a tensor (tied
/// output, optional biases).
pub type Builder = fn(&HParams, &dyn Fn(&str) -> bool) -> Result<GraphFile>;

/// Architectures mollm has builders for, by GGUF `general.architecture`.
pub const ARCHITECTURES: &[(&str, &str, Builder)] = &[
    (
        "llama",
        "Llama 2/3 family, SmolLM, Mixtral-style MoE (RMSNorm, rope, SwiGLU or routed experts, GQA)",
        llama::build,
    ),
    (
        "qwen2",
        "Qwen2 / Qwen2.5 (llama plus QKV bias, neox rope)",
        qwen2::build,
    ),
    (
        "qwen2moe",
        "Qwen2-MoE (qwen2 attention, routed top-k experts plus a gated shared expert)",
        qwen2moe::build,
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
    (
        "qwen35",
        "Qwen3.5 dense (gated delta-net linear attention beside gated full attention, SwiGLU)",
        qwen35::build,
    ),
    (
        "qwen35moe",
        "Qwen3.5-MoE (Qwen3.5's layers with routed SwiGLU experts and a sigmoid-gated shared expert)",
        qwen35::build,
    ),
    (
        "qwen3next",
        "Qwen3-Next (Qwen3.5-MoE's layers; value heads grouped by key head, beta and alpha in one projection)",
        qwen35::build,
    ),
    (
        "lfm2",
        "LFM2 (attention layers with q/k norms beside gated short-convolution layers, SwiGLU)",
        lfm2::build,
    ),
    (
        "lfm2moe",
        "LFM2-MoE (LFM2's layers with routed SwiGLU experts: sigmoid router, selection bias)",
        lfm2::build,
    ),
    (
        "bert",
        "BERT encoders for sentence embeddings (all-MiniLM, BGE): post-norm, attention over the whole input, GELU; no logits",
        bert::build,
    ),
    (
        "rwkv7",
        "RWKV-7 (attention-free: LayerNorms, token shift, time mixing by the generalized delta rule, squared-ReLU channel mixing)",
        rwkv7::build,
    ),
];

/// Refuses a file whose architecture mollm has no builder for, naming what it does have.
pub fn check_architecture(gguf: &ModelFile) -> Result<()> {
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

/// The graph the builders write for this file.
pub fn build_graph(gguf: &ModelFile, hp: &HParams) -> Result<GraphFile> {
    check_architecture(gguf)?;
    let (_, _, build) = ARCHITECTURES
        .iter()
        .find(|(name, _, _)| *name == hp.arch)
        .expect("checked");
    build(hp, &|name| gguf.tensor(name).is_some())
}

/// The file's tensor `name` as an operand.
pub fn file_weight(gguf: &ModelFile, name: &str) -> Option<Weight> {
    let info = gguf.tensor(name)?;
    let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
    if shape.is_empty() || shape.len() > 4 || shape[0] % info.dtype.info().block_len as i64 != 0 {
        return None;
    }
    let data = gguf.tensor_data(info);
    let mut desc = abi::TensorDesc::contiguous(data.as_ptr() as *mut u8, info.dtype, &shape);
    if info.expert_stride != 0 {
        // Interleaved experts (a `.mollm` package): matrix e at e * stride; only 3-D stacks
        // are strided, so the fourth dimension (1) steps over all of them.
        desc.nb[2] = info.expert_stride as i64;
        desc.nb[3] = desc.nb[2] * desc.ne[2];
    }
    Some(Weight {
        desc,
        file_mapped: gguf.is_file_mapped(),
        cache_slot: false,
        room: 0,
    })
}

/// Checks `graph` against the file's weights. A weight the graph does not use is refused, as
/// llama.cpp refuses a file with tensors its architecture does not create: running the model
/// without it would compute something else than the file means (a bias, a scale).
pub fn bind(gguf: &ModelFile, graph: GraphFile) -> Result<Program> {
    let file = gguf.path.display().to_string();
    let program = crate::graph::compile(graph, &|name| file_weight(gguf, name), &file)?;
    let mut used: std::collections::HashSet<&str> =
        program.weight_names.iter().map(String::as_str).collect();
    // Required by the architecture, read by no graph (named by the builder).
    used.extend(program.file.unused.iter().map(String::as_str));
    // Multi-token-prediction blocks (after the trunk's layers) are the file's, not the graph's.
    let c = |k: &str| program.file.consts.get(k).copied().unwrap_or(0);
    let mtp = c("n_layer")..c("n_layer") + c("n_layer_mtp");
    let in_mtp = |name: &str| {
        let block = name.strip_prefix("blk.").and_then(|r| r.split('.').next());
        block
            .and_then(|b| b.parse::<i64>().ok())
            .is_some_and(|b| mtp.contains(&b))
    };
    if let Some(t) = gguf
        .tensors
        .iter()
        .find(|t| !used.contains(t.name.as_str()) && !in_mtp(&t.name))
    {
        return Err(EngineError::Model {
            file,
            msg: format!(
                "tensor '{}' is not used by the {} graph ({} of the file's {} tensors are): mollm does not know what it does here",
                t.name,
                program.file.arch,
                used.len(),
                gguf.tensors.len()
            ),
        });
    }
    Ok(program)
}
