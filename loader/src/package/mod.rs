//! The single-file `.mollm` package: graph hyper-parameters, tokenizer, chat template and
//! weights in one file that is memory-mapped and run directly.
//!
//! ```text
//! 0   magic "MOLLMPKG"
//! 8   u32 version (1)            12  u32 header bytes (64)
//! 16  u64 metadata offset        24  u64 metadata bytes      (JSON, UTF-8)
//! 32  u64 data offset            40  u64 data bytes          (4096-aligned; tensors 64-aligned)
//! 48  u64 file bytes             56  u64 reserved (0)
//! ```
//!
//! The metadata JSON: `format`, `version`, `architecture`, `quant` (the conversion mode),
//! `source`, `metadata` (every GGUF-style key except the tokenizer's, each as
//! `{"key", "type", "value"}`), `tokenizer` and `chat_template` (`{"offset", "bytes"}` of their own
//! sections: the tokenizer keys in the same JSON encoding, the template as UTF-8 text), and
//! `tensors` (`name`, `dtype`, `shape` in ggml order, `offset` into the data section, `bytes`,
//! and for stacked MoE experts `experts`: one `[offset, bytes]` per expert, so that one expert
//! can be read alone).
//!
//! Version 2 interleaves a layer's routed experts: where `blk.N.ffn_{gate,up,down}_exps` all
//! stack the same number of experts, expert `e`'s gate, up and down matrices lie next to each
//! other (each 64-aligned) in one 4096-aligned block, and the blocks follow each other. One
//! read (one `O_DIRECT` read, aligned) then fetches a whole expert for the expert cache. Each
//! of the three tensors' `experts` ranges step by the block size; `offset` is expert 0's
//! matrix. A package with no such stack is written as version 1 (the same bytes as before).
//!
//! Loading checks the magic, the version, that every section and tensor lies inside the file,
//! that each tensor's size matches its shape and format, and that expert ranges are evenly
//! spaced, no closer than one matrix; every failure names the file and the field.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use abi::DType;
use serde_json::{json, Value as Json};

use crate::gguf::{tensor_bytes, Array, ModelFile, StrArray, TensorInfo, Value};
use crate::{printable, LoadError};

pub const MAGIC: &[u8; 8] = b"MOLLMPKG";
/// The newest version this build reads and writes (2: interleaved experts; 1 is still read,
/// and written when nothing is interleaved).
pub const VERSION: u32 = 2;
const HEADER: u64 = 64;
const DATA_ALIGN: u64 = 4096;
const TENSOR_ALIGN: u64 = 64;
/// Sanity bounds on untrusted counts.
const MAX_TENSORS: usize = 1 << 20;
const MAX_DIM: u64 = 1 << 40;

/// Whether the file starts with the package magic.
/// The model graph (JSON, versioned by its own `version`; see the engine's `graph` module):
/// written as the package's `graph` section, read back under this metadata key.
pub const GRAPH_KEY: &str = "mollm.graph";

pub fn is_package(path: &Path) -> bool {
    let mut m = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut m))
        .is_ok()
        && &m == MAGIC
}

// ------------------------------------------------------------------------- errors

/// What goes wrong writing a package, or reading one metadata entry of it. Keys and names
/// may come from a hostile source file, so they are shown through [`printable`].
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("metadata key '{}': {value} is not representable in JSON", printable(.key))]
    NotJsonNumber { key: String, value: f64 },
    #[error("metadata key '{}': a string that is not UTF-8", printable(.key))]
    NotUtf8 { key: String },
    #[error("metadata key '{}': nested arrays", printable(.key))]
    NestedArray { key: String },
    #[error("an entry without a \"key\" string")]
    NoKey,
    #[error("metadata key '{}': not a valid {ty:?} value", printable(.key))]
    BadValue { key: String, ty: String },
    #[error("metadata key '{}': unknown type {ty:?}", printable(.key))]
    UnknownType { key: String, ty: String },
    #[error("tensor '{}': {shape:?} is not whole {dtype} blocks", printable(.tensor))]
    NotWholeBlocks {
        tensor: String,
        shape: Vec<u64>,
        dtype: DType,
    },
    #[error("tensor {index}: {got} bytes, expected {expected}")]
    TensorBytes {
        index: usize,
        got: u64,
        expected: u64,
    },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> PackError + '_ {
    move |source| PackError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ------------------------------------------------------------------------- values ↔ JSON

