//! # Conformance: a backend's ops against the reference
//!
//! For every op a backend declares, seeded random [`cases`] and fixed ones at production sizes
//! run on the backend and on `reference`; outputs are compared with per-op tolerances
//! ([`tolerance`]), exactly for argmax. Backend authors run `cargo test -p mollm-conformance`; the
//! engine runs [`check_backend`] before it dispatches to a backend and refuses the ops that
//! fail.
//!
//! A case the backend does not declare (`supports` answers `Unsupported`) is **skipped**: it is
//! not run, so it proves nothing, and it is not a pass. [`check_backend_report`] keeps the
//! three apart ([`Report`]: passed, skipped with the backend's reason, failed), per op and
//! format.

pub mod cases;

use abi::{BackendTable, Op, OpCall, Status, TensorDesc};
use cases::Case;
use core::ffi::c_void;

/// How close a backend's output must be to the reference's: `|a - b| <= abs + rel * |b|`.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub abs: f32,
    pub rel: f32,
}

/// Per op. Quantized matmuls may sum in another order (and in a native backend round
/// activations slightly differently), so they get the widest bound; argmax must be exact.
pub fn tolerance(op: Op) -> Tolerance {
    match op {
        Op::Argmax | Op::GetRows | Op::SetRows | Op::Add | Op::Mul | Op::Scale | Op::TokenShift => {
            Tolerance {
                abs: 1e-6,
                rel: 1e-6,
            }
        }
        Op::MatMul => Tolerance {
            abs: 2e-2,
            rel: 2e-2,
        },
        Op::Attention => Tolerance {
            abs: 2e-3,
            rel: 2e-3,
        },
        Op::Glu => Tolerance {
            abs: 2e-3,
            rel: 2e-3,
        },
        // A few f32 products summed: another order of the adds (or other taps fused) moves
        // the result by some ulps of the largest partial sum, as for the norms.
        Op::SsmConv => Tolerance {
            abs: 1e-4,
            rel: 1e-4,
        },
        // Dots of the state with unit-length keys and queries, token after token: another
        // order of their sums moves each output by some ulps of the state, and the delta
        // rule does not let that grow over the tokens (on 200 seeds of these cases the
        // reference is within 1.1e-7 * (1 + |x|) of the recurrence computed in f64).
        Op::GatedDeltaNet => Tolerance {
            abs: 1e-4,
            rel: 1e-4,
        },
        // The same kind of recurrence (rwkv_wkv7: decays <= 1, a = -kk and b = kk * iclr with
        // kk of unit length, so M (diag(w) - a b^T-like) does not amplify): another order of
        // the two dots per row moves each output by some ulps of the state.
        Op::RwkvWkv7 => Tolerance {
            abs: 1e-4,
            rel: 1e-4,
        },
        _ => Tolerance {
            abs: 1e-4,
            rel: 1e-4,
        },
    }
}

/// A backend instance opened for checking.
pub struct Instance<'t> {
    pub table: &'t BackendTable,
    pub ctx: *mut c_void,
}

