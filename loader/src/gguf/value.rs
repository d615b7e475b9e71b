//! GGUF metadata values.
//!
//! Arrays are stored typed (`Vec<u32>`, `Vec<f32>`...) rather than as `Vec<Value>`, because the
//! tokenizer arrays hold up to 262144 entries (gemma3) and a boxed enum per entry would cost
//! ~10x the memory. String arrays are one byte buffer plus end offsets: one allocation instead
//! of one per token.

use super::reader::Reader;
use crate::LoadError;

/// GGUF value type ids (gguf.h `enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoded size of one value of this type: fixed size for scalars, the length
    /// prefix for strings, type + count for arrays. Used to bound counts before allocating.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A packed array of byte strings. Entries are usually UTF-8 but are not required to be
/// (llama.cpp treats vocabulary entries as raw bytes), so access is by bytes or checked `&str`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StrArray {
    data: Vec<u8>,
    /// `ends[i]` is the end of entry `i` in `data`; entry `i` starts at `ends[i-1]` (or 0).
    ends: Vec<usize>,
}

impl StrArray {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get_bytes(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.data[start..end])
    }

    /// Entry `i` as text; `None` when out of range or not UTF-8.
    pub fn get(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.get_bytes(i)?).ok()
    }

    pub fn iter_bytes(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(move |i| self.get_bytes(i).unwrap_or(&[]))
    }

    pub fn push(&mut self, s: &[u8]) {
        self.data.extend_from_slice(s);
        self.ends.push(self.data.len());
    }
}

impl<S: AsRef<[u8]>> FromIterator<S> for StrArray {
    fn from_iter<T: IntoIterator<Item = S>>(iter: T) -> Self {
        let mut a = StrArray::default();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(StrArray),
    /// Nested arrays (allowed by the spec; llama.cpp itself never writes them).
    Array(Vec<Array>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

impl Value {
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "u8".into(),
            Value::I8(_) => "i8".into(),
            Value::U16(_) => "u16".into(),
            Value::I16(_) => "i16".into(),
            Value::U32(_) => "u32".into(),
            Value::I32(_) => "i32".into(),
            Value::U64(_) => "u64".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("array of {} {}", a.len(), a.elem_type_name()),
        }
    }

    /// Any integer type that fits in u64 (converters disagree on u32 vs i32 vs u64 for ids).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// Nesting limit for arrays of arrays: deep enough for any real use, shallow enough that a
/// crafted file cannot overflow the stack by recursion.
const MAX_ARRAY_DEPTH: u32 = 8;

fn read_type(r: &mut Reader<'_>) -> Result<ValueType, LoadError> {
    let at = r.pos();
    let id = r.u32()?;
    ValueType::from_id(id).ok_or_else(|| {
        r.err(format!(
            "{}: unknown value type id {} at offset {}",
            r.ctx, id, at
        ))
    })
}

pub(crate) fn read_value(r: &mut Reader<'_>) -> Result<Value, LoadError> {
    let ty = read_type(r)?;
    read_typed(r, ty)
}

fn read_typed(r: &mut Reader<'_>, ty: ValueType) -> Result<Value, LoadError> {
    Ok(match ty {
        ValueType::U8 => Value::U8(r.u8()?),
        ValueType::I8 => Value::I8(r.i8()?),
        ValueType::U16 => Value::U16(r.u16()?),
        ValueType::I16 => Value::I16(r.i16()?),
        ValueType::U32 => Value::U32(r.u32()?),
        ValueType::I32 => Value::I32(r.i32()?),
        ValueType::U64 => Value::U64(r.u64()?),
        ValueType::I64 => Value::I64(r.i64()?),
        ValueType::F32 => Value::F32(r.f32()?),
        ValueType::F64 => Value::F64(r.f64()?),
        ValueType::Bool => Value::Bool(read_bool(r)?),
        ValueType::String => Value::String(String::from_utf8_lossy(r.string_bytes()?).into_owned()),
        ValueType::Array => Value::Array(read_array(r, 0)?),
    })
}

fn read_bool(r: &mut Reader<'_>) -> Result<bool, LoadError> {
    // llama.cpp reads an int8 and treats any nonzero value as true; do the same.
    Ok(r.u8()? != 0)
}

macro_rules! fixed_array {
    ($r:expr, $n:expr, $variant:ident, $read:ident) => {{
        // check_len above proved $n elements fit in the file, so this capacity is bounded.
        let mut v = Vec::with_capacity($n as usize);
        for _ in 0..$n {
            v.push($r.$read()?);
        }
        Array::$variant(v)
    }};
}

fn read_array(r: &mut Reader<'_>, depth: u32) -> Result<Array, LoadError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(r.err(format!(
            "{}: arrays nested deeper than {} at offset {}",
            r.ctx,
            MAX_ARRAY_DEPTH,
            r.pos()
        )));
    }
    let ty = read_type(r)?;
    let n = r.u64()?;
    r.check_len(n, ty.min_size())?;
    Ok(match ty {
        ValueType::U8 => Array::U8(r.bytes(n)?.to_vec()),
        ValueType::I8 => Array::I8(r.bytes(n)?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => fixed_array!(r, n, U16, u16),
        ValueType::I16 => fixed_array!(r, n, I16, i16),
        ValueType::U32 => fixed_array!(r, n, U32, u32),
        ValueType::I32 => fixed_array!(r, n, I32, i32),
        ValueType::U64 => fixed_array!(r, n, U64, u64),
        ValueType::I64 => fixed_array!(r, n, I64, i64),
        ValueType::F32 => fixed_array!(r, n, F32, f32),
        ValueType::F64 => fixed_array!(r, n, F64, f64),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read_bool(r)?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut a = StrArray {
                data: Vec::new(),
                ends: Vec::with_capacity(n as usize),
            };
            for _ in 0..n {
                let s = r.string_bytes()?;
                a.push(s);
            }
            Array::String(a)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read_array(r, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}
