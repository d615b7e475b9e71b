//! llama.cpp's WordPiece tokenizer (`LLAMA_VOCAB_TYPE_WPM`, `tokenizer.ggml.model = "bert"`:
//! `llm_tokenizer_wpm_session` in src/llama-vocab.cpp), for BERT-style embedding models.
//!
//! The vocabulary is in llama.cpp's "phantom space" form (its converter's `BertModel.set_vocab`):
//! a word-initial piece `x` is stored as `▁x`, a continuation `##x` as `x`, control tokens
//! (`[CLS]`, `[SEP]`...) as they are. Text is
//!
//! 1. normalized character by character, with the two switches of the GGUF
//!    (`tokenizer.ggml.normalizer.lowercase`, default true; `...strip_accents`, default the
//!    lowercase value): with strip_accents a character becomes the *first* character of its
//!    canonical decomposition (llama.cpp's NFD table keeps one code point per code point, so
//!    `é` is `e`, a Hangul syllable its leading jamo) and marks (`\p{M}`) are dropped; NUL,
//!    U+FFFD and control characters (`\p{Cc}`, `\p{Cf}`, `\p{Co}`) are dropped; with lowercase
//!    a character becomes its simple lowercase mapping;
//! 2. split into words at whitespace; punctuation (`\p{P}`), ASCII symbols (`$`, `+`, `<`, `=`,
//!    `>`, `^`, `` ` ``, `|`, `~`) and CJK ideographs are words of their own;
//! 3. each word, `▁` prepended, is cut greedily into the longest vocabulary entries (at most the
//!    longest token's bytes); a word with a position where nothing matches is one unknown token.
//!
//! The character classes are llama.cpp's: general categories of the Unicode version its tables
//! were generated from ([`UNICODE_AGE`]; characters assigned later are letters of no category
//! there, so here too), White_Space (Rust's `char::is_whitespace`, the same set), canonical
//! decompositions (the `unicode-normalization-alignments` crate; a decomposition's first
//! character, once control characters and marks are dropped, is Python's Unicode 14 one for
//! every character assigned by then: checked for all code points, as were the categories and
//! lowercase mappings).
//!
//! Hugging Face's `BertNormalizer` + `WordPiece` give the same ids for most text; where they
//! differ mollm follows llama.cpp: HF keeps spacing marks (`\p{Mc}`, Devanagari vowel signs) and
//! every jamo of a decomposed Hangul syllable, and gives a word of more than 100 characters
//! `[UNK]`; llama.cpp drops the marks, keeps the first jamo and has no word length limit.
//! Accented Latin letters agree (`café` is `cafe` in both: HF's accent stripping removes the
//! combining accent, llama.cpp's table maps `é` to `e`).

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

use super::vocab::Vocab;
use crate::LoadError;

/// The Unicode version of llama.cpp's character tables (src/unicode-data.cpp of llama.cpp
/// 0c1e570, generated from UnicodeData.txt 15.1: it has U+2EBF0, new in 15.1, and not U+1C89,
/// new in 16.0). Categories, lowercase mappings and decompositions apply to characters
/// assigned by then.
pub const UNICODE_AGE: &str = "15.1";

/// The phantom space every word starts with.
const PHANTOM: &str = "\u{2581}";

pub struct Wpm {
    lowercase: bool,
    strip_accents: bool,
    /// The longest token text in bytes (llama.cpp's `max_token_len`): longer pieces are not
    /// looked up.
    max_token_len: usize,
}

/// What one input character becomes.
enum Piece {
    /// Whitespace: ends the word.
    Break,
    /// Dropped (control characters, NUL, U+FFFD, marks when stripping accents).
    Drop,
    /// Part of the current word.
    Char(char),
    /// A word of its own (punctuation, ASCII symbol, CJK ideograph).
    Alone(char),
}

impl Wpm {
    pub fn new(lowercase: bool, strip_accents: bool, max_token_len: usize) -> Wpm {
        Wpm {
            lowercase,
            strip_accents,
            max_token_len,
        }
    }

    /// Appends the ids of `text` to `out`; stops early (the caller sees more than `limit` ids)
    /// once `out` holds more than `limit`. Errors only when a word matches nothing and the
    /// vocabulary has no unknown token.
    pub fn tokenize(
        &self,
        v: &Vocab,
        text: &str,
        out: &mut Vec<u32>,
        limit: usize,
    ) -> Result<(), LoadError> {
        // The current word, phantom space first.
        let mut word = String::from(PHANTOM);
        for c in text.chars() {
            match self.piece(c) {
                Piece::Break => self.flush(v, &mut word, out, limit)?,
                Piece::Drop => {}
                Piece::Char(c) => word.push(c),
                Piece::Alone(c) => {
                    self.flush(v, &mut word, out, limit)?;
                    word.push(c);
                    self.flush(v, &mut word, out, limit)?;
                }
            }
            if out.len() > limit {
                return Ok(());
            }
        }
        self.flush(v, &mut word, out, limit)
    }