impl<'t> Instance<'t> {
    pub fn open(table: &'t BackendTable, host: &abi::HostApi) -> Result<Instance<'t>, String> {
        let mut ctx = core::ptr::null_mut();
        match Status::from_raw((table.init)(host, &mut ctx)) {
            Status::Ok => Ok(Instance { table, ctx }),
            s => Err(format!("init failed: {s:?}")),
        }
    }

    /// Computes `c`; its output bytes (set_rows: the cache, updated in place) or the status
    /// and `last_error` text.
    pub fn run(&self, c: &mut Case) -> Result<Vec<Vec<u8>>, String> {
        let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        // In-place ops name the same tensor as input and output: give the output the input's
        // memory so both sides see one buffer.
        let mut outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        if c.op == Op::SetRows {
            outs[0] = ins[2];
        }
        let call = OpCall::new(c.op, &ins, &outs, c.params);
        let st = Status::from_raw((self.table.compute)(self.ctx, &call));
        if st != Status::Ok {
            let mut buf = vec![0u8; 512];
            let n = (self.table.last_error)(self.ctx, buf.as_mut_ptr(), buf.len()).min(buf.len());
            return Err(format!("{st:?}: {}", String::from_utf8_lossy(&buf[..n])));
        }
        Ok(if c.op == Op::SetRows {
            vec![c.inputs[2].data.clone()]
        } else {
            c.outputs.iter().map(|o| o.data.clone()).collect()
        })
    }
}

impl Instance<'_> {
    /// [`Instance::run`] with the first input prepared by the backend (`prepare_weight`):
    /// `None` when the backend keeps this weight as it is. The outputs are poisoned first,
    /// so a call that writes nothing cannot pass on the plain run's results.
    fn run_prepared(&self, c: &mut Case) -> Result<Option<Vec<Vec<u8>>>, String> {
        let Some(prep) = self.table.prepare_weight else {
            return Ok(None);
        };
        let mut ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        let mut pd = ins[0];
        let st = Status::from_raw(prep(self.ctx, &ins[0], &mut pd));
        if st != Status::Ok || pd.buffer == 0 {
            return Ok(None);
        }
        ins[0] = pd;
        for o in &mut c.outputs {
            o.data.fill(0xFF);
        }
        let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        let call = OpCall::new(c.op, &ins, &outs, c.params);
        // A get_rows table the backend prepared (for mat_mul) it may not read rows from: the
        // host then reads the table itself. Its own mat_mul weight it must take.
        let declined = c.op != Op::MatMul
            && self
                .table
                .supports
                .is_some_and(|f| Status::from_raw(f(self.ctx, &call)) == Status::Unsupported);
        let st = if declined {
            Status::Ok
        } else {
            Status::from_raw((self.table.compute)(self.ctx, &call))
        };
        let err = (st != Status::Ok).then(|| {
            let mut buf = vec![0u8; 512];
            let n = (self.table.last_error)(self.ctx, buf.as_mut_ptr(), buf.len()).min(buf.len());
            format!(
                "prepared weight: {st:?}: {}",
                String::from_utf8_lossy(&buf[..n])
            )
        });
        if let Some(free) = self.table.buffer_free {
            free(self.ctx, pd.buffer);
        }
        match err {
            Some(e) => Err(e),
            None if declined => Ok(None),
            None => Ok(Some(c.outputs.iter().map(|o| o.data.clone()).collect())),
        }
    }
}

