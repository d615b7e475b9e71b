//! Prepared weights between [`MIN`] and 2 MiB share 2 MiB-aligned slabs with transparent huge
//! pages requested, instead of the heap's 4 KiB pages.
//!
//! Why: a decode step streams every weight once, and a matrix on 4 KiB pages pays a TLB walk
//! every 4 KiB (and the hardware prefetchers stop at each page). Qwen2.5-1.5B's attention
//! matrices (1.4 MB q/o, 0.2-0.3 MB k/v) sat on the heap's 4 KiB pages: its q/o products ran
//! at 23 GB/s beside 27-28 for the large matrices, which have their own huge-page mappings;
//! on 2 MiB pages, 26 GB/s (`MOLLM_PROFILE=2`, 128 steps, 2 interleaved rounds).
//!
//! A slab is carved front to back, first fit over the slabs, and never reused (so every piece
//! is zeroed, as mapped); it is unmapped when its last piece is freed. The waste is the
//! unused tail of each slab, of which at most one partly used 2 MiB page is resident.

use std::sync::Mutex;

/// The smallest piece taken from a slab (smaller ones stay on the heap: a few pages).
pub const MIN: usize = 64 << 10;
/// A huge page.
const HUGE: usize = 2 << 20;
/// Pieces from a huge page up have a mapping of their own ([`map_huge`]).
pub const MAX: usize = HUGE;
/// Bytes of one slab (2 MiB-aligned inside its mapping).
const SLAB: usize = 32 << 20;

struct Slab {
    /// The mapping as `mmap` returned it, and its size.
    base: usize,
    size: usize,
    /// The first free byte (2 MiB-aligned start, then carved upwards) and the mapping's end.
    next: usize,
    end: usize,
    /// Pieces handed out and not yet freed.
    live: usize,
}

/// Every slab with live pieces.
pub struct Slabs(Mutex<Vec<Slab>>);

/// The slabs of every prepared weight of the process.
pub static SLABS: Slabs = Slabs(Mutex::new(Vec::new()));

impl Slabs {
    /// `len` zeroed bytes (`MIN <= len < MAX`), 64-byte aligned, on a slab: the address and the
    /// slab's base (for [`Slabs::free`]). `None` if no mapping could be made.
    pub fn alloc(&self, len: usize) -> Option<(*mut u8, usize)> {
        debug_assert!((MIN..MAX).contains(&len));
        let len = len.next_multiple_of(64);
        let mut slabs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // The first slab with room: a small piece fills the tail that a large one left
        // behind (the 2 MiB page at each slab's carving point is resident, whatever of it is
        // used).
        let i = match slabs.iter().position(|s| s.end - s.next >= len) {
            Some(i) => i,
            None => {
                slabs.push(map()?);
                slabs.len() - 1
            }
        };
        let s = &mut slabs[i];
        let p = s.next;
        s.next += len;
        s.live += 1;
        Some((p as *mut u8, s.base))
    }

    /// Returns a piece of the slab at `base` (from [`Slabs::alloc`]); the slab is unmapped with
    /// its last piece, the one being carved too (its memory is no longer all zero).
    pub fn free(&self, base: usize) {
        let mut slabs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = slabs.iter().position(|s| s.base == base) else {
            return;
        };
        slabs[i].live -= 1;
        if slabs[i].live == 0 {
            let s = slabs.remove(i);
            // SAFETY: the mapping made in `map`, no piece of it handed out any more.
            unsafe { libc::munmap(s.base as *mut libc::c_void, s.size) };
        }
    }
}

fn map() -> Option<Slab> {
    let (base, size, start) = map_huge(SLAB)?;
    Some(Slab {
        base: base as usize,
        size,
        next: start,
        end: start + SLAB,
        live: 0,
    })
}

/// A fresh anonymous mapping holding `len` bytes (rounded up to whole 2 MiB pages) at a 2 MiB
/// boundary, with transparent huge pages requested for the 2 MiB pages the bytes fill: the
/// mapping, its size and the aligned start. Weights are streamed once per token: 2 MiB pages
/// spare the TLB walks. The pages are untouched, so the first writes (the repack) fault in
/// huge ones. The last, partly filled 2 MiB stays in small pages: as a huge page it would
/// cost a whole 2 MiB of memory for every weight (150 MiB over a 0.8B model's matrices).
pub fn map_huge(len: usize) -> Option<(*mut libc::c_void, usize, usize)> {
    let whole = len / HUGE * HUGE;
    let len = len.next_multiple_of(HUGE);
    let size = len + HUGE;
    // SAFETY: a fresh private anonymous mapping (zeroed, untouched).
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let start = (base as usize).next_multiple_of(HUGE);
    // SAFETY: advice on memory this mapping owns.
    unsafe {
        if whole > 0 {
            libc::madvise(start as *mut libc::c_void, whole, libc::MADV_HUGEPAGE);
        }
        if whole < len {
            let tail = (start + whole) as *mut libc::c_void;
            libc::madvise(tail, len - whole, libc::MADV_NOHUGEPAGE);
        }
    }
    Some((base, size, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces are zeroed, 64-byte aligned, apart; a slab goes with its last piece, a new one
    /// is made when a piece fits none, and a small piece fills an earlier slab's tail.
    #[test]
    fn pieces_are_zeroed_apart_and_slabs_go_with_their_last_piece() {
        let slabs = Slabs(Mutex::new(Vec::new()));
        let sizes = [MIN, 300 << 10, MAX - 1, MAX - 1, 1 << 20];
        let mut got = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            for _ in 0..20 {
                let (p, base) = slabs.alloc(n).expect("a slab");
                assert_eq!(p as usize % 64, 0);
                // SAFETY: `n` bytes handed out to this test.
                let b = unsafe { core::slice::from_raw_parts_mut(p, n) };
                assert!(b.iter().all(|&x| x == 0), "piece of {n} bytes not zeroed");
                b.fill(k as u8 + 1);
                got.push((p as usize, n, base, k as u8 + 1));
            }
        }
        // Every piece still holds what was written into it: no two overlap.
        for &(p, n, _, v) in &got {
            // SAFETY: as above, not freed yet.
            let b = unsafe { core::slice::from_raw_parts(p as *const u8, n) };
            assert!(b.iter().all(|&x| x == v));
        }
        let bases: std::collections::BTreeSet<usize> = got.iter().map(|g| g.2).collect();
        assert!(bases.len() >= 2, "{} pieces in one 32 MiB slab", got.len());
        // The first slab's tail (under 2 MiB) takes a small piece.
        let (_, first) = slabs.alloc(MIN).expect("a slab");
        assert_eq!(
            first, got[0].2,
            "a small piece skipped the first slab's tail"
        );
        slabs.free(first);
        for (i, &(_, _, base, _)) in got.iter().enumerate() {
            slabs.free(base);
            let left = slabs.0.lock().unwrap().len();
            let want = got[i + 1..]
                .iter()
                .map(|g| g.2)
                .collect::<std::collections::BTreeSet<_>>();
            assert_eq!(
                left,
                want.len(),
                "slabs left after freeing {} pieces",
                i + 1
            );
        }
    }
}
