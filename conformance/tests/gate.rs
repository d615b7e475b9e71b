//! The gate itself must work: the reference passes against itself, and a backend that gets
//! one op subtly wrong is caught on exactly that op.

use abi::{BackendTable, Op, OpCall, Status};
use core::ffi::c_void;

#[test]
fn reference_conforms_to_itself() {
    let host = reference::serial_host();
    let failures = conformance::check_backend(&reference::TABLE, &host, 24).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
}

/// The reference, except that `add` is off by 1e-3 in its first element.
extern "C" fn broken_compute(ctx: *mut c_void, call: *const OpCall) -> i32 {
    let st = (reference::TABLE.compute)(ctx, call);
    // SAFETY: the call's arrays are valid for this call (ABI contract).
    let (op, _, outs) = unsafe { (*call).parts() };
    if st == Status::Ok as i32 && op == Some(Op::Add) {
        unsafe { *(outs[0].data as *mut f32) += 1e-3 };
    }
    st
}

static BROKEN: BackendTable = BackendTable {
    compute: broken_compute,
    ..copy_reference()
};

const fn copy_reference() -> BackendTable {
    BackendTable {
        init: reference::TABLE.init,
        shutdown: reference::TABLE.shutdown,
        compute: reference::TABLE.compute,
        last_error: reference::TABLE.last_error,
        score: reference::TABLE.score,
        supports: reference::TABLE.supports,
        synchronize: reference::TABLE.synchronize,
        buffer_alloc: reference::TABLE.buffer_alloc,
        buffer_free: reference::TABLE.buffer_free,
        buffer_copy: reference::TABLE.buffer_copy,
        prepare_weight: reference::TABLE.prepare_weight,
        buffer_host_ptr: reference::TABLE.buffer_host_ptr,
        unavailable_reason: None,
        prepare_weight_into: None,
        prepare_weight_ex: None,
    }
}

#[test]
fn a_broken_op_is_refused_and_only_that_op() {
    let host = reference::serial_host();
    let failures = conformance::check_backend(&BROKEN, &host, 8).unwrap();
    let ops: Vec<Op> = failures.iter().map(|f| f.0).collect();
    assert_eq!(ops, vec![Op::Add], "{failures:?}");
    assert!(failures[0].1.contains("add seed"), "{}", failures[0].1);
}

/// The reference with attention that stops at `n_kv = min(n_kv, 256)`: a kernel that handles
/// the first pad block only.
extern "C" fn first_block_only(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the host passes a valid call (ABI contract).
    let mut c = unsafe { *call };
    if c.op == Op::Attention as u32 {
        abi::AttentionAttrs::edit(&mut c.params, |a| a.n_kv = a.n_kv.min(256));
    }
    (reference::TABLE.compute)(ctx, &c)
}

/// The reference with attention that drops a partial last 64-row step: a kernel whose tail
/// after the main loop is missing.
extern "C" fn whole_steps_only(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the host passes a valid call (ABI contract).
    let mut c = unsafe { *call };
    if c.op == Op::Attention as u32 {
        abi::AttentionAttrs::edit(&mut c.params, |a| {
            if a.n_kv > 64 {
                a.n_kv &= !63;
            }
        });
    }
    (reference::TABLE.compute)(ctx, &c)
}

static FIRST_BLOCK_ONLY: BackendTable = BackendTable {
    compute: first_block_only,
    ..copy_reference()
};
static WHOLE_STEPS_ONLY: BackendTable = BackendTable {
    compute: whole_steps_only,
    ..copy_reference()
};