impl Instance<'_> {
    /// [`Instance::run`] with operands in the backend's device memory (`buffer_alloc` without
    /// `buffer_host_ptr`, ABI 1.7: `data` is the offset in the buffer): each operand but a
    /// weight goes there where the backend still takes the call with it there, the inputs are
    /// copied in and the outputs out with `buffer_copy`. `None`: no device memory, or no
    /// operand it takes there.
    pub fn run_on_device(&self, c: &mut Case) -> Result<Option<Vec<Vec<u8>>>, String> {
        let t = self.table;
        let (Some(alloc), Some(copy), Some(supports), None) =
            (t.buffer_alloc, t.buffer_copy, t.supports, t.buffer_host_ptr)
        else {
            return Ok(None);
        };
        let in_place = c.op == Op::SetRows;
        let mut ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        let mut outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        if in_place {
            outs[0] = ins[2];
        }
        let n_in = ins.len();
        // Operand j's offset in one buffer, 256-byte aligned.
        let mut offs = Vec::new();
        let mut size = 0usize;
        for d in ins.iter().chain(&outs) {
            offs.push(size);
            let bytes = d.nrows() as usize * d.nb[1] as usize;
            size = (size + bytes.max(4)).next_multiple_of(256);
        }
        let mut h = 0u64;
        if Status::from_raw(alloc(self.ctx, size, &mut h)) != Status::Ok || h == 0 {
            return Err("buffer_alloc failed".into());
        }
        let on_dev = |d: &TensorDesc, off: usize| {
            let mut x = *d;
            x.buffer = h;
            x.data = off as *mut u8;
            x
        };
        let weight = matches!(c.op, Op::MatMul | Op::GetRows);
        let mut moved = vec![false; n_in + outs.len()];
        for j in 0..moved.len() {
            if (weight && j == 0) || (in_place && j == n_in) {
                continue;
            }
            let (mut ti, mut to) = (ins.clone(), outs.clone());
            let d = if j < n_in {
                &mut ti[j]
            } else {
                &mut to[j - n_in]
            };
            *d = on_dev(d, offs[j]);
            if in_place && j == 2 {
                to[0] = ti[2];
            }
            if Status::from_raw(supports(self.ctx, &OpCall::new(c.op, &ti, &to, c.params)))
                == Status::Ok
            {
                moved[j] = true;
                (ins, outs) = (ti, to);
            }
        }
        let res = (|| {
            if !moved.iter().any(|&m| m) {
                return Ok(None);
            }
            let mut st = Status::Ok;
            let poison = |o: &mut cases::Owned| o.data.fill(0xFF);
            for (j, o) in c.outputs.iter_mut().enumerate() {
                if !(in_place || moved[n_in + j]) {
                    poison(o);
                }
            }
            for j in 0..moved.len() {
                if !moved[j] || (in_place && j == n_in) {
                    continue;
                }
                let owned = if j < n_in {
                    &mut c.inputs[j]
                } else {
                    &mut c.outputs[j - n_in]
                };
                let mut host = owned.clone();
                if j >= n_in {
                    poison(&mut host);
                }
                let dev = if j < n_in { ins[j] } else { outs[j - n_in] };
                st = Status::from_raw(copy(self.ctx, &dev, &host.desc()));
                if st != Status::Ok {
                    break;
                }
            }
            if st == Status::Ok {
                st = Status::from_raw((self.table.compute)(
                    self.ctx,
                    &OpCall::new(c.op, &ins, &outs, c.params),
                ));
            }
            let mut got = Vec::new();
            for (j, o) in c.outputs.iter_mut().enumerate() {
                if st != Status::Ok {
                    break;
                }
                let (dev, mut host) = if in_place {
                    (ins[2], c.inputs[2].clone())
                } else {
                    (outs[j], o.clone())
                };
                if dev.buffer != 0 {
                    st = Status::from_raw(copy(self.ctx, &host.desc(), &dev));
                    got.push(host.data);
                } else if in_place {
                    got.push(c.inputs[2].data.clone());
                } else {
                    got.push(o.data.clone());
                }
            }
            if st != Status::Ok {
                let mut buf = vec![0u8; 512];
                let n =
                    (self.table.last_error)(self.ctx, buf.as_mut_ptr(), buf.len()).min(buf.len());
                return Err(format!(
                    "device operands: {st:?}: {}",
                    String::from_utf8_lossy(&buf[..n])
                ));
            }
            Ok(Some(got))
        })();
        if let Some(free) = t.buffer_free {
            free(self.ctx, h);
        }
        res
    }
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        (self.table.shutdown)(self.ctx);
    }
}

fn compare(op: Op, got: &[u8], want: &[u8], dtype: abi::DType) -> Result<(), String> {
    if dtype != abi::DType::F32 {
        return if got == want {
            Ok(())
        } else {
            Err("output bytes differ".into())
        };
    }
    let tol = tolerance(op);
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
            .collect()
    };
    for (i, (g, w)) in f(got).iter().zip(f(want)).enumerate() {
        let ok = approx::abs_diff_eq!(*g, w, epsilon = tol.abs + tol.rel * w.abs())
            || (g.is_nan() && w.is_nan());
        if !ok {
            return Err(format!(
                "element {i}: got {g}, reference {w} (tolerance {} + {}*|ref|)",
                tol.abs, tol.rel
            ));
        }
    }
    Ok(())
}

/// One op and format that passed: how many of its cases ran and matched the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passed {
    pub op: Op,
    pub format: abi::DType,
    pub cases: usize,
}

