//! `mollm convert SRC OUT.mollm`: a Hugging Face directory or a GGUF file (or a package) into
//! one `.mollm` package (loader::package), with the weight matrices in the chosen format.
//!
//! Modes, per 2-D (or stacked 3-D) weight matrix with rows of `k` elements; 1-D tensors (norms,
//! biases) are stored as F32, MoE routers (`ffn_gate_inp`) as they are, since a rounded router
//! changes which experts run:
//! - `keep`: every tensor as in the source (GGUF K-quants stay K-quants).
//! - `fp16`: F16.
//! - `w8pc`: W8PC (8-bit, one scale per output row).
//! - `w4g128` / `w4g32`: 4-bit, one scale per 128 / 32 elements.
//! - `w4mixg128` / `w4mixg32`: 4-bit, except the tensors most sensitive to rounding, kept in
//!   W8PC: the token embeddings and the output matrix (every token's input and every logit go
//!   through them, and with a vocabulary of 50k-250k rows they dominate small models), and the
//!   attention value and output projections (values reach the residual stream without a
//!   normalization or a softmax in between; llama.cpp's K-quant mixes upgrade `attn_v` too).
//!
//! A format needs whole groups: rows that are not a multiple of 128 fall back to W4G32, of 64 (W8PC)
//! or 32 to F16; the summary says how many did.

use crate::common::{human_bytes, CliResult};
use abi::DType;
use clap::{Args, ValueEnum};
use loader::package::{PackTensor, Writer};
use loader::{ModelFile, TensorInfo};
use std::path::PathBuf;

/// The source's metadata with the model's graph, which the package carries so that running it
/// needs no architecture code: a package source keeps its own, other sources get the graph
/// the architecture's builder writes for them.
fn with_graph(src: &ModelFile) -> CliResult<Vec<(String, loader::Value)>> {
    let mut meta = src.metadata.clone();
    if src.get_str(loader::package::GRAPH_KEY)?.is_none() {
        engine::model::check_architecture(src)?;
        let hp = engine::model::HParams::from_gguf(src)?;
        let g = engine::model::build_graph(src, &hp)?;
        // Refuse now what would be refused at load.
        engine::model::bind(src, g.clone())?;
        meta.push((
            loader::package::GRAPH_KEY.into(),
            loader::Value::String(g.to_json()),
        ));
    }
    Ok(meta)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Fp16,
    W8pc,
    W4g128,
    W4g32,
    W4mixg128,
    W4mixg32,
    Keep,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Fp16 => "fp16",
            Mode::W8pc => "w8pc",
            Mode::W4g128 => "w4g128",
            Mode::W4g32 => "w4g32",
            Mode::W4mixg128 => "w4mixg128",
            Mode::W4mixg32 => "w4mixg32",
            Mode::Keep => "keep",
        }
    }
}

/// `--fit`'s candidates, best quality first (the perplexity table of docs/src/formats.md backs the order).
pub const FIT_ORDER: [Mode; 6] = [
    Mode::Fp16,
    Mode::W8pc,
    Mode::W4mixg32,
    Mode::W4mixg128,
    Mode::W4g32,
    Mode::W4g128,
];

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Source: a Hugging Face model directory, a GGUF file or a .mollm package.
    pub src: PathBuf,
    /// The package to write.
    pub out: PathBuf,
    /// Weight format (see `mollm convert --help`).
    #[arg(long, value_enum, default_value = "w4g128")]
    pub quant: Mode,
    /// Choose the best mode whose package fits in this many bytes (K/M/G suffixes: powers of
    /// 1024), instead of --quant.
    #[arg(long, value_parser = parse_bytes)]
    pub fit: Option<u64>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => {
                    return Err(format!(
                        "'{s}': unknown size suffix '{c}' (use K, M, G or T)"
                    ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size in bytes (e.g. 300M, 1.5G)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("'{s}': the size must be positive"));
    }
    Ok((v * mult as f64) as u64)
}

