//! Byte-level BPE ("gpt2" vocabularies) built with the `tokenizers` crate.
//!
//! The pre-tokenizer is a sequence of regex splits (isolated matches, unmatched text kept as its
//! own piece, each regex applied to the pieces of the previous one), then the GPT-2 byte-to-
//! unicode map, exactly the pipeline llama.cpp's `unicode_regex_split` implements. The regexes
//! are copied verbatim from llama-vocab.cpp's `llm_tokenizer_bpe` constructor, keyed by the
//! same `tokenizer.ggml.pre` names. Unknown names are refused rather than guessed: a wrong
//! pre-tokenizer silently changes token ids.

use tokenizers::models::bpe::{Vocab as HfVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::vocab::Vocab;
use crate::gguf::GgufFile;
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

/// Builds the `tokenizers` pipeline (pre-tokenizer + BPE model) for the vocabulary.
pub fn build(
    gguf: &GgufFile,
    vocab: &Vocab,
    cfg: &PreConfig,
) -> Result<tokenizers::Tokenizer, LoadError> {
    let merges_arr = gguf
        .get_str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| vocab.err("gpt2 vocabulary without tokenizer.ggml.merges"))?;

    let mut hf_vocab = HfVocab::default();
    hf_vocab.reserve(vocab.n_tokens());
    for i in 0..vocab.n_tokens() {
        // Byte-level BPE vocabularies are ASCII-mapped, so entries are always UTF-8.
        if let Ok(s) = std::str::from_utf8(vocab.text(i as u32)) {
            hf_vocab.insert(s.to_string(), i as u32);
        }
    }
    // llama.cpp splits each merge at the first space after position 0 and keeps the first rank
    // of a duplicated pair. `tokenizers` instead refuses merges whose parts or result are not
    // in the vocabulary; such merges can never produce a token in llama.cpp either, so they
    // are dropped here.
    let mut merges = Vec::with_capacity(merges_arr.len());
    // (151k merges for Qwen2.5: a fast hash and one reused buffer for the joined pair keep
    // this to a few ms of a model's load.)
    let mut seen = std::collections::HashSet::with_capacity_and_hasher(
        merges_arr.len(),
        std::hash::BuildHasherDefault::<Fnv>::default(),
    );
    let mut joined = String::new();
    for m in merges_arr.iter_bytes() {
        let Ok(m) = std::str::from_utf8(m) else {
            continue;
        };
        // Byte search: the first char is usually multi-byte ("Ġ"), so str slicing at 1 would fail.
        let Some(pos) = m.bytes().skip(1).position(|c| c == b' ').map(|p| p + 1) else {
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        if hf_vocab.contains_key(a)
            && hf_vocab.contains_key(b)
            && hf_vocab.contains_key(joined.as_str())
            && seen.insert((a, b))
        {
            merges.push((a.to_string(), b.to_string()));
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(hf_vocab, merges)
        .ignore_merges(cfg.ignore_merges)
        .build()
        .map_err(|e| vocab.err(format!("building BPE model: {e}")))?;

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
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tk)
}

/// FNV-1a, for the merge de-duplication set (its keys are short strings it hashes once).
#[derive(Default)]
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
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

/// Appends the ids of one raw-text fragment.
pub fn tokenize(
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