fn value_json(key: &str, v: &Value) -> Result<Json, PackError> {
    let f = |x: f64| {
        serde_json::Number::from_f64(x)
            .map(Json::Number)
            .ok_or_else(|| PackError::NotJsonNumber {
                key: key.into(),
                value: x,
            })
    };
    let s = |b: &[u8]| {
        std::str::from_utf8(b)
            .map(|s| Json::String(s.to_string()))
            .map_err(|_| PackError::NotUtf8 { key: key.into() })
    };
    let (ty, val) = match v {
        Value::U8(x) => ("u8", json!(x)),
        Value::I8(x) => ("i8", json!(x)),
        Value::U16(x) => ("u16", json!(x)),
        Value::I16(x) => ("i16", json!(x)),
        Value::U32(x) => ("u32", json!(x)),
        Value::I32(x) => ("i32", json!(x)),
        Value::U64(x) => ("u64", json!(x)),
        Value::I64(x) => ("i64", json!(x)),
        Value::F32(x) => ("f32", f(*x as f64)?),
        Value::F64(x) => ("f64", f(*x)?),
        Value::Bool(x) => ("bool", json!(x)),
        Value::String(x) => ("str", s(x.as_bytes())?),
        Value::Array(a) => match a {
            Array::U8(v) => ("[u8]", json!(v)),
            Array::I8(v) => ("[i8]", json!(v)),
            Array::U16(v) => ("[u16]", json!(v)),
            Array::I16(v) => ("[i16]", json!(v)),
            Array::U32(v) => ("[u32]", json!(v)),
            Array::I32(v) => ("[i32]", json!(v)),
            Array::U64(v) => ("[u64]", json!(v)),
            Array::I64(v) => ("[i64]", json!(v)),
            Array::F32(v) => (
                "[f32]",
                Json::Array(v.iter().map(|&x| f(x as f64)).collect::<Result<_, _>>()?),
            ),
            Array::F64(v) => (
                "[f64]",
                Json::Array(v.iter().map(|&x| f(x)).collect::<Result<_, _>>()?),
            ),
            Array::Bool(v) => ("[bool]", json!(v)),
            Array::String(v) => (
                "[str]",
                Json::Array(v.iter_bytes().map(s).collect::<Result<_, _>>()?),
            ),
            Array::Array(_) => return Err(PackError::NestedArray { key: key.into() }),
        },
    };
    Ok(json!({"key": key, "type": ty, "value": val}))
}

