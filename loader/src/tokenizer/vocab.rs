//! The vocabulary as llama.cpp's `llama_vocab::impl::load` sees it: token texts, scores,
//! attributes, special ids and the end-of-generation set, read from GGUF metadata with the same
//! defaults, overrides and text-based auto-detection.

use std::collections::BTreeSet;

use super::idmap::TextIds;

use crate::gguf::{ModelFile, StrArray};
use crate::LoadError;

// llama_token_attr bits (llama.h).
pub const ATTR_UNDEFINED: u32 = 0;
pub const ATTR_UNKNOWN: u32 = 1 << 0;
pub const ATTR_UNUSED: u32 = 1 << 1;
pub const ATTR_NORMAL: u32 = 1 << 2;
pub const ATTR_CONTROL: u32 = 1 << 3;
pub const ATTR_USER_DEFINED: u32 = 1 << 4;
pub const ATTR_BYTE: u32 = 1 << 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece scores, llama.cpp's bigram merge.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with merges.
    Bpe,
    /// `tokenizer.ggml.model = "test"`: llama.cpp's test vocabulary (the random-weight models
    /// of `test-llama-archs`): no special tokens by default.
    Test,
    /// `tokenizer.ggml.model = "rwkv"`: RWKV's world vocabulary (escaped bytes, greedy longest
    /// match): no special tokens, BOS or prefix space by default.
    Rwkv,
    /// `tokenizer.ggml.model = "bert"`: WordPiece in llama.cpp's phantom-space form; BERT's
    /// special ids by default ([CLS] 101 as BOS, [SEP] 102, [UNK] 100, [PAD] 0, [MASK] 103;
    /// no EOS). [CLS] is the BOS id: like llama.cpp, `tokenizer.ggml.cls_token_id` (which older
    /// converters wrote) is not read.
    Wpm,
}

