//! Weights a backend prepared (repacked into its own layout), by address: each model weight
//! once, on first use; and the expert cache's slots in place, once a tenant has stayed long
//! enough (MOLLM_SLOT_REPACK, MOLLM_SLOT_REPACK_AFTER), forgotten when the slot changes
//! tenant.

use super::Exec;
use crate::backend::Backend;
use crate::error::Result;
use crate::tensor::Weight;
use abi::{Op, TensorDesc};

/// Address ranges whose bytes changed (expert-cache slots that got another expert): what was
/// prepared from them is stale. The cache pushes, the executor drains before its next product.
pub type Retired = std::sync::Arc<std::sync::Mutex<Vec<std::ops::Range<usize>>>>;

/// A prepared weight: the backend's index and the descriptor of its copy.
pub(super) type Prep = Option<(usize, TensorDesc)>;

/// Calls a cache slot's matrix makes on the file's layout before it is repacked in place: a
/// repack on the engine thread costs about seven one-token GEMVs (SmolLM2-MoE: 0.47 ms a
/// 0.66 MB matrix), so only an expert that stays in its slot long enough earns it back.
const SLOT_REPACK_AFTER: u32 = 8;

/// The prepared-weight state, read from the settings once.
pub(super) struct Prepared {
    /// Model weights, by data address (`None`: no backend prepares it).
    weights: std::cell::RefCell<AddrMap<Prep>>,
    /// Expert-cache slot weights a backend repacked in place, by data address (`None`: none
    /// would); an entry goes when its slot gets another expert.
    slots: std::cell::RefCell<AddrMap<Prep>>,
    /// Uses of a cache slot's matrix on the file's layout before it is repacked in place
    /// (MOLLM_SLOT_REPACK_AFTER, default [`SLOT_REPACK_AFTER`]); `None`: never
    /// (MOLLM_SLOT_REPACK=0).
    slot_repack_after: Option<u32>,
    /// Uses of slot weights on the file's layout so far.
    slot_seen: std::cell::RefCell<AddrMap<u32>>,
    /// The expert cache's slots that changed tenant (their repacks are stale).
    retired: Retired,
    /// Offer weights to `prepare_weight` (off with MOLLM_REPACK=0).
    repack: bool,
}

impl Prepared {
    pub(super) fn from_settings() -> Prepared {
        Prepared {
            weights: Default::default(),
            slots: Default::default(),
            slot_repack_after: abi::settings::SLOT_REPACK.on(true).then(|| {
                abi::settings::SLOT_REPACK_AFTER
                    .int_or(SLOT_REPACK_AFTER as u64)
                    .try_into()
                    .unwrap_or(SLOT_REPACK_AFTER)
            }),
            slot_seen: Default::default(),
            retired: Default::default(),
            repack: abi::settings::REPACK.on(true),
        }
    }

    /// The copy a backend prepared of model weight `w`, if one was made (never a slot's).
    pub(super) fn made(&self, w: &Weight) -> Prep {
        if w.cache_slot {
            return None;
        }
        self.weights
            .borrow()
            .get(&(w.desc.data as usize))
            .copied()
            .flatten()
    }

    /// Frees every prepared copy.
    pub(super) fn free(&mut self, backends: &[Backend]) {
        for (bi, d) in self.weights.get_mut().values().flatten() {
            backends[*bi].free_buffer(d.buffer);
        }
        for (bi, d) in self.slots.get_mut().values().flatten() {
            backends[*bi].free_buffer(d.buffer);
        }
    }
}

impl Exec {
    /// Watches the slots of an expert cache that pushes its slots' changes of tenant to
    /// `retired`; the repacks in the slots of a cache this one replaces are dropped.
    pub fn watch_slots(&mut self, retired: Retired) {
        let w = &mut self.weights;
        for (bi, d) in w.slots.get_mut().drain().filter_map(|(_, p)| p) {
            self.backends[bi].free_buffer(d.buffer);
        }
        w.slot_seen.get_mut().clear();
        w.retired = retired;
    }

