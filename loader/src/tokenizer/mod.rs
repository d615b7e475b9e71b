//! Text ↔ token ids with llama.cpp's semantics, built from a GGUF vocabulary.
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE (merges by rank over token ids), with the
//!   pre-tokenizer llama.cpp picks for `tokenizer.ggml.pre` (`tokenizers`' regex splits,
//!   [`bpe`]), or the model's own `tokenizer.json` pipeline when it has one.
//! - `tokenizer.ggml.model = "llama"`: llama.cpp's SentencePiece bigram algorithm, ported
//!   ([`spm`] explains why it is not a `tokenizers` model); a model that came with a Hugging
//!   Face `tokenizer.json` (Gemma's SentencePiece-style BPE) encodes through that instead.
//!
//! - `tokenizer.ggml.model = "test"`: llama.cpp's test vocabulary (its random-weight
//!   architecture models): each 5-byte chunk of text hashes to an id, an id reads back as its
//!   hex digits. Such models are driven by token ids; the text side exists so that every
//!   command runs on them.
//! - `tokenizer.ggml.model = "rwkv"`: RWKV's "world" vocabulary, greedy longest match over the
//!   bytes of escaped token strings ([`rwkv`]).
//! - `tokenizer.ggml.model = "bert"`: llama.cpp's WordPiece (BERT embedding models): BERT's
//!   normalization and word splitting, then greedy longest match in a phantom-space vocabulary
//!   ([`wpm`]); `add_special` wraps the ids in [CLS] ... [SEP].
//!
//! Special tokens are split out before any algorithm runs, exactly like llama.cpp's
//! `tokenizer_st_partition`, so `<|im_start|>` in a prompt becomes one id when `parse_special`
//! is true and plain text otherwise.

mod bpe;
pub(crate) use bpe::pre_name as bpe_pre_name;
mod idmap;
mod rwkv;
mod spm;
mod stream;
mod vocab;
mod wpm;

#[cfg(test)]
mod tests;

pub use stream::StreamDecoder;
pub use vocab::{
    ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_UNUSED, ATTR_USER_DEFINED,
};

use crate::gguf::ModelFile;
use crate::LoadError;
use vocab::{Vocab, VocabKind};

enum Engine {
    /// llama.cpp's bigram algorithm, or the model's own `tokenizer.json` pipeline when it has
    /// one (which then adds the space prefix itself).
    Spm(Option<Box<tokenizers::Tokenizer>>),
    /// Byte-level BPE from the GGUF's merges ([`bpe::Bpe`]).
    Bpe(Box<bpe::Bpe>),
    /// Byte-level BPE through the model's own `tokenizer.json` pipeline.
    HfBpe(Box<tokenizers::Tokenizer>),
    /// llama.cpp's `LLAMA_VOCAB_TYPE_TEST`: text in chunks of [`TEST_CHUNK`] bytes, each
    /// `hash = hash * 31 + byte` over the chunk, modulo the vocabulary size.
    Test,
    /// llama.cpp's `LLAMA_VOCAB_TYPE_RWKV`: greedy longest match in a trie of the unescaped
    /// token bytes.
    Rwkv(Box<rwkv::Rwkv>),
    /// llama.cpp's `LLAMA_VOCAB_TYPE_WPM`: BERT's WordPiece over the phantom-space vocabulary.
    Wpm(Box<wpm::Wpm>),
}

/// The bytes one token of the test vocabulary covers.
const TEST_CHUNK: usize = 5;

pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    /// Post-process detokenized text (" ," → ","...), per llama.cpp's pre-tokenizer table.
    clean_spaces: bool,
    model: String,
    pre: String,
    /// The longest token text in bytes: no token stands for more input bytes, so a text of
    /// more than `n * max_token_bytes` bytes has more than `n` tokens (not so for WordPiece:
    /// see [`Tokenizer::max_text_bytes`]).
    max_token_bytes: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .finish()
    }
}