fn json_value(e: &Json) -> Result<(String, Value), PackError> {
    let key = e
        .get("key")
        .and_then(|k| k.as_str())
        .ok_or(PackError::NoKey)?
        .to_string();
    let ty = e.get("type").and_then(|t| t.as_str()).unwrap_or("");
    let v = e.get("value").unwrap_or(&Json::Null);
    let bad = || PackError::BadValue {
        key: key.clone(),
        ty: ty.into(),
    };
    let int = |x: &Json| x.as_i64().or_else(|| x.as_u64().map(|u| u as i64));
    let list = || v.as_array().ok_or_else(bad);
    macro_rules! ints {
        ($t:ty) => {
            list()?
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|u| <$t>::try_from(u).ok())
                        .or_else(|| x.as_i64().and_then(|i| <$t>::try_from(i).ok()))
                })
                .collect::<Option<Vec<$t>>>()
                .ok_or_else(bad)?
        };
    }
    macro_rules! one {
        ($t:ty) => {
            int(v)
                .and_then(|i| <$t>::try_from(i).ok())
                .or_else(|| v.as_u64().and_then(|u| <$t>::try_from(u).ok()))
                .ok_or_else(bad)?
        };
    }
    let val = match ty {
        "u8" => Value::U8(one!(u8)),
        "i8" => Value::I8(one!(i8)),
        "u16" => Value::U16(one!(u16)),
        "i16" => Value::I16(one!(i16)),
        "u32" => Value::U32(one!(u32)),
        "i32" => Value::I32(one!(i32)),
        "u64" => Value::U64(v.as_u64().ok_or_else(bad)?),
        "i64" => Value::I64(v.as_i64().ok_or_else(bad)?),
        "f32" => Value::F32(v.as_f64().ok_or_else(bad)? as f32),
        "f64" => Value::F64(v.as_f64().ok_or_else(bad)?),
        "bool" => Value::Bool(v.as_bool().ok_or_else(bad)?),
        "str" => Value::String(v.as_str().ok_or_else(bad)?.to_string()),
        "[u8]" => Value::Array(Array::U8(ints!(u8))),
        "[i8]" => Value::Array(Array::I8(ints!(i8))),
        "[u16]" => Value::Array(Array::U16(ints!(u16))),
        "[i16]" => Value::Array(Array::I16(ints!(i16))),
        "[u32]" => Value::Array(Array::U32(ints!(u32))),
        "[i32]" => Value::Array(Array::I32(ints!(i32))),
        "[u64]" => Value::Array(Array::U64(ints!(u64))),
        "[i64]" => Value::Array(Array::I64(ints!(i64))),
        "[f32]" => Value::Array(Array::F32(
            list()?
                .iter()
                .map(|x| x.as_f64().map(|f| f as f32))
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
        )),
        "[f64]" => Value::Array(Array::F64(
            list()?
                .iter()
                .map(|x| x.as_f64())
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
        )),
        "[bool]" => Value::Array(Array::Bool(
            list()?
                .iter()
                .map(|x| x.as_bool())
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
        )),
        "[str]" => {
            let mut a = StrArray::default();
            for x in list()? {
                a.push(x.as_str().ok_or_else(bad)?.as_bytes());
            }
            Value::Array(Array::String(a))
        }
        other => {
            return Err(PackError::UnknownType {
                key,
                ty: other.into(),
            })
        }
    };
    Ok((key, val))
}

// ------------------------------------------------------------------------- writing

/// A tensor to write: its GGUF-style name, format, shape and (3-D MoE stacks) expert count.
#[derive(Clone, Debug)]
pub struct PackTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// Writes a package in one pass: [`Writer::create`] lays everything out and writes the header
/// and sections, [`Writer::tensor`] fills each tensor, [`Writer::finish`] renames the
/// temporary file into place (an interrupted conversion leaves no half-written package).
pub struct Writer {
    file: std::fs::File,
    tmp: PathBuf,
    out: PathBuf,
    data_offset: u64,
    places: Vec<Place>,
    data_len: u64,
}

/// Where a tensor goes in the data section: matrix `e` of `n` (`bytes / n` each) at
/// `offset + e * stride` (`stride` is the matrix's size unless experts are interleaved).
#[derive(Clone, Copy, Debug)]
struct Place {
    offset: u64,
    bytes: u64,
    n: u64,
    stride: u64,
}

/// Where everything goes: the encoded metadata and sections, the data offset, each tensor's
/// (offset, bytes) in the data section, and the file length.
struct Layout {
    meta: Vec<u8>,
    tok: Vec<u8>,
    template: Option<Vec<u8>>,
    graph: Option<Vec<u8>>,
    data_offset: u64,
    places: Vec<Place>,
    version: u32,
    file_len: u64,
}

/// The routed-expert stacks of each layer to interleave: (gate, up, down) indices into
/// `tensors`, where all three are 3-D with the same number of experts.
fn expert_groups(tensors: &[PackTensor]) -> Vec<[usize; 3]> {
    let find = |name: &str| tensors.iter().position(|t| t.name == name);
    let mut groups = Vec::new();
    for t in tensors {
        let Some(prefix) = t.name.strip_suffix(".ffn_gate_exps.weight") else {
            continue;
        };
        let ids = ["gate", "up", "down"].map(|p| find(&format!("{prefix}.ffn_{p}_exps.weight")));
        if let [Some(g), Some(u), Some(d)] = ids {
            let n = |i: usize| (tensors[i].shape.len() == 3).then(|| tensors[i].shape[2]);
            if n(g).is_some() && n(g) == n(u) && n(g) == n(d) {
                groups.push([g, u, d]);
            }
        }
    }
    groups
}

