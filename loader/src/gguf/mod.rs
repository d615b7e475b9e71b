//! GGUF v2/v3 files: header, metadata, tensor infos, and the memory-mapped data section.
//!
//! The file is memory-mapped and parsed in place. Everything read from it is untrusted: counts
//! and lengths are checked against the bytes left in the file before anything is allocated,
//! tensor shapes are checked for overflow, and every tensor's byte range must lie inside the
//! file, so [`ModelFile::tensor_data`] can hand out slices without further checks.

mod reader;
mod value;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod writer;

use std::path::{Path, PathBuf};

use abi::DType;
use reader::Reader;
pub use value::{Array, StrArray, Value, ValueType};

use crate::error::file_label;
use crate::{printable, LoadError};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// ggml order: `shape[0]` is the innermost (contiguous) dimension.
    pub shape: Vec<u64>,
    /// Absolute offset of the tensor's first byte in the file.
    pub offset: u64,
    /// Bytes of the tensor's data (its shape in its format).
    pub size: u64,
    /// A stack of experts (`shape[2]` matrices) stored apart: matrix `e` starts at
    /// `offset + e * expert_stride` (a `.mollm` package interleaves each expert's gate, up and
    /// down so that one read fetches the expert). 0: the matrices lie back to back.
    pub expert_stride: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        // Cannot overflow: checked when the file was parsed.
        self.shape.iter().product()
    }

    /// Bytes of one matrix of the third dimension (one expert of a stack).
    pub fn matrix_bytes(&self) -> u64 {
        self.size / self.shape.get(2).copied().unwrap_or(1).max(1)
    }

    /// Bytes between consecutive matrices of the third dimension.
    pub fn matrix_stride(&self) -> u64 {
        if self.expert_stride == 0 {
            self.matrix_bytes()
        } else {
            self.expert_stride
        }
    }

    /// Bytes from the tensor's first byte to its last (with the gaps of a strided stack);
    /// `None` on overflow.
    pub fn span(&self) -> Option<u64> {
        if self.expert_stride == 0 {
            return Some(self.size);
        }
        let n = self.shape.get(2).copied().unwrap_or(1).max(1);
        (n - 1)
            .checked_mul(self.expert_stride)?
            .checked_add(self.matrix_bytes())
    }
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A model as mollm reads it, whatever it came from (a GGUF file, a Hugging Face directory, a
/// `.mollm` package): GGUF-style metadata and the tensors' places in one byte image (the
/// file's memory map, or memory the loader filled).
pub struct ModelFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section (tensor offsets in the file are relative to it).
    pub data_offset: u64,
    storage: Storage,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// A read-only mapping of a model file, in small pages.
///
/// Where the page cache holds the file in 2 MiB folios (the kernel reads ahead in large
/// folios; after llama.cpp mapped the file, half of Qwen2.5-1.5B's was), a read of a small
/// tensor (a norm, a bias) between two big weights mapped its whole folio as one huge page,
/// which the process then kept: the loads drop the big weights' pages once copied or
/// repacked, but not the small tensors', which stay in use. Qwen2.5-1.5B's peak RSS in
/// `bench` went 1.06 -> 1.25 GiB that way; in small pages 1.11.
///
/// # Safety
/// As `memmap2::Mmap::map`: the file must not be truncated or rewritten while it is mapped.
pub(crate) unsafe fn map_readonly(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the caller's.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::NoHugePage); // advice only: loading works without
    Ok(map)
}

impl ModelFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<ModelFile, LoadError> {
        let path = path.as_ref();
        let io = |source| LoadError::Io {
            file: file_label(path),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader we assume the model file
        // is not truncated or rewritten by another process while it is mapped.
        let map = unsafe { map_readonly(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Storage::Mmap(map))
    }

    /// Parses an in-memory image (tests, fuzzing). `path` only labels error messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<ModelFile, LoadError> {
        Self::parse(path.into(), Storage::Owned(bytes))
    }

    /// A model assembled in memory from another format (a Hugging Face directory): GGUF
    /// metadata and tensors whose `offset`s index `data`. Every tensor's size is checked
    /// against its shape and format, and its range against `data`.
    pub fn assembled(
        path: impl Into<PathBuf>,
        metadata: Vec<(String, Value)>,
        tensors: Vec<TensorInfo>,
        data: Vec<u8>,
    ) -> Result<ModelFile, LoadError> {
        Self::from_storage(path.into(), metadata, tensors, Storage::Owned(data))
    }

    /// As [`ModelFile::assembled`] over a memory-mapped file (a `.mollm` package): tensor
    /// offsets are absolute in `map`, and its pages come back from the file.
    pub fn mapped(
        path: PathBuf,
        metadata: Vec<(String, Value)>,
        tensors: Vec<TensorInfo>,
        map: memmap2::Mmap,
    ) -> Result<ModelFile, LoadError> {
        Self::from_storage(path, metadata, tensors, Storage::Mmap(map))
    }

    fn from_storage(
        path: PathBuf,
        metadata: Vec<(String, Value)>,
        tensors: Vec<TensorInfo>,
        storage: Storage,
    ) -> Result<ModelFile, LoadError> {
        let data = storage.bytes();
        for t in &tensors {
            let want = tensor_bytes(t.dtype, &t.shape);
            let end = t.span().and_then(|s| t.offset.checked_add(s));
            if want != Some(t.size) || end.is_none_or(|e| e > data.len() as u64) {
                return Err(LoadError::Format {
                    file: file_label(&path),
                    msg: format!(
                        "tensor '{}' ({} {:?}): {} bytes at {} do not fit its shape or the {} bytes of data",
                        t.name, t.dtype, t.shape, t.size, t.offset, data.len()
                    ),
                });
            }
        }
        Ok(ModelFile {
            path,
            version: 3,
            metadata,
            tensors,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            storage,
        })
    }

    fn parse(path: PathBuf, storage: Storage) -> Result<ModelFile, LoadError> {
        let label = file_label(&path);
        let parsed = parse_image(storage.bytes(), &label)?;
        Ok(ModelFile {
            path,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            storage,
        })
    }

    pub fn file_label(&self) -> String {
        file_label(&self.path)
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn type_err(&self, key: &str, want: &str, got: &Value) -> LoadError {
        LoadError::Metadata {
            file: self.file_label(),
            key: key.to_string(),
            msg: format!("expected {want}, found {}", got.type_name()),
        }
    }

    /// A u32 value; also accepts other integer types whose value fits (converters differ).
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|x| u32::try_from(x).ok()) {
                Some(x) => Ok(Some(x)),
                None => Err(self.type_err(key, "an integer fitting u32", v)),
            },
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.type_err(key, "a non-negative integer", v)),
        }
    }

    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(self.type_err(key, "f32", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_err(key, "bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.type_err(key, "string", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Option<&StrArray>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::String(a))) => Ok(Some(a)),
            Some(v) => Err(self.type_err(key, "array of string", v)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Option<&[f32]>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::F32(a))) => Ok(Some(a)),
            Some(v) => Err(self.type_err(key, "array of f32", v)),
        }
    }

    pub fn get_bool_array(&self, key: &str) -> Result<Option<&[bool]>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::Bool(a))) => Ok(Some(a)),
            Some(v) => Err(self.type_err(key, "array of bool", v)),
        }
    }

    /// One flag per entry: an array of bools, or of integers (nonzero is true), as llama.cpp
    /// reads per-layer flags (its writers store `sliding_window_pattern` either way).
    pub fn get_flag_array(&self, key: &str) -> Result<Option<Vec<bool>>, LoadError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        macro_rules! nonzero {
            ($a:expr) => {
                $a.iter().map(|&x| x != 0).collect()
            };
        }
        Ok(Some(match v {
            Value::Array(Array::Bool(a)) => a.clone(),
            Value::Array(Array::U8(a)) => nonzero!(a),
            Value::Array(Array::I8(a)) => nonzero!(a),
            Value::Array(Array::U16(a)) => nonzero!(a),
            Value::Array(Array::I16(a)) => nonzero!(a),
            Value::Array(Array::U32(a)) => nonzero!(a),
            Value::Array(Array::I32(a)) => nonzero!(a),
            Value::Array(Array::U64(a)) => nonzero!(a),
            Value::Array(Array::I64(a)) => nonzero!(a),
            _ => return Err(self.type_err(key, "array of bool or integers", v)),
        }))
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Option<&[i32]>, LoadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::I32(a))) => Ok(Some(a)),
            Some(v) => Err(self.type_err(key, "array of i32", v)),
        }
    }

    /// `general.architecture`, which every GGUF model must have.
    pub fn architecture(&self) -> Result<&str, LoadError> {
        self.get_str("general.architecture")?
            .ok_or_else(|| LoadError::Metadata {
                file: self.file_label(),
                key: "general.architecture".into(),
                msg: "missing".into(),
            })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's bytes, straight from the map. Ranges were validated at parse time.
    /// Whether tensor data lives in a read-only mapping of the file (pages the process drops
    /// come back from the file), rather than in owned memory.
    pub fn is_file_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mmap(_))
    }

    /// The bytes from the tensor's first to its last: a strided expert stack
    /// ([`TensorInfo::expert_stride`]) includes the other tensors' bytes between its matrices.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.bytes();
        let start = (t.offset as usize).min(bytes.len());
        let span = t.span().unwrap_or(t.size);
        let end = (t.offset.saturating_add(span) as usize).min(bytes.len());
        &bytes[start..end]
    }

    /// The tensor's data alone, its matrices back to back (gathered from a strided stack).
    pub fn tensor_packed(&self, t: &TensorInfo) -> std::borrow::Cow<'_, [u8]> {
        let data = self.tensor_data(t);
        if t.expert_stride == 0 {
            return std::borrow::Cow::Borrowed(data);
        }
        let (per, stride) = (t.matrix_bytes() as usize, t.expert_stride as usize);
        let n = t.shape.get(2).copied().unwrap_or(1) as usize;
        let mut out = Vec::with_capacity(per * n);
        for e in 0..n {
            let at = (e * stride).min(data.len());
            out.extend_from_slice(&data[at..(at + per).min(data.len())]);
        }
        std::borrow::Cow::Owned(out)
    }
}