/// Bugs that only show over real cache lengths (the random cases use caches of 8 and 40 rows)
/// are caught by the fixed cases, at the gate's default case count.
#[test]
fn attention_bugs_past_small_caches_are_caught() {
    let host = reference::serial_host();
    for (name, table) in [
        ("first pad block only", &FIRST_BLOCK_ONLY),
        ("whole 64-row steps only", &WHOLE_STEPS_ONLY),
    ] {
        let failures =
            conformance::check_backend(table, &host, abi::WEIGHT_DTYPES.len() as u64).unwrap();
        let ops: Vec<Op> = failures.iter().map(|f| f.0).collect();
        assert_eq!(ops, vec![Op::Attention], "{name}: {failures:?}");
        assert!(
            failures[0].1.contains("fixed case"),
            "{name}: {}",
            failures[0].1
        );
    }
}

/// The fixed attention cases reach every path of the kernels (see `reference::ops::attention`
/// and `mollm_cpu_common::ops`), on real cache sizes.
#[test]
fn fixed_attention_cases_cover_the_kernel_paths() {
    use conformance::cases::ATTENTION_FIXED;
    let round_up = |v: i64, m: i64| (v + m - 1) / m * m;
    let mut seen = std::collections::BTreeSet::new();
    for &(d, hq, hkv, c, t, n_kv, window, softcap, dt) in ATTENTION_FIXED {
        let n_eff = round_up(n_kv, 256).min(c).max(n_kv);
        let tile = t >= 2 && n_eff % 16 == 0 && d % 4 == 0;
        let f = if dt == abi::DType::F16 { "f16" } else { "f32" };
        let mut hit = |what: &str| {
            seen.insert(format!("{what} {f}"));
        };
        hit(&format!("cache {c}"));
        hit(&format!("head dim {d}"));
        if n_kv == c {
            hit("n_kv = C");
        }
        if hq > hkv {
            hit("gqa");
        }
        if window > 0 && window < n_kv {
            hit("window");
        }
        if softcap > 0.0 {
            hit("softcap");
        }
        if t >= 2 {
            hit("causal prompt");
        }
        if tile {
            // 16-lane p·V tiles over n_eff, with 16-row score blocks cut at the last row.
            hit("tiled p.V");
            if n_eff >= 256 {
                hit("tiled main loop");
            }
        } else {
            let np = n_eff & !63;
            let span = round_up(n_kv, 64).min(n_eff);
            if np >= 128 {
                hit("64-lane main loop");
            }
            if span % 64 != 0 || n_kv % 64 != 0 {
                hit("partial 64-lane step");
            }
            if np < n_eff && span > np {
                hit("leftover rows");
            }
        }
        if n_kv > 256 {
            hit("past the first pad block");
        }
    }
    let mut missing = Vec::new();
    for f in ["f32", "f16"] {
        for what in [
            "cache 256",
            "cache 512",
            "head dim 64",
            "head dim 256",
            "n_kv = C",
            "gqa",
            "window",
            "causal prompt",
            "tiled p.V",
            "tiled main loop",
            "64-lane main loop",
            "partial 64-lane step",
            "leftover rows",
            "past the first pad block",
        ] {
            if !seen.contains(&format!("{what} {f}")) {
                missing.push(format!("{what} {f}"));
            }
        }
    }
    assert!(seen.contains("softcap f32"));
    assert!(missing.is_empty(), "not covered: {missing:?}");
}

// A backend that declares neither f16 attention caches nor q8_0 weights, and says why.
static DECLINED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

extern "C" fn picky_supports(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the call's arrays are valid for this call (ABI contract).
    let (op, ins, _) = unsafe { (*call).parts() };
    let why = match op {
        Some(Op::Attention) if ins[1].dtype() == Some(abi::DType::F16) => "no f16 caches here",
        Some(Op::MatMul) if ins[0].dtype() == Some(abi::DType::Q8_0) => "no q8_0 here",
        _ => return (reference::TABLE.supports.unwrap())(ctx, call),
    };
    *DECLINED.lock().unwrap() = why.into();
    Status::Unsupported as i32
}