fn layout(
    architecture: &str,
    quant: &str,
    source: &str,
    metadata: &[(String, Value)],
    tensors: &[PackTensor],
) -> Result<Layout, PackError> {
    let mut meta = Vec::new();
    let mut tok = Vec::new();
    let mut template = None;
    let mut graph = None;
    for (k, v) in metadata {
        if k == GRAPH_KEY {
            if let Value::String(s) = v {
                graph = Some(s.clone().into_bytes());
            }
        } else if k == "tokenizer.chat_template" {
            if let Value::String(s) = v {
                template = Some(s.clone());
            }
        } else if k.starts_with("tokenizer.") {
            tok.push(value_json(k, v)?);
        } else if k != "general.alignment" {
            meta.push(value_json(k, v)?);
        }
    }
    let tok = Json::Array(tok).to_string().into_bytes();
    // The graph section rides behind the chat template in the same sections area.
    let template = template.map(String::into_bytes);
    let sizes = tensors
        .iter()
        .map(|t| {
            tensor_bytes(t.dtype, &t.shape).ok_or_else(|| PackError::NotWholeBlocks {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype,
            })
        })
        .collect::<Result<Vec<u64>, PackError>>()?;
    let groups = expert_groups(tensors);
    let mut places: Vec<Option<Place>> = vec![None; tensors.len()];
    let mut off = 0u64;
    for i in 0..tensors.len() {
        if places[i].is_some() {
            continue;
        }
        let n = if tensors[i].shape.len() == 3 {
            tensors[i].shape[2]
        } else {
            1
        };
        match groups.iter().find(|g| g.contains(&i)) {
            Some(g) => {
                // One block per expert: gate | up | down, each 64-aligned, the block 4096-aligned.
                off = off.next_multiple_of(DATA_ALIGN);
                let mut at = 0u64;
                let mut deltas = [0u64; 3];
                for (k, &j) in g.iter().enumerate() {
                    at = at.next_multiple_of(TENSOR_ALIGN);
                    deltas[k] = at;
                    at += sizes[j] / n;
                }
                let stride = at.next_multiple_of(DATA_ALIGN);
                for (k, &j) in g.iter().enumerate() {
                    places[j] = Some(Place {
                        offset: off + deltas[k],
                        bytes: sizes[j],
                        n,
                        stride,
                    });
                }
                off += stride * n;
            }
            None => {
                off = off.next_multiple_of(TENSOR_ALIGN);
                places[i] = Some(Place {
                    offset: off,
                    bytes: sizes[i],
                    n,
                    stride: sizes[i] / n,
                });
                off += sizes[i];
            }
        }
    }
    let places: Vec<Place> = places.into_iter().map(|p| p.expect("placed")).collect();
    let mut entries = Vec::with_capacity(tensors.len());
    for (t, p) in tensors.iter().zip(&places) {
        let mut e = json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape,
                           "offset": p.offset, "bytes": p.bytes});
        if t.shape.len() == 3 && t.name.contains("_exps") {
            let per = p.bytes / p.n;
            e["experts"] = Json::Array(
                (0..p.n)
                    .map(|x| json!([p.offset + x * p.stride, per]))
                    .collect(),
            );
        }
        entries.push(e);
    }
    let version = if groups.is_empty() { 1 } else { VERSION };
    let data_len = off;
    // The metadata holds section offsets that depend on its own length: iterate to a fixed
    // point (the offsets' digits settle in a step or two).
    let mut doc = json!({
        "format": "mollm-package", "version": version, "architecture": architecture,
        "quant": quant, "source": source, "metadata": meta,
        "tokenizer": {"offset": 0u64, "bytes": tok.len()},
        "chat_template": template.as_ref().map(|t| json!({"offset": 0u64, "bytes": t.len()})),
        "graph": graph.as_ref().map(|g| json!({"offset": 0u64, "bytes": g.len()})),
        "tensors": entries,
    });
    let mut bytes: Vec<u8> = Vec::new();
    for _ in 0..8 {
        let tok_off = HEADER + bytes.len() as u64;
        doc["tokenizer"]["offset"] = json!(tok_off);
        let tmpl_end = tok_off + tok.len() as u64;
        if template.is_some() {
            doc["chat_template"]["offset"] = json!(tmpl_end);
        }
        if graph.is_some() {
            doc["graph"]["offset"] =
                json!(tmpl_end + template.as_ref().map_or(0, |t| t.len() as u64));
        }
        let next = doc.to_string().into_bytes();
        let done = next.len() == bytes.len();
        bytes = next;
        if done {
            break;
        }
    }
    let sections_end = HEADER
        + bytes.len() as u64
        + tok.len() as u64
        + template.as_ref().map_or(0, |t| t.len() as u64)
        + graph.as_ref().map_or(0, |g| g.len() as u64);
    let data_offset = sections_end.div_ceil(DATA_ALIGN) * DATA_ALIGN;
    Ok(Layout {
        meta: bytes,
        tok,
        template,
        graph,
        data_offset,
        places,
        version,
        file_len: data_offset + data_len,
    })
}

