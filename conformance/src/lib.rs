//! # Conformance: a backend's ops against the reference
//!
//! For every op a backend declares, seeded random [`cases`] run on the backend and on
//! `reference`; outputs are compared with per-op tolerances ([`tolerance`]), exactly for
//! argmax. Backend authors run `cargo test -p conformance`; the engine runs [`check_backend`]
//! before it dispatches to a backend and refuses the ops that fail.

pub mod cases;

use abi::{BackendTable, Op, OpCall, Status};
use cases::{case, Case};
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
        Op::Argmax | Op::GetRows | Op::SetRows | Op::Add | Op::Mul | Op::Scale => Tolerance {
            abs: 1e-6,
            rel: 1e-6,
        },
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

    fn run(&self, c: &mut Case) -> Result<Vec<Vec<u8>>, String> {
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
        let st = Status::from_raw((self.table.compute)(self.ctx, &call));
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
            None => Ok(Some(c.outputs.iter().map(|o| o.data.clone()).collect())),
        }
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

/// Runs `n_cases` seeded cases of `op` on `backend` and on the reference.
pub fn check_op(
    backend: &Instance,
    reference: &Instance,
    op: Op,
    n_cases: u64,
) -> Result<(), String> {
    for seed in 0..n_cases {
        let mut c = case(op, seed);
        let label = format!("{} seed {seed} ({})", op.name(), c.label);
        let unsupported = backend
            .table
            .supports
            .map(|f| {
                let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
                let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
                Status::from_raw(f(backend.ctx, &OpCall::new(op, &ins, &outs, c.params)))
                    == Status::Unsupported
            })
            .unwrap_or(false);
        if unsupported {
            continue;
        }
        let mut c2 = c.clone();
        let want = reference
            .run(&mut c2)
            .map_err(|e| format!("{label}: reference failed: {e}"))?;
        let got = backend.run(&mut c).map_err(|e| format!("{label}: {e}"))?;
        let dtype = if op == Op::SetRows {
            c.inputs[2].dtype
        } else {
            c.outputs[0].dtype
        };
        for (g, w) in got.iter().zip(&want) {
            compare(op, g, w, dtype).map_err(|e| format!("{label}: {e}"))?;
        }
        // Weights the backend repacks at load: the same call on the prepared weight.
        if op == Op::MatMul {
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
    }
    Ok(())
}

/// Checks every op; returns the ones that fail, each with why.
pub fn check_backend(
    table: &BackendTable,
    host: &abi::HostApi,
    n_cases: u64,
) -> Result<Vec<(Op, String)>, String> {
    let backend = Instance::open(table, host)?;
    let reference = Instance::open(&reference::TABLE, host)?;
    Ok(Op::ALL
        .iter()
        .filter_map(|&op| {
            check_op(&backend, &reference, op, n_cases)
                .err()
                .map(|e| (op, e))
        })
        .collect())
}
