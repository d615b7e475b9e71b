//! Byte-level BPE ("gpt2" vocabularies): `tokenizers`' pre-tokenizers, merges by rank here.
//!
//! The pre-tokenizer is a sequence of regex splits (isolated matches, unmatched text kept as its
//! own piece, each regex applied to the pieces of the previous one), then the GPT-2 byte-to-
//! unicode map, exactly the pipeline llama.cpp's `unicode_regex_split` implements. The regexes
//! are copied verbatim from llama-vocab.cpp's `llm_tokenizer_bpe` constructor, keyed by the
//! same `tokenizer.ggml.pre` names. Unknown names are refused rather than guessed: a wrong
//! pre-tokenizer silently changes token ids.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

use super::idmap::Merges;
use super::vocab::Vocab;
use crate::gguf::ModelFile;
use crate::LoadError;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The same splits as Hugging Face's tokenizer.json files write them (case-insensitive group).
const QWEN2_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a `tokenizer.ggml.pre` name selects in llama.cpp.
pub struct PreConfig {
    pub regexes: &'static [&'static str],
    pub ignore_merges: bool,
    pub add_bos: bool,
    pub clean_spaces: bool,
}

pub fn pre_config(pre: &str) -> Option<PreConfig> {
    let cfg = |regexes, ignore_merges, add_bos, clean_spaces| {
        Some(PreConfig {
            regexes,
            ignore_merges,
            add_bos,
            clean_spaces,
        })
    };
    match pre {
        "default" => cfg(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
            false,
            true,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => cfg(&[LLAMA3], true, true, false),
        "dbrx" | "smaug-bpe" => cfg(&[LLAMA3], false, false, true),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => {
            cfg(&[GPT2], false, false, true)
        }
        "trillion" | "granite-docling" => cfg(&[GPT2], false, false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => cfg(&[QWEN2], false, false, false),
        "megrez" | "stablelm2" => cfg(&[QWEN2], false, false, true),
        "hunyuan" => cfg(&[QWEN2], false, false, false),
        "qwen35" => cfg(&[QWEN35], false, false, false),
        "smollm" | "command-r" => cfg(&[r"\p{N}", GPT2], false, false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => {
            cfg(&[r"\p{N}", GPT2], false, false, true)
        }
        "falcon" => cfg(
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            false,
            false,
            true,
        ),
        _ => None,
    }
}

/// A byte-level BPE model: the pre-tokenizer pipeline of `tokenizers` (regex splits, then the
/// byte-to-unicode map) and merges by rank over token ids. The merge loop is the one of
/// `tokenizers`' `Word::merge_all` and llama.cpp's `llm_tokenizer_bpe_session` (lowest rank
/// first, leftmost among equal ranks); it is done here because building `tokenizers`' BPE
/// model (string-keyed maps of 151k merges) took ~150 ms of every load.
pub struct Bpe {
    pre: PreTokenizerWrapper,
    merges: Merges,
    ignore_merges: bool,
}

/// Builds the pipeline (pre-tokenizer + merges) for the vocabulary.
pub fn build(gguf: &ModelFile, vocab: &Vocab, cfg: &PreConfig) -> Result<Bpe, LoadError> {
    let merges_arr = gguf
        .get_str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| vocab.err("gpt2 vocabulary without tokenizer.ggml.merges"))?;
    // llama.cpp splits each merge at the first space after position 0 and keeps the first rank
    // of a duplicated pair. A merge whose parts or result are not in the vocabulary can never
    // produce a token there; it is dropped.
    let mut merges = Merges::with_capacity(merges_arr.len());
    let mut joined = Vec::new();
    for (rank, m) in merges_arr.iter_bytes().enumerate() {
        // Byte search: the first char is usually multi-byte ("Ġ").
        let Some(pos) = m.iter().skip(1).position(|&c| c == b' ').map(|p| p + 1) else {
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        joined.clear();
        joined.extend_from_slice(a);
        joined.extend_from_slice(b);
        if let (Some(a), Some(b), Some(ab)) =
            (vocab.lookup(a), vocab.lookup(b), vocab.lookup(&joined))
        {
            merges.insert(a, b, rank as u32, ab);
        }
    }

    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in cfg.regexes {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| vocab.err(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(Bpe {
        pre: Sequence::new(steps).into(),
        merges,
        ignore_merges: cfg.ignore_merges,
    })
}

/// One symbol of a piece being merged: its token id and its neighbours (`len == 0`: merged
/// into its left neighbour).
#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: i32,
    next: i32,
    len: u32,
}

impl Bpe {
    /// Appends the ids of one raw-text fragment; stops between words once `out` holds more
    /// than `limit` ids.
    pub fn tokenize(
        &self,
        vocab: &Vocab,
        text: &str,
        out: &mut Vec<u32>,
        limit: usize,
    ) -> Result<(), LoadError> {
        if text.is_empty() {
            return Ok(());
        }
        let mut pts = PreTokenizedString::from(text);
        self.pre
            .pre_tokenize(&mut pts)
            .map_err(|e| vocab.err(format!("pre-tokenizing failed: {e}")))?;
        let mut syms = Vec::new();
        let mut heap = BinaryHeap::new();
        for (piece, _, _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            self.piece(vocab, piece, &mut syms, &mut heap, out);
            if out.len() > limit {
                break;
            }
        }
        Ok(())
    }

    fn piece(
        &self,
        vocab: &Vocab,
        piece: &str,
        syms: &mut Vec<Sym>,
        heap: &mut BinaryHeap<Reverse<(u32, i32, u32)>>,
        out: &mut Vec<u32>,
    ) {
        if piece.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = vocab.lookup(piece.as_bytes()) {
                out.push(id);
                return;
            }
        }
        // One symbol per char that is a token (byte-level vocabularies have all 256; a char
        // without one is skipped, as `tokenizers` does without an unknown token).
        syms.clear();
        let mut buf = [0u8; 4];
        for c in piece.chars() {
            if let Some(id) = vocab.lookup(c.encode_utf8(&mut buf).as_bytes()) {
                let i = syms.len() as i32;
                syms.push(Sym {
                    id,
                    prev: i - 1,
                    next: i + 1,
                    len: 1,
                });
            }
        }
        let Some(last) = syms.last_mut() else {
            return;
        };
        last.next = -1;
        // (rank, left position, merged id), smallest first.
        heap.clear();
        for i in 0..syms.len() - 1 {
            if let Some((rank, m)) = self.merges.get(syms[i].id, syms[i + 1].id) {
                heap.push(Reverse((rank, i as i32, m)));
            }
        }
        while let Some(Reverse((rank, pos, merged))) = heap.pop() {
            let p = pos as usize;
            let (l, next) = (syms[p], syms[p].next);
            // Stale entries: the left symbol was merged away, or its pair changed since.
            if l.len == 0 || next < 0 {
                continue;
            }
            let r = syms[next as usize];
            if self.merges.get(l.id, r.id) != Some((rank, merged)) {
                continue;
            }
            syms[p].id = merged;
            syms[p].len += r.len;
            syms[p].next = r.next;
            syms[next as usize].len = 0;
            if r.next >= 0 {
                syms[r.next as usize].prev = pos;
            }
            if l.prev >= 0 {
                if let Some((rk, m)) = self.merges.get(syms[l.prev as usize].id, merged) {
                    heap.push(Reverse((rk, l.prev, m)));
                }
            }
            if r.next >= 0 {
                if let Some((rk, m)) = self.merges.get(merged, syms[r.next as usize].id) {
                    heap.push(Reverse((rk, pos, m)));
                }
            }
        }
        out.extend(syms.iter().filter(|s| s.len > 0).map(|s| s.id));
    }
}

/// The `tokenizer.ggml.pre` name llama.cpp gives a Hugging Face `pre_tokenizer` (from
/// `tokenizer.json`), when it is one of the common ones.
pub fn pre_name(pt: &serde_json::Value) -> Option<&'static str> {
    let steps: Vec<&serde_json::Value> = match pt.get("type")?.as_str()? {
        "Sequence" => pt.get("pretokenizers")?.as_array()?.iter().collect(),
        _ => vec![pt],
    };
    fn kind(v: &serde_json::Value) -> &str {
        v.get("type").and_then(|t| t.as_str()).unwrap_or("")
    }
    let regex = |v: &serde_json::Value| {
        v.get("pattern")
            .and_then(|p| p.get("Regex"))
            .and_then(|r| r.as_str())
            .map(str::to_string)
    };
    match steps.as_slice() {
        [split, bl] if kind(split) == "Split" && kind(bl) == "ByteLevel" => {
            match regex(split).as_deref() {
                Some(QWEN2 | QWEN2_HF) => Some("qwen2"),
                Some(LLAMA3 | LLAMA3_HF) => Some("llama-bpe"),
                _ => None,
            }
        }
        [digits, bl]
            if kind(digits) == "Digits"
                && digits.get("individual_digits").and_then(|b| b.as_bool()) == Some(true)
                && kind(bl) == "ByteLevel" =>
        {
            Some("smollm")
        }
        [bl] if kind(bl) == "ByteLevel"
            && bl.get("use_regex").and_then(|b| b.as_bool()) != Some(false) =>
        {
            Some("gpt-2")
        }
        _ => None,
    }
}

/// The model's own pipeline from its `tokenizer.json` (normalizer, pre-tokenizer, BPE), for
/// raw-text fragments: added tokens and the post-processor are dropped, because special
/// tokens are split out before (as llama.cpp does) and BOS/EOS are added by the caller.
pub fn from_hf_json(json: &str, vocab: &Vocab) -> Result<tokenizers::Tokenizer, LoadError> {
    let mut v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| vocab.err(format!("tokenizer.huggingface.json: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("added_tokens".into(), serde_json::Value::Array(vec![]));
        o.insert("post_processor".into(), serde_json::Value::Null);
    }
    tokenizers::Tokenizer::from_bytes(v.to_string().as_bytes())
        .map_err(|e| vocab.err(format!("tokenizer.huggingface.json: {e}")))
}

/// Appends the ids of one raw-text fragment, through a `tokenizers` pipeline.
pub fn tokenize_hf(
    tk: &tokenizers::Tokenizer,
    vocab: &Vocab,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), LoadError> {
    if text.is_empty() {
        return Ok(());
    }
    let enc = tk
        .encode_fast(text, false)
        .map_err(|e| vocab.err(format!("encoding failed: {e}")))?;
    out.extend_from_slice(enc.get_ids());
    Ok(())
}

/// GPT-2's byte-to-unicode table inverted: maps a vocabulary char back to its byte.
pub fn unicode_to_byte(c: char) -> Option<u8> {
    static TABLE: std::sync::OnceLock<std::collections::HashMap<char, u8>> =
        std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // Printable bytes map to themselves; the other 68 map, in order, to U+0100...
        let direct = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut next = 0x100u32;
        (0u32..256)
            .map(|b| {
                let c = if direct(b) {
                    b
                } else {
                    next += 1;
                    next - 1
                };
                (char::from_u32(c).unwrap_or('\0'), b as u8)
            })
            .collect()
    });
    table.get(&c).copied()
}
