//! The conformance gate on the native backends (x86 and ARM) built by this workspace
//! (`cargo build --release --workspace` puts them next to `mollm`). Both tiers are checked
//! whatever MOLLM_X86_ISA says; a backend this CPU cannot run (score 0) is skipped with a note.

use std::path::PathBuf;

fn lib_dir() -> PathBuf {
    // target/<profile>/deps/<test binary> -> target/<profile>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn check(lib_name: &str) {
    let file = format!(
        "{}{lib_name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let path = lib_dir().join(&file);
    assert!(
        path.exists(),
        "{} not built (run cargo build --release --workspace first)",
        path.display()
    );
    // SAFETY: a library of this workspace, built from this source tree.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let entry: libloading::Symbol<extern "C" fn() -> *const abi::BackendHeader> =
        unsafe { lib.get(abi::ENTRY_SYMBOL) }.unwrap();
    // SAFETY: the entry returns a pointer to a static header.
    let header = unsafe { &*entry() };
    header.check_layout().unwrap();
    let table = unsafe { &*header.table };
    if table.score.map(|s| s()).unwrap_or(0) == 0 {
        eprintln!("SKIP {lib_name}: this CPU cannot run it");
        return;
    }
    let host = reference::scoped_threads_host(2);
    let failures = conformance::check_backend(table, &host, 16).unwrap();
    assert!(
        failures.is_empty(),
        "{lib_name} fails the gate: {failures:?}"
    );
    // It must declare something, or the gate proves nothing.
    let inst = conformance::Instance::open(table, &host).unwrap();
    let declared = abi::Op::ALL.iter().filter(|&&op| {
        (0..16).any(|seed| {
            let mut c = conformance::cases::case(op, seed);
            let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
            let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
            let call = abi::OpCall::new(op, &ins, &outs, c.params);
            table
                .supports
                .map(|f| f(inst.ctx, &call) == abi::Status::Ok as i32)
                .unwrap_or(true)
        })
    });
    assert!(declared.count() > 0, "{lib_name} declares no op");
}

#[test]
fn x86_avx2_conforms() {
    check("mollm_x86_avx2");
}

#[test]
fn x86_avx512_conforms() {
    check("mollm_x86_avx512");
}

#[test]
fn arm_neon_conforms() {
    check("mollm_arm_neon");
}

#[test]
fn arm_i8mm_conforms() {
    check("mollm_arm_i8mm");
}