/// Tensors kept at full precision whatever the mode.
fn sensitive(name: &str) -> bool {
    name == "token_embd.weight"
        || name == "output.weight"
        || name.ends_with(".attn_v.weight")
        || name.ends_with(".attn_output.weight")
}

/// The format `mode` gives tensor `t`.
pub fn target(mode: Mode, t: &TensorInfo) -> DType {
    if t.shape.len() < 2 {
        return DType::F32;
    }
    if mode == Mode::Keep || t.name.contains("ffn_gate_inp") {
        return t.dtype;
    }
    let k = t.shape[0];
    let w8 = if k % 64 == 0 { DType::W8PC } else { DType::F16 };
    let w4 = |g: u64| match g {
        128 if k % 128 == 0 => DType::W4G128,
        _ if k % 32 == 0 => DType::W4G32,
        _ => DType::F16,
    };
    match mode {
        Mode::Fp16 => DType::F16,
        Mode::W8pc => w8,
        Mode::W4g128 => w4(128),
        Mode::W4g32 => w4(32),
        Mode::W4mixg128 if sensitive(&t.name) => w8,
        Mode::W4mixg32 if sensitive(&t.name) => w8,
        Mode::W4mixg128 => w4(128),
        Mode::W4mixg32 => w4(32),
        Mode::Keep => unreachable!(),
    }
}

/// The tensors the graph multiplies (matrix products, embedding rows, expert FFNs): the ones a
/// mode may requantize. The others (convolution windows, decay and norm vectors, lerp factors)
/// are read by host code or ops that take f32, so they keep the source's format.
fn matrices(metadata: &[(String, loader::Value)]) -> CliResult<std::collections::HashSet<String>> {
    let graph = metadata
        .iter()
        .find(|(k, _)| k == loader::package::GRAPH_KEY)
        .and_then(|(_, v)| match v {
            loader::Value::String(s) => Some(s),
            _ => None,
        })
        .ok_or("the model's graph is missing")?;
    let g = engine::graph::GraphFile::from_json(graph.as_bytes(), "the model's graph")?;
    let mut out = std::collections::HashSet::new();
    for n in &g.nodes {
        let operands: &[String] = match n.op.as_str() {
            "mat_mul" | "get_rows" => &n.inputs[..1.min(n.inputs.len())],
            "moe_ffn" | "shared_expert" => &n.inputs[2.min(n.inputs.len())..5.min(n.inputs.len())],
            _ => &[],
        };
        out.extend(
            operands
                .iter()
                .filter_map(|s| s.strip_prefix('@'))
                .map(str::to_string),
        );
    }
    Ok(out)
}

fn plan(
    src: &ModelFile,
    mode: Mode,
    matrices: &std::collections::HashSet<String>,
) -> Vec<PackTensor> {
    src.tensors
        .iter()
        .map(|t| PackTensor {
            name: t.name.clone(),
            dtype: match matrices.contains(&t.name) {
                true => target(mode, t),
                false if t.shape.len() < 2 => DType::F32,
                false => t.dtype,
            },
            shape: t.shape.clone(),
        })
        .collect()
}