/// One op and format (and reason) the backend does not declare: its cases were not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub op: Op,
    pub format: abi::DType,
    /// The backend's `last_error` after `supports` declined, or a note that it gave none.
    pub reason: String,
    pub cases: usize,
}

/// What the gate did, per op and format ([`cases::format`]): passed, skipped, failed. An op
/// that failed is refused whole, so none of its formats is listed as passed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub passed: Vec<Passed>,
    pub skipped: Vec<Skipped>,
    /// Ops with a case that failed, each with the first failure.
    pub failed: Vec<(Op, String)>,
}

impl Report {
    /// Nothing failed (skips do not count either way).
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }

    /// Whether this op ran and passed for this format.
    pub fn passed(&self, op: Op, format: abi::DType) -> bool {
        self.passed.iter().any(|p| p.op == op && p.format == format)
    }

    /// The reasons this op and format were skipped (empty: not skipped).
    pub fn skipped(&self, op: Op, format: abi::DType) -> Vec<&str> {
        self.skipped
            .iter()
            .filter(|s| s.op == op && s.format == format)
            .map(|s| s.reason.as_str())
            .collect()
    }

    fn add_pass(&mut self, op: Op, format: abi::DType) {
        match self
            .passed
            .iter_mut()
            .find(|p| p.op == op && p.format == format)
        {
            Some(p) => p.cases += 1,
            None => self.passed.push(Passed {
                op,
                format,
                cases: 1,
            }),
        }
    }

    fn add_skip(&mut self, op: Op, format: abi::DType, reason: String) {
        match self
            .skipped
            .iter_mut()
            .find(|s| s.op == op && s.format == format && s.reason == reason)
        {
            Some(s) => s.cases += 1,
            None => self.skipped.push(Skipped {
                op,
                format,
                reason,
                cases: 1,
            }),
        }
    }

    /// The summary, several lines: a count line, then `passed`, `skipped` and `failed` lines
    /// (one per op for passes, one per op, format and reason for skips, one per failed op).
    pub fn summary(&self) -> String {
        let cases = |n: usize| if n == 1 { "case" } else { "cases" };
        let n_pass: usize = self.passed.iter().map(|p| p.cases).sum();
        let n_skip: usize = self.skipped.iter().map(|s| s.cases).sum();
        let mut out = format!(
            "{} op/format passed ({n_pass} {}), {} op/format skipped ({n_skip} {}, not run: not \
             declared), {} op failed",
            self.passed.len(),
            cases(n_pass),
            self.skipped.len(),
            cases(n_skip),
            self.failed.len()
        );
        for &op in Op::ALL {
            let ps: Vec<String> = self
                .passed
                .iter()
                .filter(|p| p.op == op)
                .map(|p| format!("{} ({} {})", p.format, p.cases, cases(p.cases)))
                .collect();
            if !ps.is_empty() {
                out += &format!("\n  passed   {}: {}", op.name(), ps.join(", "));
            }
        }
        for s in &self.skipped {
            out += &format!(
                "\n  skipped  {} {} ({} {}): {}",
                s.op.name(),
                s.format,
                s.cases,
                cases(s.cases),
                s.reason
            );
        }
        for (op, e) in &self.failed {
            out += &format!("\n  FAILED   {}: {e}", op.name());
        }
        out
    }
}

impl core::fmt::Display for Report {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.summary())
    }
}

/// Why `supports` declined: the backend's `last_error`, or a note when it left none.
fn decline_reason(inst: &Instance) -> String {
    let mut buf = vec![0u8; 512];
    let n = (inst.table.last_error)(inst.ctx, buf.as_mut_ptr(), buf.len()).min(buf.len());
    let msg = String::from_utf8_lossy(&buf[..n]).trim().to_string();
    if msg.is_empty() {
        "not declared (supports() gave no reason)".into()
    } else {
        format!("not declared: {msg}")
    }
}

/// Whether `backend` declares this case: `None` if so, else why not ([`decline_reason`]).
pub fn declines(backend: &Instance, c: &mut Case) -> Option<String> {
    let f = backend.table.supports?;
    let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
    let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
    let st = Status::from_raw(f(backend.ctx, &OpCall::new(c.op, &ins, &outs, c.params)));
    (st == Status::Unsupported).then(|| decline_reason(backend))
}

