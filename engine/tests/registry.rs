//! The plugin registry without the CLI: file names, loading refusals, the gate protocol run
//! through this test binary as the child, the ISA cap.

use engine::registry::{self, ArmIsaCap, Caps, GateRunner, IsaCap, Verdict};
use std::path::PathBuf;

/// When this test binary is started as the gate child (see `runner()`), it runs the gate and
/// prints the verdict; otherwise this test does nothing.
#[test]
fn gate_child_entry() {
    if abi::settings::GATE_LIB.get_os().is_some() {
        println!("{}", registry::gate_child(None));
    }
}

fn runner() -> GateRunner {
    GateRunner {
        program: std::env::current_exe().unwrap(),
        args: vec![
            "--exact".into(),
            "gate_child_entry".into(),
            "--nocapture".into(),
        ],
    }
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mollm-registry-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn plugin_file_names() {
    assert!(registry::is_plugin_file_name("libmollm_x86_avx2.so"));
    assert!(!registry::is_plugin_file_name("libmollm_.so"));
    assert!(!registry::is_plugin_file_name(
        "libbroken_backend_for_tests.so"
    ));
    assert!(!registry::is_plugin_file_name("libmollm_x.so.1"));
}

#[test]
fn garbage_and_missing_libraries_are_refused_with_the_reason() {
    let d = scratch("garbage");
    let p = d.join("libmollm_fake.so");
    std::fs::write(&p, b"not an ELF file").unwrap();
    let e = registry::load(&p).err().unwrap().to_string();
    assert!(e.starts_with("cannot load"), "{e}");
    let e = registry::load(&d.join("libmollm_missing.so"))
        .err()
        .unwrap();
    assert_eq!(e, registry::PluginError::NoFile);
    assert_eq!(e.to_string(), "no such file");
    // A real shared library without the entry symbol.
    let libc = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    if let Some(libm) = libc {
        let e = registry::load(&libm).err().unwrap();
        assert_eq!(e, registry::PluginError::NoEntry);
        assert!(
            e.to_string().contains("no mollm_backend_entry symbol"),
            "{e}"
        );
    }
    // The gate child reports the same refusal as a verdict, not a crash.
    let v = runner().run(&p).0;
    assert!(
        matches!(&v, Verdict::Refused(e) if e.starts_with("cannot load")),
        "{v:?}"
    );
}

#[test]
fn explicit_paths_come_first_and_are_deduplicated() {
    let d = scratch("dedupe");
    let p = d.join("libmollm_fake.so");
    std::fs::write(&p, b"x").unwrap();
    let c = registry::discover(&[p.clone(), p.clone()]);
    let mine: Vec<_> = c.iter().filter(|c| c.path == p).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].origin, registry::Origin::Explicit);
}

#[test]
fn isa_cap_rules() {
    assert!(IsaCap::Scalar.excludes("x86-avx2").is_some());
    assert!(IsaCap::Scalar.excludes("test-broken").is_none());
    assert!(IsaCap::Avx2.excludes("x86-avx2").is_none());
    assert!(IsaCap::Avx2.excludes("x86-avx512").is_some());
    assert!(IsaCap::Avx512.excludes("x86-avx512").is_none());
    assert!(IsaCap::Avx512.excludes("x86-avx2").is_none());
    assert!(IsaCap::Auto.excludes("x86-avx512").is_none());
    assert!(
        IsaCap::Scalar.excludes("arm-neon").is_none(),
        "x86 cap leaves ARM alone"
    );
}

#[test]
fn arm_isa_cap_rules() {
    assert!(ArmIsaCap::Scalar.excludes("arm-neon").is_some());
    assert!(ArmIsaCap::Neon.excludes("arm-neon").is_none());
    assert!(ArmIsaCap::Neon.excludes("arm-i8mm").is_some());
    assert!(ArmIsaCap::I8mm.excludes("arm-i8mm").is_none());
    assert!(ArmIsaCap::I8mm.excludes("arm-neon").is_none());
    assert!(ArmIsaCap::Auto.excludes("arm-i8mm").is_none());
    assert!(
        ArmIsaCap::Scalar.excludes("x86-avx2").is_none(),
        "ARM cap leaves x86 alone"
    );
    let caps = Caps {
        x86: IsaCap::Avx2,
        arm: ArmIsaCap::Neon,
    };
    assert!(caps.excludes("x86-avx512").is_some());
    assert!(caps.excludes("arm-i8mm").is_some());
    assert!(caps.excludes("arm-neon").is_none());
}

#[test]
fn missing_features_are_named() {
    // A feature no CPU of the other architecture has is always missing, by name.
    let other = if cfg!(target_arch = "aarch64") {
        abi::cpu::X86_AVX2
    } else {
        abi::cpu::ARM_I8MM
    };
    let m = registry::missing_features(other | (1 << 50));
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0] == "avx2" || m[0] == "i8mm", "{m:?}");
    assert_eq!(m[1], "bit 50");
    assert!(registry::missing_features(0).is_empty());
}

#[test]
fn cpu_signature_is_stable() {
    assert_eq!(registry::cpu_signature(), registry::cpu_signature());
    assert!(registry::cpu_signature().starts_with(std::env::consts::ARCH));
}