extern "C" fn picky_last_error(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    let e = DECLINED.lock().unwrap();
    if e.is_empty() {
        return (reference::TABLE.last_error)(ctx, buf, cap);
    }
    let n = e.len().min(cap);
    // SAFETY: `buf` has room for `cap` bytes (ABI contract).
    unsafe { core::ptr::copy_nonoverlapping(e.as_ptr(), buf, n) };
    e.len()
}

static PICKY: BackendTable = BackendTable {
    supports: Some(picky_supports),
    last_error: picky_last_error,
    ..copy_reference()
};

#[test]
fn formats_not_declared_are_skips_listed_apart_from_passes() {
    let host = reference::serial_host();
    let r = conformance::check_backend_report(&PICKY, &host, 24).unwrap();
    assert!(r.ok(), "{r}");
    use abi::DType::{F16, F32, Q8_0};
    assert_eq!(
        r.skipped(Op::Attention, F16),
        ["not declared: no f16 caches here"],
        "{r}"
    );
    assert_eq!(
        r.skipped(Op::MatMul, Q8_0),
        ["not declared: no q8_0 here"],
        "{r}"
    );
    assert!(
        !r.passed(Op::Attention, F16) && !r.passed(Op::MatMul, Q8_0),
        "{r}"
    );
    assert!(
        r.passed(Op::Attention, F32) && r.passed(Op::MatMul, F16),
        "{r}"
    );
    // Nothing else is skipped, and every skip counts its cases.
    assert_eq!(r.skipped.len(), 2, "{r}");
    assert!(r.skipped.iter().all(|s| s.cases > 0), "{r}");
    let s = r.summary();
    assert!(s.contains("2 op/format skipped"), "{s}");
    assert!(
        s.lines()
            .any(|l| l.trim_start().starts_with("skipped  attention f16 (")
                && l.ends_with("not declared: no f16 caches here")),
        "{s}"
    );
    assert!(
        s.lines()
            .any(|l| l.trim_start().starts_with("passed   attention: f32 (") && !l.contains("f16")),
        "{s}"
    );
    // The reference declares everything: no skips.
    let r = conformance::check_backend_report(&reference::TABLE, &host, 24).unwrap();
    assert!(r.ok() && r.skipped.is_empty(), "{r}");
}

/// The reference, except that attention ignores a block table (reads pool rows as if they were
/// the sequence's): a backend that predates ABI 1.2's paging but takes the call anyway.
extern "C" fn ignores_block_table(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the host passes a valid call (ABI contract).
    let mut c = unsafe { *call };
    if c.op == Op::Attention as u32 && c.n_inputs == 5 {
        c.n_inputs = 4;
        abi::AttentionAttrs::edit(&mut c.params, |a| a.page_rows = 0);
    }
    (reference::TABLE.compute)(ctx, &c)
}

static IGNORES_BLOCK_TABLE: BackendTable = BackendTable {
    compute: ignores_block_table,
    ..copy_reference()
};

#[test]
fn a_backend_that_ignores_the_block_table_is_refused() {
    let host = reference::serial_host();
    let failures = conformance::check_backend(&IGNORES_BLOCK_TABLE, &host, 8).unwrap();
    let ops: Vec<Op> = failures.iter().map(|f| f.0).collect();
    assert_eq!(ops, vec![Op::Attention], "{failures:?}");
}

fn run_ref(c: &mut conformance::cases::Case) -> Result<Vec<f32>, String> {
    let host = reference::serial_host();
    let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
    let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
    reference::ops::compute(&host, c.op, &ins, &outs, &c.params).map_err(|e| format!("{e:?}"))?;
    Ok(c.outputs[0].as_f32())
}

