//! `mollm devices`, `mollm backends`, `mollm ops`: what native backend plugins were found, what
//! they declare, and which backend an op call would go to.

use abi::{DType, Op};
use clap::Args;
use conformance::cases::{self, case, Case};
use engine::backend::Backend;
use engine::pool::Pool;
use engine::registry::{self, Assessed, Caps, GateRunner};
use std::path::PathBuf;

/// Plugin libraries named on the command line.
#[derive(Args, Debug, Clone, Default)]
pub struct LibArgs {
    /// A backend plugin library to consider besides those found next to the executable and in
    /// MOLLM_BACKEND_DIR (repeatable).
    #[arg(long = "backend-lib", value_name = "PATH")]
    pub backend_lib: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DevicesArgs {
    #[command(flatten)]
    pub libs: LibArgs,
    /// Also measure this machine's memory read bandwidth (kept for `mollm bench`, which then
    /// states each decode row's weight bandwidth as a share of it).
    #[arg(long)]
    pub probe: bool,
    /// MiB the bandwidth probe reads (larger than the last-level cache).
    #[arg(long, default_value_t = 1024, requires = "probe")]
    pub probe_mb: usize,
}

pub(crate) type Res = Result<(), Box<dyn std::error::Error>>;

/// Seeds probed when listing what a backend declares.
pub(crate) const PROBE_SEEDS: u64 = 48;

/// Seeded cases per op the gate runs (as the engine's gate child reads them), besides the
/// fixed cases.
fn gate_seeds() -> u64 {
    registry::gate_cases()
}

/// The operand whose format names a case: the weight, the KV cache or the destination.
pub(crate) fn case_format(c: &Case) -> DType {
    cases::format(c)
}

/// Does `b` declare this case (its `supports` accepts the call)?
pub(crate) fn declares(b: &Backend, c: &mut Case) -> bool {
    let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
    let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
    b.supports(c.op, &ins, &outs, &c.params)
}

/// Cases of one op and format that `supports` declined, for one reason.
struct Skip {
    format: DType,
    reason: String,
    cases: usize,
}

/// What a backend declares of one op. Over the probe cases (more seeds than the gate runs,
/// and the fixed cases): formats declared for some call (`yes`) and formats never declared
/// (`no`). Over the cases the conformance gate runs: the formats it ran (`gate_ran`, a pass
/// unless the gate refused the op) and every (format, reason) `supports` declined, which the
/// gate skipped (`skipped`: not run, so not passed).
struct Declared {
    yes: Vec<DType>,
    no: Vec<DType>,
    gate_ran: Vec<DType>,
    skipped: Vec<Skip>,
    /// Gate cases per format.
    gate_total: Vec<(DType, usize)>,
}

impl Declared {
    fn gate_total(&self, f: DType) -> usize {
        self.gate_total.iter().find(|t| t.0 == f).map_or(0, |t| t.1)
    }

    /// The formats the gate skipped (some or all of their cases).
    fn skipped_formats(&self) -> Vec<DType> {
        let mut v: Vec<DType> = Vec::new();
        for s in &self.skipped {
            if !v.contains(&s.format) {
                v.push(s.format);
            }
        }
        v
    }