enum Frag {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    pub fn from_gguf(gguf: &ModelFile) -> Result<Tokenizer, LoadError> {
        let file = gguf.file_label();
        let err = |msg: String| LoadError::Tokenizer {
            file: file.clone(),
            msg,
        };
        let model = gguf
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| err("missing tokenizer.ggml.model".into()))?
            .to_string();
        let pre = gguf
            .get_str("tokenizer.ggml.pre")?
            .unwrap_or("")
            .to_string();
        match model.as_str() {
            "llama" => {
                let vocab = Vocab::load(gguf, VocabKind::Spm, false)?;
                let hf = match gguf.get_str("tokenizer.huggingface.json")? {
                    Some(json) => Some(Box::new(bpe::from_hf_json(json, &vocab)?)),
                    None => None,
                };
                Ok(Tokenizer {
                    max_token_bytes: vocab.max_text_len(),
                    vocab,
                    engine: Engine::Spm(hf),
                    clean_spaces: false,
                    model,
                    pre,
                })
            }
            "gpt2" => {
                // A Hugging Face tokenizer.json (a model directory, a .mollm package) encodes
                // with its own pipeline; a plain GGUF with the regexes llama.cpp picks for its
                // `pre` name (llama.cpp falls back to "default", with a loud warning, when the
                // name is missing).
                let hf_json = gguf.get_str("tokenizer.huggingface.json")?;
                let key = match (pre.as_str(), hf_json) {
                    ("", None) => "default",
                    (p, Some(_)) if bpe::pre_config(p).is_none() => "hf",
                    (p, _) => p,
                };
                let cfg = match key {
                    "hf" => bpe::PreConfig {
                        regexes: &[],
                        ignore_merges: false,
                        add_bos: false,
                        clean_spaces: false,
                    },
                    _ => bpe::pre_config(key).ok_or_else(|| {
                        err(format!("unsupported pre-tokenizer tokenizer.ggml.pre = '{pre}' (llama.cpp would pick a model-specific regex; refusing to guess)"))
                    })?,
                };
                let vocab = Vocab::load(gguf, VocabKind::Bpe, cfg.add_bos)?;
                let engine = match hf_json {
                    Some(json) => Engine::HfBpe(Box::new(bpe::from_hf_json(json, &vocab)?)),
                    None => Engine::Bpe(Box::new(bpe::build(gguf, &vocab, &cfg)?)),
                };
                Ok(Tokenizer {
                    max_token_bytes: vocab.max_text_len(),
                    vocab,
                    engine,
                    clean_spaces: cfg.clean_spaces,
                    model,
                    pre,
                })
            }
            "test" => {
                let vocab = Vocab::load(gguf, VocabKind::Test, false)?;
                Ok(Tokenizer {
                    // No token covers more input bytes than a chunk, and none reads back as
                    // more than its id's hex digits.
                    max_token_bytes: TEST_CHUNK.max(8),
                    vocab,
                    engine: Engine::Test,
                    clean_spaces: false,
                    model,
                    pre,
                })
            }
            "rwkv" => {
                let vocab = Vocab::load(gguf, VocabKind::Rwkv, false)?;
                let trie = rwkv::Rwkv::build(&vocab.texts).map_err(|(id, why)| {
                    err(format!(
                        "rwkv token {id} ({:?}): {why}",
                        String::from_utf8_lossy(vocab.text(id as u32))
                    ))
                })?;
                Ok(Tokenizer {
                    max_token_bytes: trie.max_token_bytes(),
                    vocab,
                    engine: Engine::Rwkv(Box::new(trie)),
                    clean_spaces: false,
                    model,
                    pre,
                })
            }
            "bert" => {
                let vocab = Vocab::load(gguf, VocabKind::Wpm, false)?;
                // llama.cpp's BertNormalizer switches: lowercase unless the GGUF says not,
                // accents stripped iff lowercased unless the GGUF says.
                let lowercase = gguf
                    .get_bool("tokenizer.ggml.normalizer.lowercase")?
                    .unwrap_or(true);
                let strip_accents = gguf
                    .get_bool("tokenizer.ggml.normalizer.strip_accents")?
                    .unwrap_or(lowercase);
                let max_token_bytes = vocab.max_text_len();
                Ok(Tokenizer {
                    max_token_bytes,
                    engine: Engine::Wpm(Box::new(wpm::Wpm::new(
                        lowercase,
                        strip_accents,
                        max_token_bytes,
                    ))),
                    vocab,
                    // llama.cpp cleans up spaces for WPM: "▁," reads back as " ,", then ",".
                    clean_spaces: true,
                    model,
                    pre,
                })
            }
            other => Err(err(format!(
                "unsupported tokenizer model '{other}' (supported: gpt2, llama, rwkv, bert, test)"
            ))),
        }
    }

    /// Token ids for `text`. `add_special` adds BOS/EOS when the model's flags ask for them;
    /// `parse_special` lets control tokens written in the text (`<|im_start|>`) become their
    /// ids (user-defined tokens are always matched, as in llama.cpp).
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, LoadError> {
        self.encode_limited(text, add_special, parse_special, usize::MAX)
            .map(|ids| ids.unwrap_or_default())
    }

    /// The longest token text in bytes (see [`Tokenizer::max_text_bytes`]).
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// The most bytes a text of at most `tokens` tokens can have: a longer one is refused
    /// before tokenizing. (A text whose normalization drops characters could in principle be
    /// longer; none of the BPE / SentencePiece / RWKV pipelines drops enough to matter.)
    ///
    /// WordPiece has no such bound, so this is `usize::MAX` for it: whitespace, control
    /// characters and (with accent stripping) marks yield no token at all, and a word of any
    /// length with a character no token covers is one [UNK]. (The other way round, each of
    /// its tokens covers at least one input character when the vocabulary's texts are UTF-8
    /// and none is the bare phantom space "▁", as in every vocabulary llama.cpp's converter
    /// writes: an input byte never yields more than one token, plus [CLS] and [SEP].) A
    /// WordPiece text is therefore never refused by its length; [`Tokenizer::encode_limited`]
    /// still stops as soon as the ids pass the limit.
    pub fn max_text_bytes(&self, tokens: usize) -> usize {
        if let Engine::Wpm(_) = self.engine {
            return usize::MAX;
        }
        tokens.saturating_mul(self.max_token_bytes.max(1))
    }

    /// [`Tokenizer::encode`] that gives up, with `None`, as soon as the text is known to have
    /// more than `limit` tokens: at once when it has more than [`Tokenizer::max_text_bytes`]
    /// bytes, otherwise when the ids so far pass `limit` (checked between special-token
    /// fragments and, with the GGUF's BPE merges or WordPiece, between words). Memory and
    /// time stay proportional to what the limit allows, not to the text (WordPiece: memory;
    /// its time is proportional to the text up to the word that passes the limit).
    pub fn encode_limited(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        limit: usize,
    ) -> Result<Option<Vec<u32>>, LoadError> {
        if text.len() > self.max_text_bytes(limit) {
            return Ok(None);
        }
        let v = &self.vocab;
        let frags = self.partition(text, parse_special);
        let mut out = Vec::new();
        // llama.cpp's WPM ignores add_bos / add_eos: add_special means [CLS] (the BOS id)
        // first and [SEP] last.
        let wpm = matches!(self.engine, Engine::Wpm(_));
        if add_special && (v.add_bos || wpm) {
            out.push(
                v.bos
                    .ok_or_else(|| v.err("model asks for BOS but has no BOS token"))?,
            );
        }
        match &self.engine {
            Engine::Spm(None) => {
                let mut prev_special = true; // the first fragment gets the space prefix
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[s..e]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(v, escaped.as_bytes(), &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                    if out.len() > limit {
                        return Ok(None);
                    }
                }
            }
            Engine::Test => {
                let n_vocab = v.texts.len() as u64;
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => {
                            for chunk in text.as_bytes()[s..e].chunks(TEST_CHUNK) {
                                let h = chunk
                                    .iter()
                                    .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(b as u64));
                                out.push((h % n_vocab) as u32);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                    if out.len() > limit {
                        return Ok(None);
                    }
                }
            }
            Engine::Rwkv(trie) => {
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => trie
                            .tokenize(&text.as_bytes()[s..e], v.unk, &mut out, limit)
                            .map_err(|rwkv::EncodeError::NoToken { offset, byte }| {
                                v.err(format!(
                                    "byte 0x{byte:02x} at offset {} of the text starts no token \
                                     and the vocabulary has no unknown token",
                                    s + offset
                                ))
                            })?,
                        Frag::Token(id) => out.push(id),
                    }
                    if out.len() > limit {
                        return Ok(None);
                    }
                }
            }
            Engine::Wpm(wpm) => {
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => wpm.tokenize(v, &text[s..e], &mut out, limit)?,
                        Frag::Token(id) => out.push(id),
                    }
                    if out.len() > limit {
                        return Ok(None);
                    }
                }
            }
            Engine::Bpe(_) | Engine::HfBpe(_) | Engine::Spm(Some(_)) => {
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => self.bpe_text(&text[s..e], &mut out, limit)?,
                        Frag::Token(id) => out.push(id),
                    }
                    if out.len() > limit {
                        return Ok(None);
                    }
                }
            }
        }
        if add_special && wpm {
            out.push(
                v.sep
                    .ok_or_else(|| v.err("a WordPiece model needs a [SEP] token and has none"))?,
            );
        } else if add_special && v.add_eos {
            out.push(
                v.eos
                    .ok_or_else(|| v.err("model asks for EOS but has no EOS token"))?,
            );
        }
        Ok((out.len() <= limit).then_some(out))
    }

    /// Appends the ids of one raw-text fragment through the BPE engine: the GGUF's merges
    /// (stopping once `out` holds more than `limit` ids), or the model's own `tokenizer.json`
    /// pipeline.
    fn bpe_text(&self, text: &str, out: &mut Vec<u32>, limit: usize) -> Result<(), LoadError> {
        let v = &self.vocab;
        match &self.engine {
            Engine::Bpe(bpe) => bpe.tokenize(v, text, out, limit),
            Engine::HfBpe(tk) | Engine::Spm(Some(tk)) => bpe::tokenize_hf(tk, v, text, out),
            Engine::Spm(None) | Engine::Test | Engine::Rwkv(_) | Engine::Wpm(_) => {
                Err(v.err("this vocabulary has no BPE pipeline"))
            }
        }
    }

    /// llama.cpp's tokenizer_st_partition: for each special token, longest first, split every
    /// remaining text fragment at each occurrence.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let v = &self.vocab;
        let mut frags = if text.is_empty() {
            vec![]
        } else {
            vec![Frag::Text(0, text.len())]
        };
        for &id in &v.special_cache {
            if !parse_special && v.attrs[id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            // A token text that is not UTF-8 cannot occur in a &str.
            let Ok(st) = std::str::from_utf8(v.text(id)) else {
                continue;
            };
            if st.is_empty() || !text.contains(st) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Frag::Token(_) => next.push(f),
                    Frag::Text(s, e) => {
                        let mut pos = s;
                        while let Some(m) = text[pos..e].find(st) {
                            if m > 0 {
                                next.push(Frag::Text(pos, pos + m));
                            }
                            next.push(Frag::Token(id));
                            pos += m + st.len();
                        }
                        if pos < e {
                            next.push(Frag::Text(pos, e));
                        }
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes a token stands for (llama.cpp's token_to_piece with lstrip 0). Control and
    /// unknown tokens render as their text only when `render_special`; otherwise empty.
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let Some(&attr) = v.attrs.get(id as usize) else {
            return Vec::new();
        };
        if !render_special && attr & (ATTR_UNKNOWN | ATTR_CONTROL) != 0 {
            return Vec::new();
        }
        if let Engine::Rwkv(trie) = &self.engine {
            // llama.cpp unescapes every rwkv token, whatever its type.
            return trie.piece(id).to_vec();
        }
        let text = v.text(id);
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
            return text.to_vec();
        }
        if let Engine::Test = self.engine {
            // llama.cpp renders every id of the test vocabulary as its hex digits.
            return format!("{id:x}").into_bytes();
        }
        if attr & ATTR_NORMAL != 0 {
            return match self.engine {
                // WordPiece: a word-initial piece "▁x" reads back as " x".
                Engine::Spm(_) | Engine::Wpm(_) => replace_bytes(text, "\u{2581}".as_bytes(), b" "),
                Engine::Bpe(_) | Engine::HfBpe(_) => bpe_decode_text(text),
                Engine::Test | Engine::Rwkv(_) => unreachable!("rendered above"),
            };
        }
        if attr & ATTR_BYTE != 0 {
            // "<0xXX>" in both SPM and BPE vocabularies.
            let hex = text.get(3..5).and_then(|h| std::str::from_utf8(h).ok());
            return hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map(|b| vec![b])
                .unwrap_or_default();
        }
        Vec::new() // undefined / unused: llama.cpp renders nothing
    }

    /// llama.cpp's `detokenize`: concatenated pieces, minus the SPM leading space, optionally
    /// without the added BOS/EOS (`remove_special`), control tokens rendered only with
    /// `unparse_special`, then the model's clean-up of spaces before punctuation.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos && !ids.is_empty() && Some(ids[0]) == v.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && v.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == v.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, unparse_special);
            let strip = if remove_space && piece.first() == Some(&b' ') {
                1
            } else {
                0
            };
            text.extend_from_slice(&piece[strip..]);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// Text for `ids`, control tokens rendered (like llama.cpp's `common_detokenize`), invalid
    /// UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, true)).into_owned()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.vocab.eom
    }
    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }
    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }
    /// BERT's [SEP] (`tokenizer.ggml.seperator_token_id`), which WordPiece encoding with
    /// `add_special` ends with; its [CLS] is [`Tokenizer::bos`].
    pub fn sep(&self) -> Option<u32> {
        self.vocab.sep
    }
    /// BERT's [MASK] (`tokenizer.ggml.mask_token_id`).
    pub fn mask(&self) -> Option<u32> {
        self.vocab.mask
    }
    /// Whether the model adds BOS / EOS when `encode(.., add_special = true, ..)` (the
    /// GGUF's flags; a WordPiece model adds [CLS] and [SEP] whatever they say, as llama.cpp
    /// does).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// End of generation: eos, eot, eom and the tokens llama.cpp recognises by text.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.vocab.eog.iter().copied()
    }
    pub fn vocab_size(&self) -> usize {
        self.vocab.n_tokens()
    }
    /// The vocabulary entry as stored (byte-level or ▁-escaped); "" if not UTF-8 or out of range.
    pub fn token_text(&self, id: u32) -> &str {
        std::str::from_utf8(self.vocab.text(id)).unwrap_or("")
    }
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.lookup(text.as_bytes())
    }
    /// llama_token_attr bits ([`ATTR_CONTROL`], ...).
    pub fn token_attr(&self, id: u32) -> u32 {
        self.vocab.attrs.get(id as usize).copied().unwrap_or(0)
    }
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id) & ATTR_CONTROL != 0
    }
    /// `tokenizer.ggml.model` and `tokenizer.ggml.pre`.
    pub fn model(&self) -> &str {
        &self.model
    }
    pub fn pre(&self) -> &str {
        &self.pre
    }
}

