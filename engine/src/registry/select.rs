//! Assessment (every candidate: usable or why not, and its refused ops) and selection of the
//! session's backends.

use super::*;

/// Everything known about one candidate: can it be used, and which ops are refused.
pub struct Assessed {
    pub candidate: Candidate,
    /// `Ok(failed ops)` when usable; `Err(why not)` otherwise.
    pub status: std::result::Result<Vec<(Op, String)>, Unusable>,
}

/// Why a candidate is not used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unusable {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The host cannot run it (CPU features, device kind, ABI minor): the precheck's reason.
    #[error("{0}")]
    Host(String),
    #[error("not selected")]
    NotSelected,
    /// The gate child refused the whole library (it crashed or would not load there).
    #[error("{0}")]
    Gate(String),
}

impl Assessed {
    pub fn plugin(&self) -> Option<&Plugin> {
        self.candidate.plugin.as_ref().ok()
    }
    pub fn score(&self) -> u32 {
        self.plugin().map(|p| p.score).unwrap_or(0)
    }
    pub fn usable(&self) -> bool {
        self.status.is_ok()
    }
    /// The gate's message for `op` when it refused it.
    pub fn refused(&self, op: Op) -> Option<&str> {
        self.status
            .as_ref()
            .ok()?
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, e)| e.as_str())
    }
}

/// Why a plugin cannot be used before any gate runs (score 0 or the ISA cap), if so.
pub fn precheck(p: &Plugin, cap: Caps) -> Option<String> {
    if p.score == 0 {
        if let Some(why) = p.table().unavailable_why() {
            return Some(why);
        }
        let missing = missing_features(p.cpu_features);
        if !missing.is_empty() {
            return Some(format!("CPU lacks {}", missing.join(" ")));
        }
        return Some(format!(
            "CPU lacks the features this backend was built for (library cpu_features {:#x}; this CPU: {})",
            p.cpu_features,
            {
                let on: Vec<&str> = cpu_features().iter().filter(|f| f.1).map(|f| f.0).collect();
                if on.is_empty() { "none detected".to_string() } else { on.join(" ") }
            }
        ));
    }
    cap.excludes(&p.name)
}

/// Assesses every candidate: opened, fit for this CPU, within the ISA cap, through the gate.
/// `gate_names`: gate only these backends (`None` = all); others that would otherwise be usable
/// are reported as "not selected".
pub fn assess(
    candidates: Vec<Candidate>,
    runner: &GateRunner,
    cap: Caps,
    gate_names: Option<&[String]>,
) -> Vec<Assessed> {
    candidates
        .into_iter()
        .map(|c| {
            let status = match &c.plugin {
                Err(e) => Err(e.clone().into()),
                Ok(p) => match precheck(p, cap) {
                    Some(why) => Err(Unusable::Host(why)),
                    None if gate_names.is_some_and(|n| !n.contains(&p.name)) => {
                        Err(Unusable::NotSelected)
                    }
                    None => match gate(&c.path, runner) {
                        Verdict::Ran { failed } => Ok(failed),
                        Verdict::Refused(e) => Err(Unusable::Gate(e)),
                    },
                },
            };
            Assessed {
                candidate: c,
                status,
            }
        })
        .collect()
}

/// Usable native backends in dispatch order: highest score first (stable: discovery order on
/// ties).
pub fn ranked(assessed: &[Assessed]) -> Vec<&Assessed> {
    let mut v: Vec<&Assessed> = assessed.iter().filter(|a| a.usable()).collect();
    v.sort_by(|a, b| b.score().cmp(&a.score()));
    v
}

/// What the host asks of the plugin machinery.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// `--backend-lib` paths.
    pub libs: Vec<PathBuf>,
    pub gate: GateRunner,
    /// No reference fallback: a call no native backend takes is an error.
    pub require_native: bool,
}

/// The backends for a session, in dispatch order, and whether the last one is a fallback.
pub fn select(
    choice: &crate::BackendChoice,
    opts: &PluginOptions,
    pool: &Pool,
) -> Result<(Vec<Backend>, bool)> {
    use crate::BackendChoice;
    let cap = Caps::from_env()?;
    let reference = || Backend::open(&reference::HEADER, pool.host_api());
    if matches!(choice, BackendChoice::Named(n) if n == "reference") {
        if opts.require_native {
            return Err(EngineError::Invalid(
                "--require-native with --backend reference: nothing native to run on".into(),
            ));
        }
        return Ok((vec![reference()?], true));
    }
    let only: Option<Vec<String>> = match choice {
        BackendChoice::Named(n) => Some(vec![n.clone()]),
        BackendChoice::Auto => None,
    };
    let found = discover(&opts.libs);
    // A library the user named that cannot be loaded is an error, not a silent fallback
    // (`mollm devices` lists it with the same reason).
    if let Some(c) = found
        .iter()
        .find(|c| c.origin == Origin::Explicit && c.plugin.is_err())
    {
        let why = c
            .plugin
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        return Err(EngineError::Invalid(format!(
            "--backend-lib {}: {why}",
            c.path.display()
        )));
    }
    let assessed = assess(found, &opts.gate, cap, only.as_deref());
    if let BackendChoice::Named(n) = choice {
        match assessed
            .iter()
            .find(|a| a.plugin().is_some_and(|p| &p.name == n))
        {
            None => {
                let found: Vec<String> = assessed
                    .iter()
                    .filter_map(|a| a.plugin().map(|p| p.name.clone()))
                    .chain(std::iter::once("reference".to_string()))
                    .collect();
                return Err(EngineError::Invalid(format!(
                    "backend '{n}' not found (found: {}; see `mollm devices`)",
                    found.join(", ")
                )));
            }
            Some(a) => {
                if let Err(e) = &a.status {
                    return Err(EngineError::Invalid(format!("backend '{n}': {e}")));
                }
            }
        }
    }
    let mut backends = Vec::new();
    for a in ranked(&assessed) {
        let p = a.plugin().expect("usable means loaded");
        let mut b = p.open_backend(pool.host_api())?;
        for (op, _) in a.status.as_ref().expect("usable") {
            b.refuse(*op);
        }
        backends.push(b);
    }
    if opts.require_native {
        if backends.is_empty() {
            let why: Vec<String> = assessed
                .iter()
                .map(|a| {
                    format!(
                        "{}: {}",
                        a.candidate.name(),
                        a.status
                            .as_ref()
                            .err()
                            .map(|e| e.to_string())
                            .unwrap_or_default()
                    )
                })
                .collect();
            return Err(EngineError::Invalid(format!(
                "--require-native: no usable native backend{}{}",
                if why.is_empty() { " found" } else { ": " },
                why.join("; ")
            )));
        }
        return Ok((backends, false));
    }
    backends.push(reference()?);
    Ok((backends, true))
}