    /// Declared formats the gate has no case of (neither passed nor skipped).
    fn not_run(&self) -> Vec<DType> {
        self.yes
            .iter()
            .copied()
            .filter(|f| !self.gate_ran.contains(f))
            .collect()
    }
}

fn push_once(v: &mut Vec<DType>, f: DType) {
    if !v.contains(&f) {
        v.push(f);
    }
}

fn declared_formats(b: &Backend, op: Op) -> Declared {
    let mut d = Declared {
        yes: Vec::new(),
        no: Vec::new(),
        gate_ran: Vec::new(),
        skipped: Vec::new(),
        gate_total: Vec::new(),
    };
    let n_gate = gate_seeds();
    // (in the gate's cases, case): seeds 0..n_gate and the fixed cases are.
    let seeded = (0..PROBE_SEEDS.max(n_gate)).map(|s| (s < n_gate, case(op, s)));
    let fixed = (0..cases::fixed_count(op))
        .filter_map(|i| cases::fixed_case(op, i))
        .map(|c| (true, c));
    for (in_gate, mut c) in seeded.chain(fixed) {
        let f = case_format(&c);
        if in_gate {
            match d.gate_total.iter_mut().find(|t| t.0 == f) {
                Some(t) => t.1 += 1,
                None => d.gate_total.push((f, 1)),
            }
        }
        if declares(b, &mut c) {
            push_once(&mut d.yes, f);
            if in_gate {
                push_once(&mut d.gate_ran, f);
            }
            continue;
        }
        push_once(&mut d.no, f);
        if !in_gate {
            continue;
        }
        let reason = match b.last_error().trim() {
            "" => "supports() gave no reason".to_string(),
            e => e.to_string(),
        };
        match d
            .skipped
            .iter_mut()
            .find(|s| s.format == f && s.reason == reason)
        {
            Some(s) => s.cases += 1,
            None => d.skipped.push(Skip {
                format: f,
                reason,
                cases: 1,
            }),
        }
    }
    // A format declared for some shapes is listed as declared.
    let yes = d.yes.clone();
    d.no.retain(|f| !yes.contains(f));
    d.yes.sort_by_key(|f| f.id());
    d.no.sort_by_key(|f| f.id());
    d.gate_ran.sort_by_key(|f| f.id());
    d.skipped.sort_by_key(|s| s.format.id());
    d
}

fn declared_ops(b: &Backend) -> usize {
    Op::ALL
        .iter()
        .filter(|&&op| !declared_formats(b, op).yes.is_empty())
        .count()
}

pub(crate) fn assess_all(libs: &LibArgs) -> Result<Vec<Assessed>, Box<dyn std::error::Error>> {
    let cap = Caps::from_env()?;
    let runner = GateRunner::self_exec()?;
    Ok(registry::assess(
        registry::discover(&libs.backend_lib),
        &runner,
        cap,
        None,
    ))
}

/// A backend instance for probing `supports`, when it is safe to make one (score > 0).
pub(crate) fn probe_instance(a: &Assessed, pool: &Pool) -> Option<Backend> {
    let p = a.plugin()?;
    if p.score == 0 {
        return None;
    }
    p.open_backend(pool.host_api()).ok()
}

pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let w: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, s) in r.iter().enumerate() {
                if i + 1 == r.len() {
                    line.push_str(s);
                } else {
                    line.push_str(&format!("{s:<width$}  ", width = w[i]));
                }
            }
            line.trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn status_text(a: &Assessed) -> String {
    match &a.status {
        Err(e) => format!("unavailable: {e}"),
        Ok(failed) if failed.is_empty() => "available".into(),
        Ok(failed) => format!(
            "available; refused by the conformance gate: {}",
            failed
                .iter()
                .map(|(o, _)| o.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn devices(a: DevicesArgs) -> Res {
    if a.probe {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let p = crate::probe::measure(a.probe_mb.max(1), threads)?;
        let kept = crate::probe::save(&p)?;
        println!(
            "memory read bandwidth: {:.1} GB/s with 1 thread, {:.1} GB/s with {} threads (best of {} passes over {} MiB, each with the loads alone and with a prefetch {} KiB ahead; the best {}; kept in {})\n",
            p.gbps_one,
            p.gbps_all,
            p.threads,
            crate::probe::PASSES,
            p.mib,
            crate::probe::PREFETCH
                .iter()
                .filter(|&&b| b > 0)
                .map(|b| (b / 1024).to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            match p.prefetch {
                0 => "with the loads alone".to_string(),
                b => format!("with a prefetch {} KiB ahead", b / 1024),
            },
            kept.display()
        );
    }
    let libs = a.libs;
    let assessed = assess_all(&libs)?;
    let pool = Pool::new(1)?;
    let mut rows = vec![vec![
        "NAME".to_string(),
        "DEVICE".into(),
        "SCORE".into(),
        "OPS".into(),
        "STATUS".into(),
        "PATH".into(),
    ]];
    for a in &assessed {
        let (dev, score) = match a.plugin() {
            Some(p) => (p.device().to_string(), p.score.to_string()),
            None => ("-".into(), "-".into()),
        };
        let ops = match probe_instance(a, &pool) {
            Some(b) => {
                let d = declared_ops(&b);
                let refused = a.status.as_ref().map(|f| f.len()).unwrap_or(0);
                if a.usable() {
                    format!("{}/{d}", d.saturating_sub(refused))
                } else {
                    format!("-/{d}")
                }
            }
            None => "-".into(),
        };
        rows.push(vec![
            a.candidate.name(),
            dev,
            score,
            ops,
            status_text(a),
            a.candidate.path.display().to_string(),
        ]);
    }
    let reference = Backend::open(&reference::HEADER, pool.host_api())?;
    let d = declared_ops(&reference);
    rows.push(vec![
        "reference".into(),
        "cpu".into(),
        "1".into(),
        format!("{d}/{d}"),
        "available (built in, fallback)".into(),
        "-".into(),
    ]);
    println!("{}", table(&rows));
    println!("OPS = ops usable after the conformance gate / ops declared (supports() over the conformance cases)");
    Ok(())
}

pub fn backends(libs: LibArgs) -> Res {
    let assessed = assess_all(&libs)?;
    let pool = Pool::new(1)?;
    let mut first = true;
    let mut show = |name: &str, header: String, b: Option<&Backend>, a: Option<&Assessed>| {
        if !first {
            println!();
        }
        first = false;
        println!("{name}  {header}");
        let Some(b) = b else { return };
        let mut rows = vec![vec![
            "  OP".to_string(),
            "DECLARED FORMATS".into(),
            "NOT DECLARED".into(),
            "GATE".into(),
        ]];
        // The gate ran: what it skipped is listed apart from what passed.
        let gated = a.is_some_and(|a| a.status.is_ok());
        let mut skip_rows = vec![vec![
            "    OP".to_string(),
            "FORMAT".into(),
            "CASES".into(),
            "REASON".into(),
        ]];
        for &op in Op::ALL {
            let dec = declared_formats(b, op);
            let fmt = |v: &[DType]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                }
            };
            let skipped_formats = dec.skipped_formats();
            let gate = match a {
                None => "-".to_string(),
                Some(a) => match (&a.status, a.refused(op)) {
                    (Err(_), _) => "-".into(),
                    (Ok(_), Some(e)) => format!("refused: {e}"),
                    (Ok(_), None) => {
                        let mut parts = Vec::new();
                        if !dec.gate_ran.is_empty() {
                            parts.push(format!("passed: {}", fmt(&dec.gate_ran)));
                        }
                        if !skipped_formats.is_empty() {
                            parts.push(format!("skipped: {}", fmt(&skipped_formats)));
                        }
                        if !dec.not_run().is_empty() {
                            parts.push(format!("no gate case: {}", fmt(&dec.not_run())));
                        }
                        if dec.yes.is_empty() {
                            "skipped (nothing declared)".into()
                        } else {
                            parts.join("; ")
                        }
                    }
                },
            };
            if gated {
                for s in &dec.skipped {
                    skip_rows.push(vec![
                        format!("    {}", op.name()),
                        s.format.to_string(),
                        format!("{}/{}", s.cases, dec.gate_total(s.format)),
                        s.reason.clone(),
                    ]);
                }
            }
            rows.push(vec![
                format!("  {}", op.name()),
                fmt(&dec.yes),
                fmt(&dec.no),
                gate,
            ]);
        }
        println!("{}", table(&rows));
        if gated {
            if skip_rows.len() == 1 {
                println!("  skipped by the conformance gate: none");
            } else {
                println!(
                    "  skipped by the conformance gate (not declared, so not run: not passed):"
                );
                println!("{}", table(&skip_rows));
            }
        }
    };
    for a in &assessed {
        let header = match a.plugin() {
            Some(p) => format!(
                "[{}, score {}, {}] {}",
                p.device(),
                p.score,
                status_text(a),
                a.candidate.path.display()
            ),
            None => format!("[{}] {}", status_text(a), a.candidate.path.display()),
        };
        let inst = probe_instance(a, &pool);
        show(&a.candidate.name(), header, inst.as_ref(), Some(a));
    }
    let reference = Backend::open(&reference::HEADER, pool.host_api())?;
    show(
        "reference",
        "[cpu, score 1, built in]".into(),
        Some(&reference),
        None,
    );
    Ok(())
}
