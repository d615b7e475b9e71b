//! llama.cpp's SentencePiece-BPE tokenizer (`llm_tokenizer_spm_session`), ported directly.
//!
//! Why not a `tokenizers` BPE with merges derived from scores: llama.cpp does not run merges
//! by rank. It repeatedly merges the adjacent pair whose *concatenation* is a vocabulary entry
//! with the highest score (ties: leftmost), and re-segments symbols that did not end up as
//! tokens through the recorded merge tree, falling back to `<0xXX>` byte tokens. A rank table
//! built from scores reproduces most but not all of that (ties, pairs whose merged text exists
//! but whose parts were never a "merge" in SentencePiece's model, re-segmentation), and the
//! test vectors must match exactly, so the ~100-line algorithm is ported instead.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    prev: i32,
    next: i32,
    start: usize,
    len: usize,
}

struct Bigram {
    left: i32,
    right: i32,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair (llama.cpp's comparator).
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a [u8],
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    rev_merge: HashMap<&'a [u8], (i32, i32)>,
}

/// Length of the UTF-8 sequence a lead byte announces (llama.cpp's unicode_len_utf8).
fn utf8_len(b: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(b >> 4) as usize]
}

/// Tokenizes already-escaped text (spaces replaced by U+2581) and appends ids to `out`.
pub fn tokenize(vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
    let mut s = Session {
        vocab,
        text,
        symbols: Vec::new(),
        queue: BinaryHeap::new(),
        rev_merge: HashMap::new(),
    };
    let mut offs = 0;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let index = s.symbols.len() as i32;
        s.symbols.push(Symbol {
            prev: index - 1,
            next: if offs + n == text.len() {
                -1
            } else {
                index + 1
            },
            start: offs,
            len: n,
        });
        offs += n;
    }
    for i in 1..s.symbols.len() as i32 {
        s.try_add_bigram(i - 1, i);
    }
    while let Some(b) = s.queue.pop() {
        let (l, r) = (s.symbols[b.left as usize], s.symbols[b.right as usize]);
        // Skip pairs invalidated by an earlier merge.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        s.symbols[b.left as usize].len += r.len;
        s.symbols[b.right as usize].len = 0;
        s.symbols[b.left as usize].next = r.next;
        if r.next >= 0 {
            s.symbols[r.next as usize].prev = b.left;
        }
        let l = s.symbols[b.left as usize];
        s.try_add_bigram(l.prev, b.left);
        s.try_add_bigram(b.left, l.next);
    }
    let mut i = if s.symbols.is_empty() { -1 } else { 0 };
    while i != -1 {
        let sym = s.symbols[i as usize];
        s.resegment(sym, out, 0);
        i = sym.next;
    }
}

impl<'a> Session<'a> {
    fn slice(&self, start: usize, len: usize) -> &'a [u8] {
        &self.text[start..start + len]
    }

    fn try_add_bigram(&mut self, left: i32, right: i32) {
        if left == -1 || right == -1 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let text = self.slice(l.start, l.len + r.len);
        let Some(id) = self.vocab.lookup(text) else {
            return;
        };
        self.queue.push(Bigram {
            left,
            right,
            score: self.vocab.scores[id as usize],
            size: text.len(),
        });
        self.rev_merge.insert(text, (left, right));
    }

    fn resegment(&self, sym: Symbol, out: &mut Vec<u32>, depth: u32) {
        let text = self.slice(sym.start, sym.len);
        if let Some(id) = self.vocab.lookup(text) {
            out.push(id);
            return;
        }
        // `depth` only guards against a malformed vocabulary making the merge tree cyclic.
        match self.rev_merge.get(text) {
            Some(&(l, r)) if depth < 64 => {
                self.resegment(self.symbols[l as usize], out, depth + 1);
                self.resegment(self.symbols[r as usize], out, depth + 1);
            }
            _ => {
                for &b in text {
                    if let Some(id) = byte_to_token(self.vocab, b) {
                        out.push(id);
                    }
                }
            }
        }
    }
}

/// `<0xXX>` byte token, else the single byte as text, else unk (llama.cpp would throw here).
pub fn byte_to_token(vocab: &Vocab, b: u8) -> Option<u32> {
    vocab
        .lookup(format!("<0x{b:02X}>").as_bytes())
        .or_else(|| vocab.lookup(&[b]))
        .or(vocab.unk)
}
