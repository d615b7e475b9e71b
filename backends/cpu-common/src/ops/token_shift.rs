//! token_shift: per sequence, each column minus the one before it (the state before the
//! first); the last column becomes the state. One subtraction per value, so any order of the
//! work is exact.

use super::*;

#[inline(always)]
pub(crate) unsafe fn sub_body(prev: &[f32], cur: &[f32], out: &mut [f32]) {
    for ((o, &p), &c) in out.iter_mut().zip(prev).zip(cur) {
        *o = p - c;
    }
}
isa_dispatch!(sub => sub_body(prev: &[f32], cur: &[f32], out: &mut [f32]));

pub(crate) unsafe fn token_shift(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) {
    let (x, state) = (inputs[0], inputs[1]);
    let (out, new_state) = (outputs[0], outputs[1]);
    let [e, tokens, seqs, _] = x.ne;
    let e = e as usize;
    // One task per sequence: its state is read before its new state is written (they may be
    // one tensor), and no other sequence touches either.
    for_rows(host, seqs, e as i64 * tokens.max(1), |s| {
        let (mut prev, mut cur, mut y) = (vec![0f32; e], vec![0f32; e], vec![0f32; e]);
        read_into(&state, s, 0, 0, &mut prev);
        for t in 0..tokens {
            read_into(&x, t, s, 0, &mut cur);
            sub(isa, &prev, &cur, &mut y);
            write_from(&out, t, s, 0, &y);
            core::mem::swap(&mut prev, &mut cur);
        }
        write_from(&new_state, s, 0, 0, &prev);
    });
}