/// The exact size of the package [`Writer::create`] would write.
pub fn package_len(
    architecture: &str,
    quant: &str,
    source: &str,
    metadata: &[(String, Value)],
    tensors: &[PackTensor],
) -> Result<u64, PackError> {
    Ok(layout(architecture, quant, source, metadata, tensors)?.file_len)
}

impl Writer {
    pub fn create(
        out: &Path,
        architecture: &str,
        quant: &str,
        source: &str,
        metadata: &[(String, Value)],
        tensors: &[PackTensor],
    ) -> Result<Writer, PackError> {
        let Layout {
            meta: bytes,
            tok,
            template,
            graph,
            data_offset,
            places,
            version,
            file_len,
        } = layout(architecture, quant, source, metadata, tensors)?;
        let meta_len = bytes.len() as u64;
        let data_len = file_len - data_offset;
        let tmp = out.with_extension("mollm.partial");
        let io = io_at(&tmp);
        let mut file = std::fs::File::create(&tmp).map_err(&io)?;
        let mut h = Vec::with_capacity(HEADER as usize);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&(HEADER as u32).to_le_bytes());
        for v in [HEADER, meta_len, data_offset, data_len, file_len, 0] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        file.write_all(&h).map_err(&io)?;
        file.write_all(&bytes).map_err(&io)?;
        file.write_all(&tok).map_err(&io)?;
        if let Some(t) = &template {
            file.write_all(t).map_err(&io)?;
        }
        if let Some(g) = &graph {
            file.write_all(g).map_err(&io)?;
        }
        file.set_len(file_len).map_err(&io)?;
        drop(io);
        Ok(Writer {
            file,
            tmp,
            out: out.to_path_buf(),
            data_offset,
            places,
            data_len,
        })
    }

    /// Writes tensor `i` (in the order given to [`Writer::create`]); `bytes` must be its size
    /// (its matrices back to back; interleaved experts are spread out here).
    pub fn tensor(&mut self, i: usize, bytes: &[u8]) -> Result<(), PackError> {
        let p = self.places[i];
        if bytes.len() as u64 != p.bytes {
            return Err(PackError::TensorBytes {
                index: i,
                got: bytes.len() as u64,
                expected: p.bytes,
            });
        }
        let io = io_at(&self.tmp);
        let per = (p.bytes / p.n.max(1)) as usize;
        if per as u64 == p.stride || per == 0 {
            self.file
                .seek(SeekFrom::Start(self.data_offset + p.offset))
                .map_err(&io)?;
            return self.file.write_all(bytes).map_err(&io);
        }
        for (e, m) in bytes.chunks(per).enumerate() {
            self.file
                .seek(SeekFrom::Start(
                    self.data_offset + p.offset + e as u64 * p.stride,
                ))
                .map_err(&io)?;
            self.file.write_all(m).map_err(&io)?;
        }
        Ok(())
    }

    /// Total bytes of the package.
    pub fn file_len(&self) -> u64 {
        self.data_offset + self.data_len
    }

    pub fn finish(self) -> Result<(), PackError> {
        self.file.sync_all().map_err(io_at(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.out).map_err(io_at(&self.out))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Not finished: remove the partial file (finish() renamed it away otherwise).
        let _ = std::fs::remove_file(&self.tmp);
    }
}

