//! Incremental detokenization for streaming output.
//!
//! A multi-byte character is often split across tokens (byte-fallback `<0xE2><0x96><0x81>`, or
//! byte-level BPE pieces of an emoji), so printing each token's piece as it arrives would emit
//! broken UTF-8. The decoder buffers bytes and releases only complete characters; a sequence
//! that can never become valid is replaced by U+FFFD instead of stalling the stream.

use super::Tokenizer;

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
}

impl<'a> StreamDecoder<'a> {
    /// `render_special`: whether control tokens (e.g. `<|im_end|>`) appear in the text.
    pub fn new(tok: &'a Tokenizer, render_special: bool) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
            render_special,
        }
    }

    /// Feeds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tok.token_to_piece(id, self.render_special);
        self.push_bytes(&piece)
    }

    /// Feeds raw bytes (exposed for tests and for callers with their own pieces).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: from_utf8 just validated this prefix.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or(""));
                    match e.error_len() {
                        // Incomplete character at the end: hold it back for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes: replace them and keep going.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held back, lossily (call at end of generation).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes currently held back.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}