/// Bytes of a tensor of `dtype` and `shape` (ggml order), `None` on overflow or a row that is
/// not whole blocks.
pub fn tensor_bytes(dtype: DType, shape: &[u64]) -> Option<u64> {
    let info = dtype.info();
    let ne0 = *shape.first()?;
    if ne0 % info.block_len as u64 != 0 {
        return None;
    }
    let row = (ne0 / info.block_len as u64).checked_mul(info.block_bytes as u64)?;
    shape[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
}

struct Parsed {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// Smallest encoded metadata entry: key length (8) + value type (4) + 1-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Smallest encoded tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;

fn parse_image(data: &[u8], file: &str) -> Result<Parsed, LoadError> {
    let mut r = Reader::new(data, file);
    r.ctx = "magic".into();
    let magic = r.bytes(4).map_err(|_| {
        r.err(format!(
            "not a GGUF file: only {} bytes (need at least the 4-byte magic)",
            data.len()
        ))
    })?;
    if magic != GGUF_MAGIC {
        return Err(r.err(format!(
            "not a GGUF file: magic is {:02x?}, expected \"GGUF\"",
            magic
        )));
    }
    r.ctx = "header version".into();
    let version = r.u32()?;
    if version != 2 && version != 3 {
        return Err(r.err(format!(
            "unsupported GGUF version {version} (supported: 2, 3)"
        )));
    }
    r.ctx = "header tensor count".into();
    let n_tensors = r.u64()?;
    r.ctx = "header metadata count".into();
    let n_kv = r.u64()?;

    r.ctx = "metadata entries".into();
    r.check_len(n_kv, MIN_KV_BYTES)?;
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_kv {
        r.ctx = format!("metadata entry {i} key");
        let key = r.string()?;
        r.ctx = format!("metadata entry {i} ('{key}')");
        let value = value::read_value(&mut r)?;
        if !seen.insert(key.clone()) {
            return Err(r.err(format!("duplicate metadata key '{key}' (entry {i})")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(r.err(format!(
                "general.alignment must be a u32 power of two, found {} {:?}",
                v.type_name(),
                v
            )))
        }
    };

    r.ctx = "tensor infos".into();
    r.check_len(n_tensors, MIN_TENSOR_INFO_BYTES)?;
    let mut raw: Vec<(String, DType, Vec<u64>, u64, u64)> = Vec::with_capacity(n_tensors as usize);
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_tensors {
        r.ctx = format!("tensor info {i} name");
        let name = r.string()?;
        r.ctx = format!("tensor info {i} ('{name}')");
        let n_dims = r.u32()?;
        if n_dims as usize > MAX_DIMS {
            return Err(r.err(format!(
                "tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(r.u64()?);
        }
        let type_id = r.u32()?;
        // mollm's own formats (ids from 1000) live in .mollm packages, never in GGUF files.
        let dtype = DType::from_id(type_id)
            .filter(|_| type_id < 1000)
            .ok_or_else(|| {
                r.err(format!(
                    "tensor '{name}' has unknown ggml type id {type_id}"
                ))
            })?;
        let rel_offset = r.u64()?;
        let size = tensor_size(&name, dtype, &shape).map_err(|e| r.err(e.to_string()))?;
        if rel_offset % alignment != 0 {
            return Err(r.err(format!(
                "tensor '{name}' data offset {rel_offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if !seen.insert(name.clone()) {
            return Err(r.err(format!("duplicate tensor name '{name}' (tensor {i})")));
        }
        raw.push((name, dtype, shape, rel_offset, size));
    }

    // The data section starts at the next multiple of the alignment (llama.cpp pads only
    // when there are tensors).
    let end_of_infos = r.pos() as u64;
    let data_offset = if n_tensors > 0 {
        end_of_infos.div_ceil(alignment) * alignment
    } else {
        end_of_infos
    };
    let file_len = r.len() as u64;
    if n_tensors > 0 && data_offset > file_len {
        return Err(r.err(format!(
            "truncated: data section starts at offset {data_offset} but the file has {file_len}"
        )));
    }

    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dtype, shape, rel, size) in raw {
        let offset = data_offset.checked_add(rel);
        let end = offset.and_then(|o| o.checked_add(size));
        match (offset, end) {
            (Some(offset), Some(end)) if end <= file_len => {
                tensors.push(TensorInfo {
                    name,
                    dtype,
                    shape,
                    offset,
                    size,
                    expert_stride: 0,
                })
            }
            _ => {
                return Err(r.err(format!(
                    "tensor '{name}' data ({size} bytes at data offset {rel}, absolute {}) lies outside the file ({file_len} bytes)",
                    offset.map(|o| o.to_string()).unwrap_or_else(|| "overflowing".into())
                )))
            }
        }
    }

    split_gate_up_experts(&mut tensors);
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// llama.cpp's merged expert stacks (`ffn_gate_up_exps` `[K, 2F, E]`: each expert's gate rows,
/// then its up rows) as the separate `ffn_gate_exps` and `ffn_up_exps` stacks `[K, F, E]` the
/// graphs name: views of the same bytes, each expert's rows one stride of both apart. A file
/// that also has the separate stacks keeps what it has.
fn split_gate_up_experts(tensors: &mut Vec<TensorInfo>) {
    const MERGED: &str = "ffn_gate_up_exps.weight";
    let mut i = 0;
    while i < tensors.len() {
        let t = &tensors[i];
        let Some(stem) = t.name.strip_suffix(MERGED) else {
            i += 1;
            continue;
        };
        let (gate, up) = (
            format!("{stem}ffn_gate_exps.weight"),
            format!("{stem}ffn_up_exps.weight"),
        );
        let splits = t.shape.len() == 3
            && t.shape[1] % 2 == 0
            && t.expert_stride == 0
            && !tensors.iter().any(|o| o.name == gate || o.name == up);
        if !splits {
            i += 1;
            continue;
        }
        let t = tensors.remove(i);
        let (n_expert, rows) = (t.shape[2].max(1), t.shape[1]);
        let matrix = t.size / n_expert;
        let half = matrix / 2;
        for (k, name) in [gate, up].into_iter().enumerate() {
            tensors.insert(
                i + k,
                TensorInfo {
                    name,
                    dtype: t.dtype,
                    shape: vec![t.shape[0], rows / 2, t.shape[2]],
                    offset: t.offset + k as u64 * half,
                    size: half * n_expert,
                    expert_stride: matrix,
                },
            );
        }
        i += 2;
    }
}

/// Why a tensor's declared shape has no byte size.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("tensor '{}' dimension {dim} does not fit in i64 (shape {shape:?})", printable(.name))]
    DimTooLarge {
        name: String,
        dim: u64,
        shape: Vec<u64>,
    },
    #[error("tensor '{}' element count overflows (shape {shape:?})", printable(.name))]
    ElementsOverflow { name: String, shape: Vec<u64> },
    #[error("tensor '{}' of type {dtype} has {ne0} elements per row, not a multiple of the block size {}", printable(.name), .dtype.info().block_len)]
    PartialBlock {
        name: String,
        dtype: DType,
        ne0: u64,
    },
    #[error("tensor '{}' byte size overflows (shape {shape:?})", printable(.name))]
    BytesOverflow { name: String, shape: Vec<u64> },
}

/// Byte size of a tensor, with the checks ggml applies: non-negative dims (as i64), element
/// count representable in i64, first dim a whole number of blocks, byte size in u64.
fn tensor_size(name: &str, dtype: DType, shape: &[u64]) -> Result<u64, ShapeError> {
    let mut n: u64 = 1;
    for &d in shape {
        if d > i64::MAX as u64 {
            return Err(ShapeError::DimTooLarge {
                name: name.into(),
                dim: d,
                shape: shape.to_vec(),
            });
        }
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| ShapeError::ElementsOverflow {
                name: name.into(),
                shape: shape.to_vec(),
            })?;
    }
    let ne0 = shape.first().copied().unwrap_or(1);
    let row = dtype
        .row_bytes(ne0)
        .ok_or_else(|| ShapeError::PartialBlock {
            name: name.into(),
            dtype,
            ne0,
        })?;
    if n == 0 {
        return Ok(0);
    }
    let rows: u64 = shape.iter().skip(1).product(); // n != 0, so bounded by n: no overflow
    row.checked_mul(rows)
        .ok_or_else(|| ShapeError::BytesOverflow {
            name: name.into(),
            shape: shape.to_vec(),
        })
}