    /// llama.cpp's `preprocess`, one character at a time.
    fn piece(&self, c: char) -> Piece {
        let t = tables();
        let c = match self.strip_accents {
            true => nfd_first(c, t),
            false => c,
        };
        if c.is_whitespace() {
            return Piece::Break;
        }
        let cp = c as u32;
        if cp == 0 || cp == 0xFFFD || has(&t.control, cp) {
            return Piece::Drop;
        }
        if self.strip_accents && has(&t.mark, cp) {
            return Piece::Drop;
        }
        let out = match self.lowercase {
            true => lower(c, t),
            false => c,
        };
        if has(&t.punct, cp) || (cp < 0x7F && has(&t.symbol, cp)) || is_cjk(cp) {
            Piece::Alone(out)
        } else {
            Piece::Char(out)
        }
    }

    /// Tokenizes the word in `word` (after its phantom space), if any, and empties it.
    fn flush(
        &self,
        v: &Vocab,
        word: &mut String,
        out: &mut Vec<u32>,
        limit: usize,
    ) -> Result<(), LoadError> {
        if word.len() > PHANTOM.len() {
            self.word(v, word.as_bytes(), out, limit)?;
            word.truncate(PHANTOM.len());
        }
        Ok(())
    }

    /// Greedy longest match over the bytes of `w` (phantom space included); a word with a
    /// position no token starts at is the unknown token alone. Past `limit` ids the rest of
    /// the word is still matched (a failure makes it one [UNK]) but its ids are not kept.
    fn word(&self, v: &Vocab, w: &[u8], out: &mut Vec<u32>, limit: usize) -> Result<(), LoadError> {
        let start = out.len();
        let mut i = 0;
        while i < w.len() {
            let hi = w.len().min(i + self.max_token_len + 1);
            match (i + 1..=hi)
                .rev()
                .find_map(|j| v.lookup(&w[i..j]).map(|id| (id, j)))
            {
                Some((id, j)) => {
                    if out.len() <= limit {
                        out.push(id);
                    }
                    i = j;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            let unk = v.unk.ok_or_else(|| {
                v.err(format!(
                    "no token matches the word {:?} and the vocabulary has no unknown token",
                    String::from_utf8_lossy(&w[PHANTOM.len()..])
                ))
            })?;
            out.push(unk);
        }
        Ok(())
    }
}

/// Sorted, disjoint inclusive code point ranges.
type Ranges = Vec<(u32, u32)>;

/// llama.cpp's character classes, as of [`UNICODE_AGE`].
struct Tables {
    /// Characters assigned by then.
    assigned: Ranges,
    /// `\p{P}`.
    punct: Ranges,
    /// `\p{M}`.
    mark: Ranges,
    /// llama.cpp's CONTROL flag: `\p{Cc}`, `\p{Cf}`, `\p{Co}` (and surrogates, which a `char`
    /// cannot be).
    control: Ranges,
    /// `\p{S}` below U+007F (the only symbols the tokenizer looks at).
    symbol: Ranges,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let aged = |class: &str| ranges(&format!("[{class}&&\\p{{Age={UNICODE_AGE}}}]"));
        Tables {
            assigned: ranges(&format!("\\p{{Age={UNICODE_AGE}}}")),
            punct: aged(r"\p{P}"),
            mark: aged(r"\p{M}"),
            control: aged(r"[\p{Cc}\p{Cf}\p{Co}]"),
            symbol: ranges(r"[\p{S}&&\x00-\x7E]"),
        }
    })
}

/// The ranges of a Unicode class written in regex syntax (a constant of this file: a bad one
/// is a bug the tests catch).
fn ranges(pattern: &str) -> Ranges {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .unwrap_or_else(|e| panic!("{pattern}: {e}"));
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        k => panic!("{pattern}: not a Unicode class ({k:?})"),
    }
}

fn has(r: &[(u32, u32)], cp: u32) -> bool {
    let i = r.partition_point(|&(_, hi)| hi < cp);
    r.get(i).is_some_and(|&(lo, _)| lo <= cp)
}