// ------------------------------------------------------------------------- reading

/// Maps and validates a package, returning it as the model the rest of mollm runs.
pub fn open(path: &Path) -> Result<ModelFile, LoadError> {
    let file = path.display().to_string();
    let io = |source| LoadError::Io {
        file: file.clone(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    // SAFETY: read-only map; the package must not change while it is mapped (as GGUF files).
    let map = unsafe { crate::gguf::map_readonly(&f) }.map_err(io)?;
    let (metadata, tensors) = parse(&map, &file)?;
    ModelFile::mapped(path.to_path_buf(), metadata, tensors, map)
}

/// Validates a package image; tensor offsets in the result are absolute.
pub fn parse(b: &[u8], file: &str) -> Result<(Vec<(String, Value)>, Vec<TensorInfo>), LoadError> {
    let err = |msg: String| LoadError::Format {
        file: file.to_string(),
        msg,
    };
    if b.len() < HEADER as usize || &b[..8] != MAGIC {
        return Err(err(format!(
            "not a mollm package (no {:?} magic in a {}-byte file)",
            std::str::from_utf8(MAGIC).unwrap(),
            b.len()
        )));
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let version = u32_at(8);
    if !(1..=VERSION).contains(&version) {
        return Err(err(format!(
            "package version {version} is not supported (this build reads versions 1 to {VERSION})"
        )));
    }
    let len = b.len() as u64;
    let (meta_off, meta_len, data_off, data_len, file_len) =
        (u64_at(16), u64_at(24), u64_at(32), u64_at(40), u64_at(48));
    if file_len != len {
        return Err(err(format!(
            "header says {file_len} bytes, the file has {len} (truncated or appended to)"
        )));
    }
    let within = |name: &str, off: u64, n: u64| -> Result<std::ops::Range<usize>, LoadError> {
        match off.checked_add(n) {
            Some(end) if off >= HEADER && end <= len => Ok(off as usize..end as usize),
            _ => Err(err(format!(
                "{name} ({n} bytes at {off}) lies outside the {len}-byte file"
            ))),
        }
    };
    let meta = &b[within("metadata", meta_off, meta_len)?];
    let data = within("data section", data_off, data_len)?;
    let doc: Json = serde_json::from_slice(meta)
        .map_err(|e| err(format!("metadata is not valid JSON: {e}")))?;
    let field = |name: &str| -> Result<&Json, LoadError> {
        doc.get(name)
            .ok_or_else(|| err(format!("metadata field '{name}' is missing")))
    };
    let mut metadata = Vec::new();
    let entries = field("metadata")?
        .as_array()
        .ok_or_else(|| err("metadata field 'metadata' is not a list".into()))?;
    for e in entries {
        metadata.push(json_value(e).map_err(|e| err(e.to_string()))?);
    }
    let section = |name: &str| -> Result<Option<&[u8]>, LoadError> {
        match doc.get(name) {
            None | Some(Json::Null) => Ok(None),
            Some(s) => {
                let (Some(o), Some(n)) = (
                    s.get("offset").and_then(|v| v.as_u64()),
                    s.get("bytes").and_then(|v| v.as_u64()),
                ) else {
                    return Err(err(format!(
                        "metadata field '{name}' needs offset and bytes"
                    )));
                };
                Ok(Some(&b[within(name, o, n)?]))
            }
        }
    };
    if let Some(tok) = section("tokenizer")? {
        let list: Json = serde_json::from_slice(tok)
            .map_err(|e| err(format!("tokenizer section is not valid JSON: {e}")))?;
        for e in list
            .as_array()
            .ok_or_else(|| err("tokenizer section is not a list".into()))?
        {
            metadata.push(json_value(e).map_err(|e| err(e.to_string()))?);
        }
    }
    if let Some(t) = section("chat_template")? {
        let t = std::str::from_utf8(t).map_err(|_| err("chat template is not UTF-8".into()))?;
        metadata.push((
            "tokenizer.chat_template".into(),
            Value::String(t.to_string()),
        ));
    }
    if let Some(g) = section("graph")? {
        let g = std::str::from_utf8(g).map_err(|_| err("graph section is not UTF-8".into()))?;
        metadata.push((GRAPH_KEY.into(), Value::String(g.to_string())));
    }
    let list = field("tensors")?
        .as_array()
        .ok_or_else(|| err("metadata field 'tensors' is not a list".into()))?;
    if list.len() > MAX_TENSORS {
        return Err(err(format!("{} tensors (limit {MAX_TENSORS})", list.len())));
    }
    let mut tensors = Vec::with_capacity(list.len());
    let mut names = std::collections::HashSet::new();
    for (i, t) in list.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(|v| v.as_str())
            .ok_or_else(|| err(format!("tensors[{i}]: no name")))?;
        let terr = |msg: String| err(format!("tensor '{name}': {msg}"));
        if !names.insert(name) {
            return Err(terr("appears twice".into()));
        }
        let dt_name = t.get("dtype").and_then(|v| v.as_str()).unwrap_or("?");
        let dtype =
            DType::from_name(dt_name).ok_or_else(|| terr(format!("unknown format '{dt_name}'")))?;
        let shape: Vec<u64> = t
            .get("shape")
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64()).collect::<Option<Vec<_>>>())
            .filter(|s| (1..=4).contains(&s.len()) && s.iter().all(|&d| (1..=MAX_DIM).contains(&d)))
            .ok_or_else(|| terr("shape must be 1 to 4 dimensions of 1..2^40".into()))?;
        let (Some(off), Some(size)) = (
            t.get("offset").and_then(|v| v.as_u64()),
            t.get("bytes").and_then(|v| v.as_u64()),
        ) else {
            return Err(terr("needs offset and bytes".into()));
        };
        let want = tensor_bytes(dtype, &shape);
        if want != Some(size) {
            return Err(terr(format!(
                "{size} bytes, but {dtype} {shape:?} takes {}",
                want.map_or("an impossible size".into(), |w| w.to_string())
            )));
        }
        let n = if shape.len() == 3 { shape[2] } else { 1 };
        let per = size / n;
        // Expert ranges: n evenly spaced [offset, per] pairs starting at the tensor's offset,
        // no closer than one matrix (1 apart = back to back).
        let mut stride = per;
        if let Some(ex) = t.get("experts") {
            let ex = ex
                .as_array()
                .ok_or_else(|| terr("experts is not a list".into()))?;
            let pair = |r: &Json| {
                r.as_array()
                    .filter(|p| p.len() == 2)
                    .and_then(|p| Some((p[0].as_u64()?, p[1].as_u64()?)))
            };
            if n > 1 {
                if let Some((o1, _)) = ex.get(1).and_then(pair) {
                    stride = o1.wrapping_sub(off);
                }
            }
            let ok = ex.len() as u64 == n
                && stride >= per
                && ex.iter().enumerate().all(|(x, r)| {
                    pair(r).is_some_and(|(o, b)| {
                        b == per
                            && (x as u64)
                                .checked_mul(stride)
                                .and_then(|d| d.checked_add(off))
                                == Some(o)
                    })
                });
            if !ok {
                return Err(terr(format!(
                    "expert ranges must be {n} evenly spaced [offset, bytes] pairs of {per} bytes from offset {off}, no closer than {per} bytes"
                )));
            }
        }
        let span = (n - 1).checked_mul(stride).and_then(|d| d.checked_add(per));
        match span.and_then(|s| off.checked_add(s)) {
            Some(end) if end <= data.len() as u64 && off % TENSOR_ALIGN == 0 => {}
            _ => {
                return Err(terr(format!(
                    "{size} bytes at {off} do not fit the {}-byte data section (or are not {TENSOR_ALIGN}-aligned)",
                    data.len()
                )))
            }
        }
        tensors.push(TensorInfo {
            name: name.to_string(),
            dtype,
            shape,
            offset: data_off + off,
            size,
            expert_stride: if stride == per { 0 } else { stride },
        });
    }
    Ok((metadata, tensors))
}

#[cfg(test)]
mod tests;