/// The spec of paging: a paged call equals the unpaged call over the rows gathered through
/// the block table, bit for bit; a table entry outside the pool is refused.
#[test]
fn paged_attention_equals_attention_over_the_gathered_rows() {
    use conformance::cases::{fixed_case, ATTENTION_FIXED, ATTENTION_PAGED};
    for (i, &(_, _, _, _, page, table, ..)) in ATTENTION_PAGED.iter().enumerate() {
        let mut paged = fixed_case(Op::Attention, (ATTENTION_FIXED.len() + i) as u64).unwrap();
        let mut flat = paged.clone();
        flat.inputs.pop();
        abi::AttentionAttrs::edit(&mut flat.params, |a| a.page_rows = 0);
        for kv in 1..3 {
            let src = &paged.inputs[kv];
            let row = src.data.len() / src.shape[2] as usize; // bytes per cache row
            let mut data = Vec::new();
            for &b in table {
                let at = b as usize * page as usize * row;
                data.extend_from_slice(&src.data[at..at + page as usize * row]);
            }
            flat.inputs[kv].data = data;
            flat.inputs[kv].shape[2] = table.len() as i64 * page;
        }
        let (a, b) = (run_ref(&mut paged).unwrap(), run_ref(&mut flat).unwrap());
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{}",
            paged.label
        );
        let mut bad = paged.clone();
        let n = bad.inputs[4].data.len();
        bad.inputs[4].data[n - 4..].copy_from_slice(&99i32.to_le_bytes());
        let e = run_ref(&mut bad).unwrap_err();
        assert!(
            e.contains("block_table") && e.contains("outside the pool"),
            "{e}"
        );
    }
}

/// The spec of several sequences in one call (ABI 1.4): each sequence's rows equal the
/// one-sequence call with its queries, positions, n_kv and table column, bit for bit; query
/// ranges out of order or an n_kv past the call's are refused.
#[test]
fn attention_of_several_sequences_equals_one_call_each() {
    use conformance::cases::{fixed_case, Owned, ATTENTION_FIXED, ATTENTION_PAGED, ATTENTION_SEQS};
    let first = ATTENTION_FIXED.len() + ATTENTION_PAGED.len();
    for (i, &(d, hq, _, _, _, seqs, ..)) in ATTENTION_SEQS.iter().enumerate() {
        let mut multi = fixed_case(Op::Attention, (first + i) as u64).unwrap();
        let all = run_ref(&mut multi).unwrap();
        let col = (d * hq) as usize; // floats per query
        let mut t0 = 0usize;
        for &(table, t, n_kv) in seqs {
            let t = t as usize;
            let mut one = multi.clone();
            one.inputs.truncate(5);
            let q = &multi.inputs[0].as_f32()[t0 * col..(t0 + t) * col];
            one.inputs[0] = Owned::f32(&[d, hq, t as i64], q);
            let pos = &multi.inputs[3].data[t0 * 4..(t0 + t) * 4];
            let pos: Vec<i32> = pos
                .chunks(4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            one.inputs[3] = Owned::i32(&pos);
            one.inputs[4] = Owned::i32(table);
            one.outputs[0] = Owned::zeros(abi::DType::F32, &[d, hq, t as i64]);
            abi::AttentionAttrs::edit(&mut one.params, |a| a.n_kv = n_kv);
            let alone = run_ref(&mut one).unwrap();
            let part = &all[t0 * col..(t0 + t) * col];
            assert!(
                part.iter()
                    .zip(&alone)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{}: sequence at query {t0}",
                multi.label
            );
            t0 += t;
        }
        // seqs[0, 1] (the second sequence's first query) moved: out of order.
        let mut bad = multi.clone();
        bad.inputs[5].data[12..16].copy_from_slice(&7i32.to_le_bytes());
        let e = run_ref(&mut bad).unwrap_err();
        assert!(e.contains("in order"), "{e}");
        // An n_kv past the call's.
        let mut bad = multi.clone();
        let past = (abi::AttentionAttrs::from_params(&multi.params).n_kv + 1) as i32;
        bad.inputs[5].data[8..12].copy_from_slice(&past.to_le_bytes());
        let e = run_ref(&mut bad).unwrap_err();
        assert!(e.contains("n_kv must be"), "{e}");
    }
}