/// Tensor `t` of `src` in format `to`, row by row (dequantize, then quantize), on all cores.
fn convert_tensor(src: &ModelFile, t: &TensorInfo, to: DType) -> CliResult<Vec<u8>> {
    let packed = src.tensor_packed(t);
    if to == t.dtype {
        return Ok(packed.into_owned());
    }
    let data: &[u8] = &packed;
    let k = t.shape[0] as usize;
    let rows = (t.n_elements() as usize) / k.max(1);
    let (irb, orb) = (
        quant::row_bytes(t.dtype, k).ok_or("bad source row")?,
        quant::row_bytes(to, k).ok_or("bad target row")?,
    );
    let mut out = vec![0u8; rows * orb];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    let err = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        for (ci, chunk) in out.chunks_mut(per * orb).enumerate() {
            let err = &err;
            s.spawn(move || {
                let mut row = vec![0f32; k];
                for (j, dst) in chunk.chunks_mut(orb).enumerate() {
                    let r = ci * per + j;
                    let res =
                        quant::dequantize_row(t.dtype, &data[r * irb..(r + 1) * irb], &mut row)
                            .and_then(|_| quant::quantize_row(to, &row, dst));
                    if let Err(e) = res {
                        *err.lock().unwrap() = Some(format!("tensor '{}': {e}", t.name));
                        return;
                    }
                }
            });
        }
    });
    match err.into_inner().unwrap() {
        Some(e) => Err(e.into()),
        None => Ok(out),
    }
}

pub fn convert(a: ConvertArgs) -> CliResult {
    if a.out.extension().and_then(|e| e.to_str()) != Some("mollm") {
        return Err(format!("{}: the output must be a .mollm file", a.out.display()).into());
    }
    if a.out.exists() && a.out.canonicalize().ok() == a.src.canonicalize().ok() {
        return Err(format!("{}: output and source are the same file", a.out.display()).into());
    }
    let src = loader::open_model(&a.src)?;
    let arch = src.architecture()?.to_string();
    let metadata = with_graph(&src)?;
    if !engine::model::ARCHITECTURES
        .iter()
        .any(|(n, _, _)| *n == arch)
    {
        return Err(format!(
            "{}: architecture '{arch}' is not one mollm runs",
            a.src.display()
        )
        .into());
    }
    let source = a
        .src
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let matrices = matrices(&metadata)?;
    let len = |m: Mode| {
        let tensors = plan(&src, m, &matrices);
        loader::package::package_len(&arch, m.name(), &source, &metadata, &tensors)
    };
    let mode = match a.fit {
        None => a.quant,
        Some(limit) => {
            let mut sizes = Vec::new();
            let mut chosen = None;
            for m in FIT_ORDER {
                let n = len(m)?;
                sizes.push(format!("{} {}", m.name(), human_bytes(n)));
                if n <= limit && chosen.is_none() {
                    chosen = Some(m);
                }
            }
            let Some(m) = chosen else {
                return Err(format!(
                    "--fit {}: no mode fits (smallest: {})",
                    human_bytes(limit),
                    sizes.last().unwrap()
                )
                .into());
            };
            eprintln!(
                "--fit {}: chose {} (best quality that fits; {})",
                human_bytes(limit),
                m.name(),
                sizes.join(", ")
            );
            m
        }
    };
    let tensors = plan(&src, mode, &matrices);
    let mut w = Writer::create(&a.out, &arch, mode.name(), &source, &metadata, &tensors)?;
    let bar = crate::progress::bar(a.quiet, tensors.len() as u64, "tensors");
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, (t, p)) in src.tensors.iter().zip(&tensors).enumerate() {
        bar.set_message(t.name.clone());
        let bytes = convert_tensor(&src, t, p.dtype)?;
        w.tensor(i, &bytes)?;
        *counts.entry(p.dtype.name().to_string()).or_default() += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let total = w.file_len();
    w.finish()?;
    let fallback = tensors
        .iter()
        .zip(&src.tensors)
        .filter(|(p, t)| {
            t.shape.len() >= 2 && p.dtype == DType::F16 && mode != Mode::Fp16 && mode != Mode::Keep
        })
        .count();
    println!(
        "{}: {} ({} mode, from {}): {}{}",
        a.out.display(),
        human_bytes(total),
        mode.name(),
        source,
        counts
            .iter()
            .map(|(d, n)| format!("{n} {d}"))
            .collect::<Vec<_>>()
            .join(", "),
        if fallback > 0 {
            format!("; {fallback} matrices in F16 (rows not whole groups)")
        } else {
            String::new()
        }
    );
    Ok(())
}
