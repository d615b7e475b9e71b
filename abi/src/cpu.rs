//! Bits of [`crate::BackendHeader::cpu_features`]: the CPU features a backend library's
//! kernels use, declared once here so the host can name what a CPU lacks ("arm-i8mm: CPU
//! lacks i8mm") for any backend, whichever team built it. Append-only: a bit never changes
//! meaning.

pub const X86_AVX2: u64 = 1 << 0;
pub const X86_FMA: u64 = 1 << 1;
pub const X86_F16C: u64 = 1 << 2;
pub const X86_AVX512F: u64 = 1 << 3;
pub const X86_AVX512BW: u64 = 1 << 4;
pub const X86_AVX512VL: u64 = 1 << 5;
pub const X86_AVX512VNNI: u64 = 1 << 6;

/// AArch64 Advanced SIMD (every AArch64 CPU has it).
pub const ARM_NEON: u64 = 1 << 16;
/// SDOT/UDOT (Armv8.2 dotprod).
pub const ARM_DOTPROD: u64 = 1 << 17;
/// Half-precision arithmetic (Armv8.2 FP16).
pub const ARM_FP16: u64 = 1 << 18;
/// SMMLA/UMMLA int8 matrix multiply (Armv8.6 i8mm).
pub const ARM_I8MM: u64 = 1 << 19;

/// Every bit with the name the operating system (`/proc/cpuinfo`, Rust's feature detection)
/// gives the feature.
pub const FEATURES: &[(u64, &str)] = &[
    (X86_AVX2, "avx2"),
    (X86_FMA, "fma"),
    (X86_F16C, "f16c"),
    (X86_AVX512F, "avx512f"),
    (X86_AVX512BW, "avx512bw"),
    (X86_AVX512VL, "avx512vl"),
    (X86_AVX512VNNI, "avx512vnni"),
    (ARM_NEON, "neon"),
    (ARM_DOTPROD, "dotprod"),
    (ARM_FP16, "fp16"),
    (ARM_I8MM, "i8mm"),
];

/// Names of the features set in `bits`, in [`FEATURES`] order; unknown bits as `bit N`.
pub fn feature_names(bits: u64) -> impl Iterator<Item = FeatureName> {
    (0..64u32)
        .filter(move |i| bits & (1u64 << i) != 0)
        .map(|i| match FEATURES.iter().find(|(b, _)| *b == 1u64 << i) {
            Some((_, n)) => FeatureName::Known(n),
            None => FeatureName::Unknown(i),
        })
}

/// A feature bit's name, or its number when this build does not know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureName {
    Known(&'static str),
    Unknown(u32),
}

impl core::fmt::Display for FeatureName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FeatureName::Known(n) => f.write_str(n),
            FeatureName::Unknown(i) => write!(f, "bit {i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_distinct_and_named_once() {
        let mut all = 0u64;
        for (b, _) in FEATURES {
            assert_eq!(b.count_ones(), 1);
            assert_eq!(all & b, 0, "bit {b:#x} declared twice");
            all |= b;
        }
        let names: Vec<String> = feature_names(ARM_NEON | ARM_I8MM | (1 << 40))
            .map(|n| n.to_string())
            .collect();
        assert_eq!(names, ["neon", "i8mm", "bit 40"]);
    }
}
