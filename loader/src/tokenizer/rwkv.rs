//! llama.cpp's RWKV "world" tokenizer (`llm_tokenizer_rwkv`, `tokenizer.ggml.model = "rwkv"`).
//!
//! The GGUF stores each token as Python's `repr(bytes)[2:-1]` of its bytes (`\n`, `\x00`,
//! `\\`, `\'`), so the token list stays valid UTF-8; llama.cpp unescapes every entry
//! (`llama_unescape_rwkv_token`) into a byte trie over *all* ids (control `<s>` and the unused
//! `[PAD<i>]` padding included). Encoding is greedy: at each position the longest token that
//! the following bytes start with; a byte that starts no token becomes the unknown token.
//! Decoding is the unescaped bytes, whatever the token's type.
//!
//! Where llama.cpp has no sensible answer, mollm differs on purpose:
//! - an escape llama.cpp would misread (`\x` without two lowercase hex digits, which it turns
//!   into arbitrary bytes, or a `\` / `\x` cut off at the end, which it drops) is refused at
//!   load time, naming the token;
//! - a byte that starts no token, with no unknown token in the vocabulary (the converter sets
//!   none), is an encode error (llama.cpp emits id -1);
//! - a position where the bytes start some token's path but no token is a prefix of them (a
//!   vocabulary with "ab" but not "a") is treated like a byte that starts no token (llama.cpp
//!   emits id 0 and jumps back to the start of the text, looping forever).
//!
//! Neither happens with the world vocabulary, which has every single byte as a token.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::gguf::StrArray;

/// An escape in a token's text that llama.cpp would misread (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEscape {
    #[error("ends with a lone '\\'")]
    LoneBackslash,
    #[error("bad escape '\\x{digits}' at byte {at} (two lowercase hex digits expected)")]
    NotHex { digits: String, at: usize },
    #[error("escape '\\x' cut off at byte {at}")]
    CutOff { at: usize },
}

/// `llama_unescape_rwkv_token`, refusing the escapes it would misread (see the module doc).
pub fn unescape(escaped: &[u8]) -> Result<Vec<u8>, BadEscape> {
    let mut out = Vec::with_capacity(escaped.len());
    let mut i = 0;
    while i < escaped.len() {
        let c = escaped[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = escaped.get(i) else {
            return Err(BadEscape::LoneBackslash);
        };
        i += 1;
        match e {
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let hex = |b: u8| match b {
                    b'0'..=b'9' => Some(b - b'0'),
                    b'a'..=b'f' => Some(b - b'a' + 10),
                    _ => None,
                };
                match escaped.get(i..i + 2) {
                    Some(&[h, l]) => match (hex(h), hex(l)) {
                        (Some(h), Some(l)) => out.push(h << 4 | l),
                        _ => {
                            return Err(BadEscape::NotHex {
                                digits: String::from_utf8_lossy(&[h, l]).into_owned(),
                                at: i - 2,
                            })
                        }
                    },
                    _ => return Err(BadEscape::CutOff { at: i - 2 }),
                }
                i += 2;
            }
            // llama.cpp keeps any other escaped byte as itself (`\\`, `\'`).
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Multiplicative hash for the trie's (node, byte) edge keys.
#[derive(Default)]
struct EdgeHasher(u64);

impl Hasher for EdgeHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

const NONE: u32 = u32::MAX;

/// llama.cpp's `naive_trie` of unescaped token bytes, flattened: node 0 is the root, a node's
/// value is the token ending there (the highest id when several unescape to the same bytes, as
/// llama.cpp's inserts overwrite), edges are keyed by (node, byte).
pub struct Rwkv {
    values: Vec<u32>,
    edges: HashMap<u64, u32, BuildHasherDefault<EdgeHasher>>,
    /// Every token's unescaped bytes, by id (what it decodes to).
    pieces: StrArray,
    max_piece: usize,
}

/// Why a text could not be encoded.
pub enum EncodeError {
    /// No token covers the byte at this offset and the vocabulary has no unknown token.
    NoToken { offset: usize, byte: u8 },
}

impl Rwkv {
    /// Unescapes every entry of `texts` into the trie; `Err((id, why))` for a bad escape.
    pub fn build(texts: &StrArray) -> Result<Rwkv, (usize, BadEscape)> {
        let mut t = Rwkv {
            values: vec![NONE],
            edges: HashMap::default(),
            pieces: StrArray::default(),
            max_piece: 0,
        };
        for (id, text) in texts.iter_bytes().enumerate() {
            let bytes = unescape(text).map_err(|e| (id, e))?;
            let mut node = 0u32;
            for &b in &bytes {
                let next = t.values.len() as u32;
                node = *t.edges.entry(key(node, b)).or_insert_with(|| {
                    t.values.push(NONE);
                    next
                });
            }
            // llama.cpp also stores an empty key at the root, which its search never reads.
            if !bytes.is_empty() {
                t.values[node as usize] = id as u32;
            }
            t.max_piece = t.max_piece.max(bytes.len());
            t.pieces.push(&bytes);
        }
        Ok(t)
    }

    /// The most input bytes one token covers (at least 1: an unknown byte is one token).
    pub fn max_token_bytes(&self) -> usize {
        self.max_piece.max(1)
    }

    /// The bytes token `id` decodes to.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get_bytes(id as usize).unwrap_or(&[])
    }

    fn child(&self, node: u32, b: u8) -> Option<u32> {
        self.edges.get(&key(node, b)).copied()
    }

    /// Appends the ids of `text` (greedy longest match), stopping once `out` holds more than
    /// `limit` ids.
    pub fn tokenize(
        &self,
        text: &[u8],
        unk: Option<u32>,
        out: &mut Vec<u32>,
        limit: usize,
    ) -> Result<(), EncodeError> {
        let mut pos = 0;
        while pos < text.len() && out.len() <= limit {
            let mut best = None;
            let mut node = 0;
            for (i, &b) in text[pos..].iter().enumerate() {
                let Some(next) = self.child(node, b) else {
                    break;
                };
                node = next;
                if self.values[node as usize] != NONE {
                    best = Some((self.values[node as usize], pos + i + 1));
                }
            }
            match best {
                Some((id, end)) => {
                    out.push(id);
                    pos = end;
                }
                None => {
                    out.push(unk.ok_or(EncodeError::NoToken {
                        offset: pos,
                        byte: text[pos],
                    })?);
                    pos += 1;
                }
            }
        }
        Ok(())
    }
}

fn key(node: u32, b: u8) -> u64 {
    (node as u64) << 8 | b as u64
}
