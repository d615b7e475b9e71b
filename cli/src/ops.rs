//! `mollm ops`: which backend an op call goes to, and why each other one is out. Takes the
//! ABI's op names and the op families the project card uses (`gemm_w4`: mat_mul over the
//! 4-bit weight formats, ...), answering per format.

use crate::devices::{
    assess_all, case_format, declares, probe_instance, status_text, table, LibArgs, Res,
    PROBE_SEEDS,
};
use abi::{DType, Op};
use clap::Args;
use conformance::cases::{case, Case};
use engine::backend::Backend;
use engine::pool::Pool;
use engine::registry::{self, Assessed};

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Op name (e.g. mat_mul, add, attention) or op family (gemm, gemm_w4, gemm_w8, ...).
    #[arg(long)]
    pub op: String,
    /// Only backends of this device: cpu, gpu (any GPU), cuda or metal.
    #[arg(long)]
    pub device: Option<String>,
    /// The format of the op's main operand (e.g. Q4_K for mat_mul); default: the first case
    /// of an op, every format of a family.
    #[arg(long)]
    pub dtype: Option<String>,
    #[command(flatten)]
    pub libs: LibArgs,
}

/// Op families as the project card names them: an ABI op over a set of formats of its main
/// operand (empty: every format its conformance cases cover).
pub const FAMILIES: &[(&str, Op, &[DType])] = &[
    ("gemm", Op::MatMul, &[]),
    (
        "gemm_w4",
        Op::MatMul,
        &[
            DType::W4G32,
            DType::W4G128,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q4_K,
        ],
    ),
    (
        "gemm_w5",
        Op::MatMul,
        &[DType::Q5_0, DType::Q5_1, DType::Q5_K],
    ),
    ("gemm_w6", Op::MatMul, &[DType::Q6_K]),
    ("gemm_w8", Op::MatMul, &[DType::W8PC, DType::Q8_0]),
    ("gemm_f16", Op::MatMul, &[DType::F16]),
    ("gemm_f32", Op::MatMul, &[DType::F32]),
];

/// Device names `--device` takes: device kinds, and GPU backends by their plugin name.
const DEVICES: &[&str] = &["cpu", "gpu", "cuda", "metal"];

