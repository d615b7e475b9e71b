//! A steady-state decode step makes no heap allocation in the engine: activations live in the
//! plan's arena, step inputs in scratch sized at creation. Counted with a global allocator on
//! this thread, outside backend calls (a backend's own scratch is its business).

#[path = "common/smollm2.rs"]
mod smollm2;

use engine::{Session, SessionOptions};
use smollm2::smollm2;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static COUNT: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNT.with(|c| c.get()) && !engine::backend::in_backend_call() {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNT.with(|c| c.get()) && !engine::backend::in_backend_call() {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn decode_steps_allocate_nothing_in_the_engine() {
    let Some(m) = smollm2() else { return };
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch: 16,
        n_threads: 2,
        ..Default::default()
    };
    let mut s = Session::new(&m, &opts).unwrap();
    let mut logits = Vec::with_capacity(m.hp.n_vocab);
    s.eval_into(&[1, 2, 3, 4, 5], 4, &mut logits).unwrap();
    // Warm-up: the first decode step prepares weights (once per model and backend).
    s.eval_into(&[6], 0, &mut logits).unwrap();
    COUNT.with(|c| c.set(true));
    for t in 7..12 {
        s.eval_into(&[t], 0, &mut logits).unwrap();
    }
    COUNT.with(|c| c.set(false));
    assert_eq!(logits.len(), m.hp.n_vocab);
    let n = ALLOCS.with(|a| a.get());
    assert_eq!(n, 0, "{n} allocations in 5 decode steps");
    // The counter works: an allocation on this thread is seen.
    COUNT.with(|c| c.set(true));
    let v: Vec<u8> = Vec::with_capacity(std::hint::black_box(10));
    COUNT.with(|c| c.set(false));
    drop(v);
    assert_eq!(ALLOCS.with(|a| a.get()), 1);
}