fn replace_bytes(s: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// llama_decode_text: GPT-2 byte-level chars back to bytes; unmappable chars are kept visible.
fn bpe_decode_text(text: &[u8]) -> Vec<u8> {
    let s = String::from_utf8_lossy(text);
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match bpe::unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut u = [0u8; 4];
                for b in c.encode_utf8(&mut u).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(s.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The three passes of llama.cpp's clean_spaces: " ?" " !" " ." " ," lose the space, a lone
/// " ' " loses both spaces, and " 's" " 'm" " 're" " 've" lose the space.
fn clean_up_spaces(t: &mut Vec<u8>) {
    if t.is_empty() {
        return;
    }
    // pass 1
    let mut o = vec![t[0]];
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            o.pop();
        }
        o.push(x);
    }
    // pass 2, in place like llama.cpp: the skipped space is overwritten with NUL, which the
    // next comparison then sees (so " ' ' " only loses the first pair of spaces).
    let mut text = o;
    let total2 = text.len();
    let mut total = 1;
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);
    // pass 3
    let src = text;
    let mut o = vec![src[0]];
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let remove = match x1 {
                b's' | b'm' => true,
                b'r' | b'v' => i + 2 < src.len() && src[i + 2] == b'e',
                _ => false,
            };
            if remove {
                o.pop();
            }
        }
        o.push(x);
    }
    *t = o;
}