pub struct Vocab {
    pub file: String,
    pub texts: StrArray,
    text_to_id: TextIds,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic): BERT's [SEP], which WordPiece encoding ends
    /// with.
    pub sep: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`: BERT's [MASK].
    pub mask: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Control/user-defined/unknown tokens, longest text first (tokenizer_st_partition order).
    pub special_cache: Vec<u32>,
}

impl Vocab {
    pub fn err(&self, msg: impl Into<String>) -> LoadError {
        LoadError::Tokenizer {
            file: self.file.clone(),
            msg: msg.into(),
        }
    }

    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    /// The longest token text, in bytes.
    pub fn max_text_len(&self) -> usize {
        (0..self.n_tokens())
            .map(|i| self.text(i as u32).len())
            .max()
            .unwrap_or(0)
    }

    pub fn text(&self, id: u32) -> &[u8] {
        self.texts.get_bytes(id as usize).unwrap_or(&[])
    }

    pub fn lookup(&self, text: &[u8]) -> Option<u32> {
        self.text_to_id.get(&self.texts, text)
    }

    /// Reads everything except the algorithm-specific parts (merges, pre-tokenizer).
    /// `bpe_add_bos` is the per-pre-tokenizer default llama.cpp applies before the GGUF flag.
    pub fn load(gguf: &ModelFile, kind: VocabKind, bpe_add_bos: bool) -> Result<Vocab, LoadError> {
        let file = gguf.file_label();
        let tok_err = |msg: String| LoadError::Tokenizer {
            file: file.clone(),
            msg,
        };
        let list = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| tok_err("missing tokenizer.ggml.tokens".into()))?;
        let n = list.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(tok_err(format!("vocabulary has {n} tokens")));
        }
        let scores: Vec<f32> = match gguf.get("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(_) => match gguf.get_f32_array("tokenizer.ggml.scores") {
                Ok(Some(s)) => s.to_vec(),
                _ => gguf
                    .get_i32_array("tokenizer.ggml.scores")?
                    .unwrap_or(&[])
                    .iter()
                    .map(|&x| x as f32)
                    .collect(),
            },
        };
        if scores.len() < n {
            return Err(tok_err(format!("{} scores for {n} tokens", scores.len())));
        }
        let types = gguf.get_i32_array("tokenizer.ggml.token_type")?;
        if let Some(t) = types {
            if t.len() < n {
                return Err(tok_err(format!("{} token types for {n} tokens", t.len())));
            }
        }

        let mut texts = StrArray::default();
        let mut attrs = Vec::with_capacity(n);
        for i in 0..n {
            let word = list.get_bytes(i).unwrap_or(&[]);
            // llama.cpp replaces empty entries so every id has a distinct, non-empty text.
            if word.is_empty() {
                texts.push(format!("[EMPTY_{i}]").as_bytes());
            } else {
                texts.push(word);
            }
            attrs.push(match types.map(|t| t[i]) {
                None => ATTR_NORMAL,
                Some(1) => ATTR_NORMAL,
                Some(2) => ATTR_UNKNOWN,
                Some(3) => ATTR_CONTROL,
                Some(4) => ATTR_USER_DEFINED,
                Some(5) => ATTR_UNUSED,
                Some(6) => ATTR_BYTE,
                Some(_) => ATTR_UNDEFINED,
            });
        }
        let text_to_id = TextIds::build(&texts).map_err(|id| {
            tok_err(format!(
                "vocabulary contains duplicate token texts (token {id}: {:?})",
                String::from_utf8_lossy(texts.get_bytes(id as usize).unwrap_or(&[]))
            ))
        })?;
        let id_of = |s: &str| text_to_id.get(&texts, s.as_bytes());

        let (mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix) = match kind {
            VocabKind::Spm => (Some(1), Some(2), Some(0), true, true),
            VocabKind::Bpe => (Some(11), Some(11), None, bpe_add_bos, false),
            VocabKind::Test | VocabKind::Rwkv => (None, None, None, false, false),
            VocabKind::Wpm => (Some(101), None, Some(100), true, false),
        };
        // (sep, pad, mask) defaults: only BERT's vocabulary has them.
        let (sep, pad, mask) = match kind {
            VocabKind::Wpm => (Some(102), Some(0), Some(103)),
            _ => (None, None, None),
        };
        let mut add_eos = false;
        if let Some(v) = gguf.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let read_id = |key: &str, default: Option<u32>| -> Result<Option<u32>, LoadError> {
            Ok(match gguf.get_u32(key)? {
                Some(id) if (id as usize) < n => Some(id),
                _ => in_range(default), // missing or out of range: keep the default
            })
        };
        bos = read_id("tokenizer.ggml.bos_token_id", bos)?;
        eos = read_id("tokenizer.ggml.eos_token_id", eos)?;
        unk = read_id("tokenizer.ggml.unknown_token_id", unk)?;
        let mut eot = read_id("tokenizer.ggml.eot_token_id", None)?;
        let mut eom = read_id("tokenizer.ggml.eom_token_id", None)?;
        let pad = read_id("tokenizer.ggml.padding_token_id", pad)?;
        let sep = read_id("tokenizer.ggml.seperator_token_id", sep)?;
        let mask = read_id("tokenizer.ggml.mask_token_id", mask)?;
        let mut fim_pad = read_id("tokenizer.ggml.fim_pad_token_id", None)?;
        let mut fim_rep = read_id("tokenizer.ggml.fim_rep_token_id", None)?;
        let mut fim_sep = read_id("tokenizer.ggml.fim_sep_token_id", None)?;
        if let Some(v) = gguf.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = gguf.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }

        // Auto-detection by text, as llama.cpp does (it iterates an unordered_map, so with
        // several candidates its pick is arbitrary; we take the lowest id). Detected tokens
        // are forced to CONTROL.
        let mut force_control = |id: u32, attrs: &mut Vec<u32>| attrs[id as usize] |= ATTR_CONTROL;
        const EOT: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ];
        let detect = |slot: &mut Option<u32>,
                      names: &[&str],
                      attrs: &mut Vec<u32>,
                      fc: &mut dyn FnMut(u32, &mut Vec<u32>)| {
            if slot.is_some() {
                return;
            }
            if let Some(id) = names.iter().filter_map(|s| id_of(s)).min() {
                *slot = Some(id);
                fc(id, attrs);
            }
        };
        detect(&mut eot, EOT, &mut attrs, &mut force_control);
        detect(&mut eom, &["<|eom_id|>"], &mut attrs, &mut force_control);
        detect(
            &mut fim_pad,
            &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
            &mut attrs,
            &mut force_control,
        );
        detect(
            &mut fim_rep,
            &[
                "<|fim_repo|>",
                "<|repo_name|>",
                "<fim-repo>",
                "<REPO>",
                "<reponame>",
            ],
            &mut attrs,
            &mut force_control,
        );
        detect(
            &mut fim_sep,
            &["<|file_sep|>"],
            &mut attrs,
            &mut force_control,
        );

        const EOG: &[&str] = &[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
            "<|flush|>",
            "<|calls|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "</s>",
            "<|eom_id|>",
            "<EOT>",
            "_<EOT>",
            "[EOT]",
            "[EOS]",
            "<|end_of_text|>",
            "<end_of_utterance>",
            "<eos>",
            "<turn|>",
            "<|tool_response>",
            "<｜end▁of▁sentence｜>",
            "[e~[",
        ];
        let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for id in EOG.iter().filter_map(|s| id_of(s)) {
            eog.insert(id);
            attrs[id as usize] |= ATTR_CONTROL;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        let find = |eog: &BTreeSet<u32>, s: &str| {
            eog.iter()
                .copied()
                .find(|&i| texts.get_bytes(i as usize) == Some(s.as_bytes()))
        };
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        if let Some(end) = find(&eog, "<|end|>") {
            let has = |s| find(&eog, s).is_some();
            if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
                eog.remove(&end);
                attrs[end as usize] = ATTR_USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there.
        if let Some(s) = find(&eog, "</s>") {
            if find(&eog, "<|tool_response>").is_some() || find(&eog, "<|plamo:eos|>").is_some() {
                eog.remove(&s);
                attrs[s as usize] = ATTR_NORMAL;
            }
        }

        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .collect();
        // llama.cpp's std::sort is not stable; equal lengths never match at the same place with
        // different texts, so a stable sort by length gives the same partition.
        special_cache.sort_by_key(|&i| {
            std::cmp::Reverse(texts.get_bytes(i as usize).map_or(0, |t| t.len()))
        });

        Ok(Vocab {
            file,
            texts,
            text_to_id,
            scores,
            attrs,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            sep,
            mask,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            special_cache,
        })
    }
}
