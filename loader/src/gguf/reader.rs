//! Bounds-checked little-endian cursor over the whole file.
//!
//! nom decodes the primitives; this wrapper adds what nom's errors lack: the absolute offset,
//! the file size and a human description of what was being read, so a truncation error reads
//! "tensor info 12 ('blk.0.attn_q.weight') needs 8 bytes at offset 1234 but the file has 1200".
//! Every variable-size read goes through [`Reader::check_len`] first, so no allocation is ever
//! sized from an unchecked count.

use nom::number::complete::{
    le_f32, le_f64, le_i16, le_i32, le_i64, le_i8, le_u16, le_u32, le_u64, le_u8,
};
use nom::IResult;

use crate::LoadError;

pub(crate) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    file: &'a str,
    /// What is being read, for error messages. Updated once per metadata entry / tensor info.
    pub ctx: String,
}

type NomErr<'a> = nom::error::Error<&'a [u8]>;

macro_rules! prim {
    ($name:ident, $ty:ty, $parser:ident) => {
        pub fn $name(&mut self) -> Result<$ty, LoadError> {
            let size = std::mem::size_of::<$ty>();
            self.check_len(1, size as u64)?;
            let r: IResult<&[u8], $ty, NomErr<'_>> = $parser(&self.data[self.pos..]);
            match r {
                Ok((_, v)) => {
                    self.pos += size;
                    Ok(v)
                }
                // Unreachable after check_len, but never panic on input.
                Err(_) => Err(self.truncated(size as u64)),
            }
        }
    };
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8], file: &'a str) -> Self {
        Reader {
            data,
            pos: 0,
            file,
            ctx: String::new(),
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn remaining(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }

    pub fn err(&self, msg: impl Into<String>) -> LoadError {
        LoadError::Format {
            file: self.file.to_string(),
            msg: msg.into(),
        }
    }

    fn truncated(&self, need: u64) -> LoadError {
        self.err(format!(
            "truncated: {} needs {} bytes at offset {} but the file has {}",
            self.ctx,
            need,
            self.pos,
            self.data.len()
        ))
    }

    /// Fails unless `count` items of at least `elem_size` bytes each fit in the rest of the
    /// file. Call before allocating anything sized by `count`.
    pub fn check_len(&self, count: u64, elem_size: u64) -> Result<(), LoadError> {
        match count.checked_mul(elem_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            Some(need) if count == 1 => Err(self.truncated(need)),
            Some(need) => Err(self.err(format!(
                "{}: {} elements of at least {} bytes need {} bytes at offset {} but only {} remain (file has {})",
                self.ctx,
                count,
                elem_size,
                need,
                self.pos,
                self.remaining(),
                self.data.len()
            ))),
            None => Err(self.err(format!(
                "{}: count {} of {}-byte elements overflows (at offset {}, file has {})",
                self.ctx,
                count,
                elem_size,
                self.pos,
                self.data.len()
            ))),
        }
    }

    prim!(u8, u8, le_u8);
    prim!(i8, i8, le_i8);
    prim!(u16, u16, le_u16);
    prim!(i16, i16, le_i16);
    prim!(u32, u32, le_u32);
    prim!(i32, i32, le_i32);
    prim!(u64, u64, le_u64);
    prim!(i64, i64, le_i64);
    prim!(f32, f32, le_f32);
    prim!(f64, f64, le_f64);

    /// `n` raw bytes, bounds-checked.
    pub fn bytes(&mut self, n: u64) -> Result<&'a [u8], LoadError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {} needs {} bytes at offset {} but the file has {}",
                self.ctx,
                n,
                self.pos,
                self.data.len()
            )));
        }
        let n = n as usize;
        let r: IResult<&'a [u8], &'a [u8], NomErr<'a>> =
            nom::bytes::complete::take(n)(&self.data[self.pos..]);
        match r {
            Ok((_, s)) => {
                self.pos += n;
                Ok(s)
            }
            Err(_) => Err(self.truncated(n as u64)),
        }
    }

    /// A GGUF string: u64 length, then that many bytes (not NUL-terminated).
    pub fn string_bytes(&mut self) -> Result<&'a [u8], LoadError> {
        let len = self.u64()?;
        if len > self.remaining() {
            return Err(self.err(format!(
                "{}: string length {} at offset {} exceeds the {} bytes left in the file (size {})",
                self.ctx,
                len,
                self.pos - 8,
                self.remaining(),
                self.data.len()
            )));
        }
        self.bytes(len)
    }

    /// A GGUF string that must be UTF-8 (keys, tensor names).
    pub fn string(&mut self) -> Result<String, LoadError> {
        let start = self.pos;
        let b = self.string_bytes()?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.err(format!(
                "{}: string at offset {} is not UTF-8: {}",
                self.ctx, start, e
            ))),
        }
    }
}