/// Runs `n_cases` seeded cases of `op` and its fixed cases ([`cases::cases`]) on `backend` and
/// on the reference; stops at the first failure.
pub fn check_op(
    backend: &Instance,
    reference: &Instance,
    op: Op,
    n_cases: u64,
) -> Result<(), String> {
    let mut r = Report::default();
    check_op_into(backend, reference, op, n_cases, &mut r);
    match r.failed.pop() {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// [`check_op`], recording into `report` what passed, what was skipped and what failed.
fn check_op_into(
    backend: &Instance,
    reference: &Instance,
    op: Op,
    n_cases: u64,
    report: &mut Report,
) {
    let mut ran = Report::default();
    let err = (|| {
        for (name, mut c) in cases::cases(op, n_cases) {
            let label = format!("{} {name} ({})", op.name(), c.label);
            let format = cases::format(&c);
            if let Some(why) = declines(backend, &mut c) {
                ran.add_skip(op, format, why);
                continue;
            }
            let mut c2 = c.clone();
            let want = reference
                .run(&mut c2)
                .map_err(|e| format!("{label}: reference failed: {e}"))?;
            let mut c_dev = c.clone();
            let got = backend.run(&mut c).map_err(|e| format!("{label}: {e}"))?;
            let dtype = if op == Op::SetRows {
                c.inputs[2].dtype
            } else {
                c.outputs[0].dtype
            };
            for (g, w) in got.iter().zip(&want) {
                compare(op, g, w, dtype).map_err(|e| format!("{label}: {e}"))?;
            }
            // A device backend: the same call with its operands in device memory gives the
            // same bytes as in host memory.
            if let Some(dev) = backend
                .run_on_device(&mut c_dev)
                .map_err(|e| format!("{label}: {e}"))?
            {
                for (d, g) in dev.iter().zip(&got) {
                    if d != g {
                        return Err(format!(
                            "{label}: with its operands in device memory the output differs \
                             from the same call in host memory"
                        ));
                    }
                }
            }
            // Weights the backend repacks at load: the same call on the prepared weight (and
            // rows of a prepared table, where the backend takes them).
            if matches!(op, Op::MatMul | Op::GetRows) {
                if let Some(got) = backend
                    .run_prepared(&mut c)
                    .map_err(|e| format!("{label}: {e}"))?
                {
                    for (g, w) in got.iter().zip(&want) {
                        compare(op, g, w, dtype)
                            .map_err(|e| format!("{label}, prepared weight: {e}"))?;
                    }
                }
            }
            ran.add_pass(op, format);
        }
        Ok::<(), String>(())
    })()
    .err();
    report.skipped.append(&mut ran.skipped);
    match err {
        Some(e) => report.failed.push((op, e)),
        None => report.passed.append(&mut ran.passed),
    }
}

/// Checks every op; returns the ones that fail, each with why.
pub fn check_backend(
    table: &BackendTable,
    host: &abi::HostApi,
    n_cases: u64,
) -> Result<Vec<(Op, String)>, String> {
    Ok(check_backend_report(table, host, n_cases)?.failed)
}

/// Checks every op: what passed, what was skipped (and why) and what failed, per op and format.
pub fn check_backend_report(
    table: &BackendTable,
    host: &abi::HostApi,
    n_cases: u64,
) -> Result<Report, String> {
    let backend = Instance::open(table, host)?;
    let reference = Instance::open(&reference::TABLE, host)?;
    let mut report = Report::default();
    for &op in Op::ALL {
        check_op_into(&backend, &reference, op, n_cases, &mut report);
    }
    let order = |op: Op| Op::ALL.iter().position(|&o| o == op);
    report.passed.sort_by_key(|p| (order(p.op), p.format.id()));
    report.skipped.sort_by_key(|s| (order(s.op), s.format.id()));
    Ok(report)
}
