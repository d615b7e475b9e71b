//! The CPU's features and signature, and the ISA caps (`MOLLM_X86_ISA`, `MOLLM_ARM_ISA`) on
//! which native backends may be selected.

use super::*;

/// CPU features that matter to the native backends, as `(name, detected)`; the names are
/// those of `abi::cpu::FEATURES` (plus a few shown for information).
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
            (
                "avx512bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        vec![
            ("neon", std::arch::is_aarch64_feature_detected!("neon")),
            (
                "dotprod",
                std::arch::is_aarch64_feature_detected!("dotprod"),
            ),
            ("fp16", std::arch::is_aarch64_feature_detected!("fp16")),
            ("i8mm", std::arch::is_aarch64_feature_detected!("i8mm")),
            ("sve", std::arch::is_aarch64_feature_detected!("sve")),
            ("sve2", std::arch::is_aarch64_feature_detected!("sve2")),
        ]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

/// The features a library declares (`cpu_features` bits) that this CPU does not report.
pub fn missing_features(bits: u64) -> Vec<String> {
    let have = cpu_features();
    abi::cpu::feature_names(bits)
        .filter(|n| match n {
            abi::cpu::FeatureName::Known(name) => !have.iter().any(|(h, on)| h == name && *on),
            abi::cpu::FeatureName::Unknown(_) => true,
        })
        .map(|n| n.to_string())
        .collect()
}

/// A short stable name for this CPU's feature set, e.g. `x86_64-03fe`.
pub fn cpu_signature() -> String {
    let bits = cpu_features()
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, (_, on))| acc | ((*on as u64) << i));
    format!("{}-{bits:04x}", std::env::consts::ARCH)
}

/// The ISA caps from `MOLLM_X86_ISA` and `MOLLM_ARM_ISA`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub x86: IsaCap,
    pub arm: ArmIsaCap,
}

impl Caps {
    pub fn from_env() -> Result<Caps> {
        Ok(Caps {
            x86: IsaCap::from_env()?,
            arm: ArmIsaCap::from_env()?,
        })
    }

    /// Why the backend `name` is excluded by a cap, if it is.
    pub fn excludes(self, name: &str) -> Option<String> {
        self.x86.excludes(name).or_else(|| self.arm.excludes(name))
    }
}

/// `neon|i8mm|scalar|auto`: which ARM backends may be selected.
pub const ARM_ISA_ENV: &str = abi::settings::ARM_ISA.name;

/// The `MOLLM_ARM_ISA` cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmIsaCap {
    Scalar,
    Neon,
    I8mm,
    Auto,
}

impl ArmIsaCap {
    pub fn from_env() -> Result<ArmIsaCap> {
        match abi::settings::ARM_ISA.get().as_deref() {
            None | Some("") | Some("auto") => Ok(ArmIsaCap::Auto),
            Some("scalar") => Ok(ArmIsaCap::Scalar),
            Some("neon") => Ok(ArmIsaCap::Neon),
            Some("i8mm") => Ok(ArmIsaCap::I8mm),
            Some(v) => Err(EngineError::Invalid(format!(
                "{ARM_ISA_ENV}={v}: expected scalar, neon, i8mm or auto"
            ))),
        }
    }

    /// Why the backend `name` is excluded by this cap, if it is. Only ARM backends (names
    /// starting with `arm-`) are capped.
    pub fn excludes(self, name: &str) -> Option<String> {
        let n = name.to_ascii_lowercase();
        if !n.starts_with("arm-") {
            return None;
        }
        let (allowed, v) = match self {
            ArmIsaCap::Auto => (true, "auto"),
            ArmIsaCap::Scalar => (false, "scalar"),
            ArmIsaCap::Neon => (n == "arm-neon", "neon"),
            ArmIsaCap::I8mm => (true, "i8mm"),
        };
        (!allowed).then(|| format!("excluded by {ARM_ISA_ENV}={v}"))
    }
}

/// The `MOLLM_X86_ISA` cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaCap {
    Scalar,
    Avx2,
    Avx512,
    Auto,
}

impl IsaCap {
    pub fn from_env() -> Result<IsaCap> {
        match abi::settings::X86_ISA.get().as_deref() {
            None | Some("") | Some("auto") => Ok(IsaCap::Auto),
            Some("scalar") => Ok(IsaCap::Scalar),
            Some("avx2") => Ok(IsaCap::Avx2),
            Some("avx512") => Ok(IsaCap::Avx512),
            Some(v) => Err(EngineError::Invalid(format!(
                "{ISA_ENV}={v}: expected scalar, avx2, avx512 or auto"
            ))),
        }
    }

    /// Why the backend `name` is excluded by this cap, if it is. Only x86 backends (names
    /// containing `x86` or `avx`) are capped.
    pub fn excludes(self, name: &str) -> Option<String> {
        let n = name.to_ascii_lowercase();
        if !(n.contains("x86") || n.contains("avx")) {
            return None;
        }
        let allowed = match self {
            IsaCap::Auto => true,
            IsaCap::Scalar => false,
            IsaCap::Avx2 => n.contains("avx2"),
            IsaCap::Avx512 => n.contains("avx2") || n.contains("avx512"),
        };
        let v = match self {
            IsaCap::Scalar => "scalar",
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx512 => "avx512",
            IsaCap::Auto => "auto",
        };
        (!allowed).then(|| format!("excluded by {ISA_ENV}={v}"))
    }
}
