//! Hugging Face model directories: `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`; F32, F16, BF16), `tokenizer.json`, `tokenizer_config.json`
//! (chat template, special tokens) and `generation_config.json`.
//!
//! The directory is turned into the model the rest of mollm already knows: GGUF metadata under
//! llama.cpp's key names and tensors under llama.cpp's tensor names and layouts (what
//! `convert_hf_to_gguf.py` would write, unquantized), assembled in memory. So a directory and
//! its GGUF conversion run through the same graph, tokenizer and chat template code.
//!
//! Everything read is untrusted: JSON fields are type-checked with errors naming the file and
//! field, safetensors headers are bounds-checked by the `safetensors` crate, shard names must be
//! plain file names inside the directory, and every tensor's shape must be what the
//! architecture expects (checked again when the graph is built).

mod config;
mod tensors;
mod vocab;

use std::path::{Path, PathBuf};

use crate::gguf::{ModelFile, Value};
use crate::LoadError;

pub use config::SUPPORTED;

/// Whether `path` looks like a Hugging Face model directory.
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// Loads a Hugging Face model directory (see the module docs).
pub fn open_dir(dir: &Path) -> Result<ModelFile, LoadError> {
    let mut cfg = config::Config::load(dir)?;
    // The config's problems before the weights are read.
    cfg.metadata(&mut Vec::new())?;
    let (infos, data) = tensors::load(dir, &cfg)?;
    if config::is_qwen35(cfg.arch) {
        tensors::qwen35_complete(dir, &cfg, &infos)?;
    }
    if cfg.arch == "bert" {
        tensors::bert_complete(dir, &cfg, &infos)?;
    }
    // Qwen3.5 / Qwen3-Next: the checkpoint's multi-token-prediction blocks follow the layers.
    cfg.n_mtp = infos
        .iter()
        .filter(|_| config::is_qwen35(cfg.arch))
        .filter_map(|t| {
            t.name
                .strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .filter(|&b| b >= cfg.n_layer)
        .map(|b| b - cfg.n_layer + 1)
        .max()
        .unwrap_or(0);
    let mut meta: Vec<(String, Value)> = Vec::new();
    meta.push((
        "general.name".into(),
        Value::String(
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
    ));
    cfg.metadata(&mut meta)?;
    vocab::metadata(dir, &cfg, &mut meta)?;
    ModelFile::assembled(dir.to_path_buf(), meta, infos, data)
}

/// A file of the directory, as error messages name it.
fn label(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn read_json(dir: &Path, name: &str) -> Result<Option<serde_json::Value>, LoadError> {
    let path: PathBuf = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LoadError::Io {
                file: label(dir, name),
                source,
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| LoadError::Format {
            file: label(dir, name),
            msg: format!("not valid JSON: {e}"),
        })
}

#[cfg(test)]
mod tests;