/// The op and the formats to answer for: `None` is the op's first case (an op name without
/// `--dtype`).
fn resolve(name: &str, dtype: Option<DType>) -> Result<(Op, Option<Vec<DType>>), String> {
    let squash = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    if let Some((_, op, formats)) = FAMILIES.iter().find(|f| squash(f.0) == squash(name)) {
        let all = case_formats(*op);
        let mut fs: Vec<DType> = match formats.is_empty() {
            true => all,
            false => formats.to_vec(),
        };
        if let Some(d) = dtype {
            if !fs.contains(&d) {
                return Err(format!(
                    "{name} does not cover {d} (it covers: {})",
                    names(&fs)
                ));
            }
            fs = vec![d];
        }
        return Ok((*op, Some(fs)));
    }
    let op = Op::from_name(name)
        .or_else(|| {
            Op::ALL
                .iter()
                .copied()
                .find(|o| squash(o.name()) == squash(name))
        })
        .ok_or_else(|| {
            format!(
                "unknown op '{name}' (ops: {}; families: {})",
                Op::ALL
                    .iter()
                    .map(|o| o.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                FAMILIES.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
            )
        })?;
    Ok((op, dtype.map(|d| vec![d])))
}

fn names(fs: &[DType]) -> String {
    fs.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The formats of an op's probe cases, in case order.
fn case_formats(op: Op) -> Vec<DType> {
    let mut fs = Vec::new();
    for seed in 0..PROBE_SEEDS {
        let f = case_format(&case(op, seed));
        if !fs.contains(&f) {
            fs.push(f);
        }
    }
    fs
}

/// The first probe case of `op` in format `f` (any format for `None`).
fn probe_case(op: Op, f: Option<DType>) -> Option<Case> {
    (0..PROBE_SEEDS)
        .map(|seed| case(op, seed))
        .find(|c| f.is_none_or(|f| case_format(c) == f))
}

/// Whether a backend of `device` (cpu or gpu) named `name` is one `--device` asks for.
fn on_device(want: Option<&str>, device: &str, name: &str) -> bool {
    match want {
        None => true,
        Some(w @ ("cpu" | "gpu")) => device == w,
        Some(w) => name == w,
    }
}

pub fn ops(a: OpsArgs) -> Res {
    let dtype = match &a.dtype {
        None => None,
        Some(s) => Some(
            DType::ALL
                .iter()
                .copied()
                .find(|d| d.name().eq_ignore_ascii_case(s))
                .ok_or_else(|| format!("unknown dtype '{s}'"))?,
        ),
    };
    let (op, formats) = resolve(&a.op, dtype)?;
    let want = a.device.as_deref();
    if let Some(d) = want {
        if !DEVICES.contains(&d) {
            return Err(format!("unknown device '{d}' ({})", DEVICES.join(", ")).into());
        }
    }
    let assessed = assess_all(&a.libs)?;
    let here = |x: &Assessed| {
        let p = x.plugin();
        on_device(
            want,
            p.map_or("?", |p| p.device()),
            &p.map_or(x.candidate.name(), |p| p.name.clone()),
        )
    };
    // A GPU backend asked for by name that is not here, or here and unusable: say why, and
    // stop (not an error: the answer to "what would run this" is "nothing on this machine").
    if let Some(d @ ("cuda" | "metal")) = want {
        match assessed.iter().find(|x| here(x)) {
            None => {
                println!("{d}: unavailable: this build of mollm has no {d} backend (no plugin named {d} was found next to the executable, in MOLLM_BACKEND_DIR or given with --backend-lib)");
                return Ok(());
            }
            Some(x) if !x.usable() => {
                println!("{d}: {}", status_text(x));
                return Ok(());
            }
            Some(_) => {}
        }
    }
    let pool = Pool::new(1)?;
    let probes: Vec<(DType, Option<Case>)> = match formats {
        None => {
            let c = probe_case(op, None).ok_or("no conformance case to probe")?;
            vec![(case_format(&c), Some(c))]
        }
        Some(fs) => fs.iter().map(|&f| (f, probe_case(op, Some(f)))).collect(),
    };
    for (i, (f, probe)) in probes.into_iter().enumerate() {
        if i > 0 {
            println!();
        }
        let Some(mut probe) = probe else {
            println!(
                "{} {f}: no conformance case of this format to probe (formats with cases: {})",
                op.name(),
                names(&case_formats(op))
            );
            continue;
        };
        println!("{} call probed: {} ({f})", op.name(), probe.label);
        let (rows, winner) = verdicts(op, &mut probe, &assessed, &pool, want, &here)?;
        println!("{}", table(&rows));
        println!("winner: {}", winner.as_deref().unwrap_or("none"));
    }
    Ok(())
}

/// Every backend's verdict on one call, in dispatch order (usable natives by score, the
/// reference, then the unusable ones), and the winner.
fn verdicts(
    op: Op,
    probe: &mut Case,
    assessed: &[Assessed],
    pool: &Pool,
    want: Option<&str>,
    here: &dyn Fn(&Assessed) -> bool,
) -> Result<(Vec<Vec<String>>, Option<String>), Box<dyn std::error::Error>> {
    let mut order: Vec<&Assessed> = registry::ranked(assessed);
    order.retain(|x| here(x));
    let mut rows = vec![vec![
        "BACKEND".to_string(),
        "SCORE".into(),
        "VERDICT".into(),
    ]];
    let mut winner: Option<(String, u32)> = None;
    for x in &order {
        let p = x.plugin().expect("usable");
        let verdict = if let Some(e) = x.refused(op) {
            format!("rejected: failed the conformance gate: {e}")
        } else {
            match probe_instance(x, pool) {
                Some(b) if declares(&b, probe) => match &winner {
                    None => {
                        winner = Some((p.name.clone(), p.score));
                        "WINNER".into()
                    }
                    Some((w, s)) => format!("rejected: lower score than {w} ({} < {s})", p.score),
                },
                Some(_) => "rejected: unsupported (supports() declines this call)".into(),
                None => "rejected: cannot open an instance".into(),
            }
        };
        rows.push(vec![p.name.clone(), p.score.to_string(), verdict]);
    }
    if on_device(want, "cpu", "reference") {
        let r = Backend::open(&reference::HEADER, pool.host_api())?;
        let verdict = match &winner {
            None if declares(&r, probe) => {
                winner = Some(("reference".into(), 1));
                "WINNER (fallback)".to_string()
            }
            None => "rejected: unsupported".to_string(),
            Some((w, _)) => format!("not needed: fallback behind {w}"),
        };
        rows.push(vec!["reference".into(), "1".into(), verdict]);
    }
    for x in assessed.iter().filter(|x| !x.usable()) {
        if x.plugin().is_some() && !here(x) {
            continue;
        }
        rows.push(vec![
            x.candidate.name(),
            x.plugin()
                .map(|p| p.score.to_string())
                .unwrap_or("-".into()),
            format!("rejected: {}", status_text(x)),
        ]);
    }
    Ok((rows, winner.map(|w| w.0)))
}