    /// The prepared copy of `w`, made on first use by the first backend that prepares it.
    pub(super) fn prepared(&self, w: &Weight) -> Result<Prep> {
        let st = &self.weights;
        if w.cache_slot {
            self.drop_retired();
            if !st.repack {
                return Ok(None);
            }
            return Ok(st
                .slot_repack_after
                .and_then(|after| self.slot_prepared(w, after)));
        }
        if !st.repack {
            return Ok(None);
        }
        let key = w.desc.data as usize;
        if let Some(p) = st.weights.borrow().get(&key) {
            return Ok(*p);
        }
        let mut p = None;
        for (i, b) in self.backends.iter().enumerate() {
            if b.is_refused(Op::MatMul) {
                continue;
            }
            if let Some(d) = b.prepare_weight(&w.desc, w.file_mapped)? {
                p = Some((i, d));
                break;
            }
        }
        if p.is_some() && w.file_mapped {
            release_pages(&w.desc);
        }
        st.weights.borrow_mut().insert(key, p);
        Ok(p)
    }

    /// A cache slot's weight repacked in place by the first backend that has a layout for it
    /// in the room the slot leaves, once it has made `after` calls on the file's layout (both
    /// layouts compute the same bits; see [`SLOT_REPACK_AFTER`]); once per tenant of the slot:
    /// repacks of slots that got another expert are dropped first.
    fn slot_prepared(&self, w: &Weight, after: u32) -> Prep {
        let mut map = self.weights.slots.borrow_mut();
        let mut seen = self.weights.slot_seen.borrow_mut();
        let key = w.desc.data as usize;
        if let Some(p) = map.get(&key) {
            return *p;
        }
        let uses = seen.entry(key).or_insert(0);
        *uses += 1;
        if *uses <= after {
            return None;
        }
        // The repack starts at the next 64-byte boundary (a GGUF's experts are 32-aligned).
        let dst = key.next_multiple_of(64);
        let cap = w.room.saturating_sub(dst - key);
        let p = self.backends.iter().enumerate().find_map(|(i, b)| {
            if b.is_refused(Op::MatMul) || cap == 0 {
                return None;
            }
            b.prepare_weight_into(&w.desc, dst as *mut u8, cap)
                .map(|d| (i, d))
        });
        map.insert(key, p);
        p
    }

    /// Forgets what was made of the bytes of slots that changed tenant (always, so that the
    /// cache's list stays short whether or not slots are repacked).
    fn drop_retired(&self) {
        let st = &self.weights;
        let retired = std::mem::take(&mut *st.retired.lock().unwrap_or_else(|e| e.into_inner()));
        if retired.is_empty() {
            return;
        }
        let mut map = st.slots.borrow_mut();
        let mut seen = st.slot_seen.borrow_mut();
        for range in retired {
            seen.retain(|addr, _| !range.contains(addr));
            map.retain(|&addr, p| {
                let stale = range.contains(&addr);
                if let (true, Some((bi, d))) = (stale, p) {
                    self.backends[*bi].free_buffer(d.buffer);
                }
                !stale
            });
        }
    }
}

/// Drops the process's resident pages of a weight a backend repacked: the executor no
/// longer reads them (they come back from the model file if a fallback ever does), so the
/// repacked copy does not double the memory the weights take.
fn release_pages(w: &TensorDesc) {
    let Some(bytes) = w.numel().and_then(|n| {
        let dt = w.dtype()?;
        Some(n as usize / dt.info().block_len as usize * dt.info().block_bytes as usize)
    }) else {
        return;
    };
    #[cfg(unix)]
    {
        const PAGE: usize = 4096;
        let start = (w.data as usize).next_multiple_of(PAGE);
        let end = (w.data as usize + bytes) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside the weight's read-only file mapping; MADV_DONTNEED
            // on such a mapping only drops pages, which later reads fault back in.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
}

/// Maps keyed by a weight's address, looked up once or twice per matrix product: hashed with
/// one multiplication instead of SipHash (the addresses are the engine's own, not input).
type AddrMap<V> = std::collections::HashMap<usize, V, std::hash::BuildHasherDefault<AddrHash>>;

#[derive(Default)]
struct AddrHash(u64);

impl std::hash::Hasher for AddrHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, x: usize) {
        // Fibonacci hashing: the high bits mix every bit of the address.
        self.0 = (x as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(32);
    }
}
