//! Lookup tables built once per model load: token text -> id, and a BPE merge's pair of ids ->
//! (rank, merged id). Both are open-addressed arrays of ids with linear probing, so a 151k-token
//! vocabulary costs two flat allocations instead of one boxed key per entry (the `HashMap` of
//! boxed texts and `tokenizers`' string-keyed maps took ~200 ms of Qwen2.5's start).

use crate::gguf::StrArray;

/// A 64-bit multiplicative hash of bytes, 8 at a time (keys are short token texts).
fn hash_bytes(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = b.len() as u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^ (h >> 29)
}

fn hash_pair(a: u32, b: u32) -> u64 {
    let h = ((a as u64) << 32 | b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 31)
}

/// Power-of-two table size for `n` entries at most half full.
fn table_len(n: usize) -> usize {
    (n.max(1) * 2).next_power_of_two()
}

const EMPTY: u32 = u32::MAX;

/// Token text -> id, over the texts of a [`StrArray`] (the table holds only ids).
#[derive(Default)]
pub struct TextIds {
    slots: Vec<u32>,
}

impl TextIds {
    /// Indexes `texts`; on a duplicated text, returns the id of its second occurrence.
    pub fn build(texts: &StrArray) -> Result<TextIds, u32> {
        let mut ids = TextIds {
            slots: vec![EMPTY; table_len(texts.len())],
        };
        for (id, t) in texts.iter_bytes().enumerate() {
            match ids.slot(texts, t) {
                Ok(_) => return Err(id as u32),
                Err(i) => ids.slots[i] = id as u32,
            }
        }
        Ok(ids)
    }

    pub fn get(&self, texts: &StrArray, t: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        self.slot(texts, t).ok()
    }

    /// `t`'s id, or the free slot where it would go (the table is never full).
    fn slot(&self, texts: &StrArray, t: &[u8]) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let mut i = hash_bytes(t) as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => return Err(i),
                o if texts.get_bytes(o as usize) == Some(t) => return Ok(o),
                _ => i = (i + 1) & mask,
            }
        }
    }
}

/// A BPE merge table: (left id, right id) -> (rank, merged id). The first rank of a pair
/// listed twice is kept (llama.cpp's `bpe_ranks` emplace).
pub struct Merges {
    /// (left, right, rank, merged) per entry; `rank == EMPTY` marks a free slot.
    slots: Vec<[u32; 4]>,
    len: usize,
}

impl Merges {
    pub fn with_capacity(n: usize) -> Merges {
        Merges {
            slots: vec![[0, 0, EMPTY, 0]; table_len(n)],
            len: 0,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds a pair unless it is present already (then the earlier rank stays).
    pub fn insert(&mut self, a: u32, b: u32, rank: u32, merged: u32) {
        if rank == EMPTY {
            return; // (a rank of u32::MAX marks free slots; no vocabulary has that many merges)
        }
        if 2 * (self.len + 1) > self.slots.len() {
            let old = std::mem::replace(
                &mut self.slots,
                vec![[0, 0, EMPTY, 0]; table_len(self.len + 1) * 2],
            );
            self.len = 0;
            for [a, b, r, m] in old.into_iter().filter(|s| s[2] != EMPTY) {
                self.insert(a, b, r, m);
            }
        }
        let i = self.slot(a, b);
        if self.slots[i][2] == EMPTY {
            self.slots[i] = [a, b, rank, merged];
            self.len += 1;
        }
    }

    pub fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        let s = self.slots[self.slot(a, b)];
        (s[2] != EMPTY).then_some((s[2], s[3]))
    }

    /// The slot holding the pair, or the free slot where it would go (the table is never
    /// full: it grows at half).
    fn slot(&self, a: u32, b: u32) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = hash_pair(a, b) as usize & mask;
        loop {
            let s = &self.slots[i];
            if s[2] == EMPTY || (s[0] == a && s[1] == b) {
                return i;
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_pairs_round_trip() {
        let mut texts = StrArray::default();
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        for w in &words {
            texts.push(w.as_bytes());
        }
        let ids = TextIds::build(&texts).unwrap();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(ids.get(&texts, w.as_bytes()), Some(i as u32));
        }
        assert_eq!(ids.get(&texts, b"nope"), None);
        assert_eq!(ids.get(&texts, b""), None);
        texts.push(b"w17");
        assert_eq!(TextIds::build(&texts).err(), Some(5000));

        let mut m = Merges::with_capacity(10); // grows
        for i in 0..3000u32 {
            if i == 1000 {
                assert_eq!(m.len(), 1000);
            }
            m.insert(i, i * 7 % 3001, i, i + 1);
        }
        m.insert(5, 35, 9999, 0); // a repeated pair keeps its first rank
        assert_eq!(m.len(), 3000);
        assert_eq!(m.get(5, 35), Some((5, 6)));
        assert_eq!(m.get(2999, 2999 * 7 % 3001), Some((2999, 3000)));
        assert_eq!(m.get(35, 5), None);
    }
}