/// The first character of `c`'s canonical decomposition (llama.cpp's one-to-one NFD table).
fn nfd_first(c: char, t: &Tables) -> char {
    // U+00C0 is the first character with a canonical decomposition.
    if (c as u32) < 0xC0 || !has(&t.assigned, c as u32) {
        return c;
    }
    let mut first = None;
    unicode_normalization_alignments::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// The simple lowercase mapping (UnicodeData.txt's; Rust's full mapping differs only for
/// U+0130, whose full lowercase "i\u{307}" starts with its simple one).
fn lower(c: char, t: &Tables) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    if !has(&t.assigned, c as u32) {
        return c;
    }
    c.to_lowercase().next().unwrap_or(c)
}

/// The CJK ideograph blocks BERT splits out (llama.cpp's `is_chinese_char`, which follows
/// Hugging Face's Rust code, 0x2B920 rather than 0x2B820 included).
fn is_cjk(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (code point, what the normalizer makes of it) for a Wpm with both switches on.
    fn norm(c: char) -> String {
        match Wpm::new(true, true, 1).piece(c) {
            Piece::Break => "break".into(),
            Piece::Drop => "drop".into(),
            Piece::Char(c) => format!("char {c}"),
            Piece::Alone(c) => format!("alone {c}"),
        }
    }

    #[test]
    fn character_classes_follow_llama_cpp() {
        assert_eq!(norm('A'), "char a");
        assert_eq!(norm('é'), "char e"); // NFD's first character
        assert_eq!(norm('É'), "char e");
        assert_eq!(norm('\u{0301}'), "drop"); // combining acute: a mark
        assert_eq!(norm('\u{093F}'), "drop"); // Devanagari vowel sign I: Mc, dropped too
        assert_eq!(norm('한'), "char \u{1112}"); // the leading jamo only
        assert_eq!(norm('İ'), "char i"); // simple lowercase, not "i\u{307}"
        assert_eq!(norm('Ω'), "char ω");
        assert_eq!(norm('\u{2126}'), "char ω"); // OHM SIGN decomposes to Ω
        assert_eq!(norm(' '), "break");
        assert_eq!(norm('\u{3000}'), "break");
        assert_eq!(norm('\u{0085}'), "break"); // NEL: whitespace before control
        assert_eq!(norm('\t'), "break");
        assert_eq!(norm('\u{0}'), "drop");
        assert_eq!(norm('\u{FFFD}'), "drop");
        assert_eq!(norm('\u{7}'), "drop");
        assert_eq!(norm('\u{200D}'), "drop"); // ZWJ: Cf
        assert_eq!(norm('\u{E000}'), "drop"); // private use
        assert_eq!(norm('.'), "alone .");
        assert_eq!(norm('$'), "alone $");
        assert_eq!(norm('`'), "alone `");
        assert_eq!(norm('¿'), "alone ¿"); // punctuation beyond ASCII
        assert_eq!(norm('€'), "char €"); // a symbol, but not ASCII
        assert_eq!(norm('🦙'), "char 🦙");
        assert_eq!(norm('我'), "alone 我");
        assert_eq!(norm('～'), "char ～"); // fullwidth tilde: Sm, not ASCII
        assert_eq!(norm('3'), "char 3");
        // New in Unicode 15.1 (CJK Ext. I) vs 16.0 (Cyrillic TJE: no lowercase yet in 15.1).
        assert_eq!(norm('\u{2EBF0}'), "char \u{2EBF0}");
        assert_eq!(norm('\u{1C89}'), "char \u{1C89}");
        // Without the switches: no decomposition, case kept, marks kept.
        let plain = Wpm::new(false, false, 1);
        assert!(matches!(plain.piece('É'), Piece::Char('É')));
        assert!(matches!(plain.piece('\u{0301}'), Piece::Char('\u{0301}')));
        assert!(matches!(plain.piece('\u{200D}'), Piece::Drop));
    }

    #[test]
    fn tables_are_sorted_and_disjoint() {
        let t = tables();
        for r in [&t.assigned, &t.punct, &t.mark, &t.control, &t.symbol] {
            assert!(!r.is_empty());
            assert!(r.windows(2).all(|w| w[0].1 < w[1].0));
        }
        assert_eq!(
            t.symbol,
            vec![
                (0x24, 0x24),
                (0x2B, 0x2B),
                (0x3C, 0x3E),
                (0x5E, 0x5E),
                (0x60, 0x60),
                (0x7C, 0x7C),
                (0x7E, 0x7E)
            ]
        );
    }
}
