use super::writer::{sample_file, Writer};
use super::*;

fn parse(bytes: Vec<u8>) -> Result<ModelFile, LoadError> {
    ModelFile::from_bytes("test.gguf", bytes)
}

fn err(bytes: Vec<u8>) -> String {
    match parse(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let s = e.to_string();
            assert!(
                s.starts_with("test.gguf: "),
                "error must name the file: {s}"
            );
            s
        }
    }
}

#[test]
fn parses_every_value_type_v2_and_v3() {
    for version in [2, 3] {
        let f = parse(sample_file(version)).unwrap();
        assert_eq!(f.version, version);
        assert_eq!(f.architecture().unwrap(), "llama");
        assert_eq!(f.get("t.u8"), Some(&Value::U8(7)));
        assert_eq!(f.get("t.i8"), Some(&Value::I8(-7)));
        assert_eq!(f.get("t.u16"), Some(&Value::U16(700)));
        assert_eq!(f.get("t.i16"), Some(&Value::I16(-700)));
        assert_eq!(f.get_u32("t.u32").unwrap(), Some(70000));
        assert_eq!(f.get("t.i32"), Some(&Value::I32(-70000)));
        assert_eq!(f.get_u64("t.u64").unwrap(), Some(1 << 40));
        assert_eq!(f.get("t.i64"), Some(&Value::I64(-(1 << 40))));
        assert_eq!(f.get_f32("t.f32").unwrap(), Some(1.5));
        assert_eq!(f.get("t.f64"), Some(&Value::F64(-2.25)));
        assert_eq!(f.get_bool("t.bool").unwrap(), Some(true));
        let strs = f.get_str_array("t.strs").unwrap().unwrap();
        assert_eq!(
            (
                strs.len(),
                strs.get(0),
                strs.get(1),
                strs.get(2),
                strs.get(3)
            ),
            (3, Some("a"), Some("bc"), Some(""), None)
        );
        assert_eq!(f.get_f32_array("t.f32s").unwrap().unwrap(), &[0.5, -1.0]);
        assert_eq!(f.get_i32_array("t.i32s").unwrap().unwrap(), &[1, -2, 3]);
        match f.get("t.nested") {
            Some(Value::Array(Array::Array(v))) => {
                assert_eq!(v[0], Array::U8(vec![1, 2]));
                assert_eq!(v[1], Array::String(["x"].into_iter().collect()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(f.get("missing"), None);
        assert_eq!(f.get_u32("missing").unwrap(), None);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.data_offset % 32, 0);

        let a = f.tensor("a").unwrap();
        assert_eq!(
            (a.dtype, a.shape.clone(), a.size, a.offset),
            (DType::F32, vec![4, 2], 32, f.data_offset)
        );
        let data = f.tensor_data(a);
        assert_eq!(f32::from_le_bytes(data[12..16].try_into().unwrap()), 3.0);
        let b = f.tensor("b").unwrap();
        assert_eq!(
            (b.dtype, b.size, b.offset),
            (DType::Q4_0, 18, f.data_offset + 32)
        );
        assert!(f.tensor_data(b).iter().all(|&x| x == 0xAB));
        assert!(f.tensor("c").is_none());
    }
}

#[test]
fn wrong_type_names_the_key() {
    let f = parse(sample_file(3)).unwrap();
    let e = f.get_str("t.u32").unwrap_err().to_string();
    assert!(e.contains("t.u32") && e.contains("expected string"), "{e}");
    let e = f.get_u32("t.i32").unwrap_err().to_string();
    assert!(e.contains("t.i32"), "{e}");
    assert!(f.get_f32_array("t.strs").is_err());
    assert!(f.get_bool("general.architecture").is_err());
}

#[test]
fn missing_file_names_the_path() {
    let e = ModelFile::open("/nonexistent/dir/model.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/dir/model.gguf"), "{e}");
}

#[test]
fn open_maps_a_real_file() {
    let dir = std::env::temp_dir().join(format!("mollm-loader-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("sample.gguf");
    std::fs::write(&p, sample_file(3)).unwrap();
    let f = ModelFile::open(&p).unwrap();
    assert_eq!(f.tensors.len(), 2);
    assert_eq!(f.tensor_data(&f.tensors[0]).len(), 32);
    // The mapping is in small pages (`map_readonly`): smaps flags it `nh` (no huge pages).
    // Only where the kernel has transparent huge pages (else the advice is refused) and its
    // smaps lists flags (some sandboxes' do not).
    #[cfg(target_os = "linux")]
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    #[cfg(target_os = "linux")]
    if std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists()
        && smaps.contains("VmFlags:")
    {
        let name = std::fs::canonicalize(&p).unwrap().display().to_string();
        let entry = smaps
            .split_inclusive("VmFlags:")
            .zip(smaps.split("VmFlags:").skip(1))
            .find(|(head, _)| head.contains(&name))
            .map(|(_, flags)| flags.lines().next().unwrap_or(""))
            .expect("the file's mapping in /proc/self/smaps");
        assert!(
            entry.split_whitespace().any(|f| f == "nh"),
            "{name}: {entry}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_magic_and_version() {
    assert!(err(b"GGML\x03\0\0\0".to_vec()).contains("not a GGUF file"));
    assert!(err(vec![]).contains("not a GGUF file"));
    assert!(err(b"GG".to_vec()).contains("not a GGUF file"));
    let mut w = Writer::default();
    w.header(1, 0, 0);
    assert!(err(w.buf.clone()).contains("unsupported GGUF version 1"));
    let mut w = Writer::default();
    w.header(4, 0, 0);
    assert!(err(w.buf.clone()).contains("unsupported GGUF version 4"));
}

#[test]
fn truncated_at_every_byte_is_an_error() {
    let full = sample_file(3);
    for len in 0..full.len() {
        let e = err(full[..len].to_vec());
        assert!(
            e.contains("truncated")
                || e.contains("not a GGUF")
                || e.contains("remain")
                || e.contains("exceeds")
                || e.contains("outside"),
            "len {len}: {e}"
        );
    }
    assert!(parse(full).is_ok());
}

#[test]
fn truncation_message_is_specific() {
    let mut w = Writer::default();
    w.header(3, 0, 1)
        .kv("general.architecture", &Value::String("llama".into()));
    let full = w.buf.clone();
    // header (24) + key length (8) + "general.architecture" (20): cut inside the value type.
    let e = err(full[..54].to_vec());
    assert_eq!(
        e,
        "test.gguf: truncated: metadata entry 0 ('general.architecture') needs 4 bytes at offset 52 but the file has 54"
    );
}

#[test]
fn absurd_counts_fail_fast() {
    // string length 2^60
    let mut w = Writer::default();
    w.header(3, 0, 1).str("k").u32(8).u64(1 << 60);
    let e = err(w.buf.clone());
    assert!(e.contains("string length 1152921504606846976"), "{e}");
    // array count 2^62 of u32 (overflows the byte count) and of u8
    for ty in [4u32, 0, 8, 9] {
        let mut w = Writer::default();
        w.header(3, 0, 1).str("k").u32(9).u32(ty).u64(1 << 62);
        let e = err(w.buf.clone());
        assert!(e.contains("4611686018427387904"), "{e}");
    }
    // n_tensors 2^40, n_kv 2^40
    let mut w = Writer::default();
    w.header(3, 1 << 40, 0);
    assert!(err(w.buf.clone()).contains("1099511627776"));
    let mut w = Writer::default();
    w.header(3, 0, 1 << 40);
    assert!(err(w.buf.clone()).contains("1099511627776"));
    // u64::MAX counts
    let mut w = Writer::default();
    w.header(3, u64::MAX, u64::MAX);
    err(w.buf.clone());
}

#[test]
fn deeply_nested_arrays_are_refused() {
    let mut w = Writer::default();
    w.header(3, 0, 1).str("k").u32(9);
    for _ in 0..100 {
        w.u32(9).u64(1);
    }
    w.u32(0).u64(0);
    assert!(err(w.buf.clone()).contains("nested"));
}

#[test]
fn bad_type_ids() {
    let mut w = Writer::default();
    w.header(3, 0, 1).str("k").u32(13).u32(0);
    assert!(err(w.buf.clone()).contains("unknown value type id 13"));
    let mut w = Writer::default();
    w.header(3, 0, 1).str("k").u32(9).u32(99).u64(0);
    assert!(err(w.buf.clone()).contains("unknown value type id 99"));
    // ggml type 4 (removed q4_2) and 1000
    for id in [4u32, 1000, u32::MAX] {
        let mut w = Writer::default();
        w.header(3, 1, 0)
            .tensor_info("tok_embd", &[32], id, 0)
            .pad_to(32);
        w.buf.extend([0u8; 128]);
        let e = err(w.buf.clone());
        assert!(
            e.contains("tok_embd") && e.contains(&format!("type id {id}")),
            "{e}"
        );
    }
}

fn one_tensor(shape: &[u64], type_id: u32, rel: u64, data: usize) -> Vec<u8> {
    let mut w = Writer::default();
    w.header(3, 1, 0)
        .tensor_info("w", shape, type_id, rel)
        .pad_to(32);
    w.buf.extend(std::iter::repeat(0u8).take(data));
    w.buf
}

#[test]
fn tensor_bounds_alignment_and_overflow() {
    assert!(parse(one_tensor(&[8], 0, 0, 32)).is_ok());
    assert!(err(one_tensor(&[8], 0, 0, 31)).contains("outside the file"));
    assert!(err(one_tensor(&[8], 0, 32, 32)).contains("outside the file"));
    assert!(err(one_tensor(&[8], 0, u64::MAX - 31, 32)).contains("outside the file"));
    assert!(err(one_tensor(&[8], 0, 4, 64)).contains("not a multiple of the alignment"));
    assert!(err(one_tensor(&[1 << 32, 1 << 32], 0, 0, 32)).contains("overflows"));
    assert!(err(one_tensor(&[u64::MAX], 0, 0, 32)).contains("does not fit in i64"));
    assert!(err(one_tensor(&[1 << 61], 0, 0, 32)).contains("outside the file")); // bytes = 2^63
    assert!(err(one_tensor(&[33], 2, 0, 64)).contains("block size"));
    assert!(err(one_tensor(&[1, 1, 1, 1, 1], 0, 0, 32)).contains("5 dimensions"));
    // zero-element tensors are legal and empty
    let f = parse(one_tensor(&[0, 1 << 62, 1 << 62], 0, 0, 0)).unwrap();
    assert_eq!(f.tensors[0].size, 0);
    assert!(f.tensor_data(&f.tensors[0]).is_empty());
}

#[test]
fn alignment_key_is_honoured_and_checked() {
    let mut w = Writer::default();
    w.header(3, 1, 1)
        .kv("general.alignment", &Value::U32(64))
        .tensor_info("w", &[4], 0, 0)
        .pad_to(64);
    w.buf.extend([0u8; 16]);
    let f = parse(w.buf.clone()).unwrap();
    assert_eq!((f.alignment, f.data_offset % 64), (64, 0));
    for bad in [Value::U32(0), Value::U32(48), Value::U64(32)] {
        let mut w = Writer::default();
        w.header(3, 0, 1).kv("general.alignment", &bad);
        assert!(err(w.buf.clone()).contains("general.alignment"));
    }
}

#[test]
fn duplicates_are_refused() {
    let mut w = Writer::default();
    w.header(3, 0, 2)
        .kv("a", &Value::U8(1))
        .kv("a", &Value::U8(2));
    assert!(err(w.buf.clone()).contains("duplicate metadata key 'a'"));
    let mut w = Writer::default();
    w.header(3, 2, 0)
        .tensor_info("w", &[8], 0, 0)
        .tensor_info("w", &[8], 0, 32)
        .pad_to(32);
    w.buf.extend([0u8; 64]);
    assert!(err(w.buf.clone()).contains("duplicate tensor name 'w'"));
}

#[test]
fn control_bytes_from_the_file_are_escaped_in_errors() {
    // A terminal escape in a key name: the message names the key, escaped.
    let mut w = Writer::default();
    w.header(3, 0, 2)
        .kv("\u{1b}]0;pwned\u{7}", &Value::U8(1))
        .kv("\u{1b}]0;pwned\u{7}", &Value::U8(2));
    let e = err(w.buf.clone());
    assert!(!e.chars().any(char::is_control), "{e:?}");
    assert!(e.contains("\\u{1b}]0;pwned\\u{7}"), "{e}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_fifo_is_refused_not_waited_on() {
    let dir = std::env::temp_dir().join(format!("mollm-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("model.gguf");
    let _ = std::fs::remove_file(&p);
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path we own.
    assert_eq!(unsafe { libc_mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = crate::open_model(&p).unwrap_err().to_string();
    assert!(
        e.contains("model.gguf") && e.contains("not a regular file"),
        "{e}"
    );
    // A symlink to a regular file is still followed.
    let real = dir.join("real.gguf");
    std::fs::write(&real, sample_file(3)).unwrap();
    let link = dir.join("link.gguf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(crate::open_model(&link).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(target_os = "linux")]
extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::os::raw::c_char, mode: u32) -> i32;
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn fuzz_mutations_never_panic() {
    let base = sample_file(3);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..2000 {
        let mut b = base.clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 => {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let n = rng.below(b.len() + 1);
                    b.truncate(n);
                }
                2 => {
                    let i = rng.below(b.len() + 1);
                    let x = rng.next() as u8;
                    b.insert(i, x);
                }
                3 => {
                    // overwrite 8 bytes with an extreme value: the usual way counts go absurd
                    if b.len() >= 8 {
                        let i = rng.below(b.len() - 7);
                        let v = [u64::MAX, 1 << 62, 1 << 40, 0, i64::MAX as u64][rng.below(5)];
                        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                    }
                }
                _ => {
                    if !b.is_empty() {
                        let i = rng.below(b.len());
                        b.remove(i);
                    }
                }
            }
        }
        let r = std::panic::catch_unwind(move || {
            if let Ok(f) = ModelFile::from_bytes("fuzz.gguf", b) {
                // Exercise the accessors on whatever parsed.
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len() as u64, t.size);
                }
                let _ = f.architecture();
                true
            } else {
                false
            }
        });
        match r {
            Ok(true) => ok += 1,
            Ok(false) => failed += 1,
            Err(_) => panic!("parser panicked on a mutated file"),
        }
    }
    assert!(failed > 0 && ok + failed == 2000, "ok {ok} failed {failed}");
}
