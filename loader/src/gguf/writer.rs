//! A minimal GGUF writer for tests: builds synthetic files byte by byte, including invalid ones
//! (the raw helpers let a test write any count or type id it likes).

use super::{Array, Value};

#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
        self
    }
    pub fn header(&mut self, version: u32, n_tensors: u64, n_kv: u64) -> &mut Self {
        self.buf.extend_from_slice(b"GGUF");
        self.u32(version).u64(n_tensors).u64(n_kv)
    }
    pub fn kv(&mut self, key: &str, v: &Value) -> &mut Self {
        self.str(key);
        self.value(v)
    }
    pub fn value(&mut self, v: &Value) -> &mut Self {
        match v {
            Value::U8(x) => self.u32(0).u8(*x),
            Value::I8(x) => self.u32(1).u8(*x as u8),
            Value::U16(x) => {
                self.u32(2);
                self.buf.extend_from_slice(&x.to_le_bytes());
                self
            }
            Value::I16(x) => {
                self.u32(3);
                self.buf.extend_from_slice(&x.to_le_bytes());
                self
            }
            Value::U32(x) => self.u32(4).u32(*x),
            Value::I32(x) => self.u32(5).u32(*x as u32),
            Value::F32(x) => self.u32(6).u32(x.to_bits()),
            Value::Bool(x) => self.u32(7).u8(*x as u8),
            Value::String(s) => self.u32(8).str(s),
            Value::U64(x) => self.u32(10).u64(*x),
            Value::I64(x) => self.u32(11).u64(*x as u64),
            Value::F64(x) => self.u32(12).u64(x.to_bits()),
            Value::Array(a) => self.u32(9).array(a),
        }
    }
    /// Array body: element type, count, elements.
    pub fn array(&mut self, a: &Array) -> &mut Self {
        let n = a.len() as u64;
        match a {
            Array::U8(v) => {
                self.u32(0).u64(n);
                self.buf.extend_from_slice(v);
            }
            Array::I8(v) => {
                self.u32(1).u64(n);
                v.iter().for_each(|x| self.buf.push(*x as u8));
            }
            Array::U16(v) => {
                self.u32(2).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::I16(v) => {
                self.u32(3).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::U32(v) => {
                self.u32(4).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::I32(v) => {
                self.u32(5).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::F32(v) => {
                self.u32(6).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::Bool(v) => {
                self.u32(7).u64(n);
                v.iter().for_each(|x| self.buf.push(*x as u8));
            }
            Array::String(v) => {
                self.u32(8).u64(n);
                for s in v.iter_bytes() {
                    self.u64(s.len() as u64);
                    self.buf.extend_from_slice(s);
                }
            }
            Array::Array(v) => {
                self.u32(9).u64(n);
                for inner in v {
                    self.array(inner);
                }
            }
            Array::U64(v) => {
                self.u32(10).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::I64(v) => {
                self.u32(11).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
            Array::F64(v) => {
                self.u32(12).u64(n);
                v.iter()
                    .for_each(|x| self.buf.extend_from_slice(&x.to_le_bytes()));
            }
        }
        self
    }
    pub fn tensor_info(
        &mut self,
        name: &str,
        shape: &[u64],
        type_id: u32,
        rel_offset: u64,
    ) -> &mut Self {
        self.str(name).u32(shape.len() as u32);
        shape.iter().for_each(|d| {
            self.u64(*d);
        });
        self.u32(type_id).u64(rel_offset)
    }
    pub fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while self.buf.len() % alignment != 0 {
            self.buf.push(0);
        }
        self
    }
}

/// A complete valid file: every scalar type, string/float/int/nested arrays, two f32/q4_0
/// tensors with data. `version` is 2 or 3.
pub fn sample_file(version: u32) -> Vec<u8> {
    let kvs: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.alignment", Value::U32(32)),
        ("t.u8", Value::U8(7)),
        ("t.i8", Value::I8(-7)),
        ("t.u16", Value::U16(700)),
        ("t.i16", Value::I16(-700)),
        ("t.u32", Value::U32(70000)),
        ("t.i32", Value::I32(-70000)),
        ("t.u64", Value::U64(1 << 40)),
        ("t.i64", Value::I64(-(1 << 40))),
        ("t.f32", Value::F32(1.5)),
        ("t.f64", Value::F64(-2.25)),
        ("t.bool", Value::Bool(true)),
        (
            "t.strs",
            Value::Array(Array::String(["a", "bc", ""].into_iter().collect())),
        ),
        ("t.f32s", Value::Array(Array::F32(vec![0.5, -1.0]))),
        ("t.i32s", Value::Array(Array::I32(vec![1, -2, 3]))),
        (
            "t.nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::String(["x"].into_iter().collect()),
            ])),
        ),
    ];
    let mut w = Writer::default();
    w.header(version, 2, kvs.len() as u64);
    for (k, v) in &kvs {
        w.kv(k, v);
    }
    // f32 [4, 2] = 32 bytes at 0; q4_0 [32] = 18 bytes at 32.
    w.tensor_info("a", &[4, 2], 0, 0);
    w.tensor_info("b", &[32], 2, 32);
    w.pad_to(32);
    for i in 0..8u32 {
        w.u32((i as f32).to_bits());
    }
    w.buf.extend(std::iter::repeat(0xAB).take(18));
    w.buf
}
