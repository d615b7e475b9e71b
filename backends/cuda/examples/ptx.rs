//! Writes the cuda backend's kernels as PTX for each architecture in `kernels::ARCHS`
//! (`OUT/<file>-<arch>.ptx`), with NVRTC, for a machine that has the CUDA driver but no NVRTC
//! (scripts/build-cuda-ptx.sh runs it).
//!
//!     cargo run --release -p mollm-cuda --example ptx -- OUT_DIR

use mollm_cuda::{kernels, nvrtc};

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: ptx OUT_DIR");
        std::process::exit(2)
    });
    if let Err(e) = run(std::path::Path::new(&out)) {
        eprintln!("ptx: {e}");
        std::process::exit(1);
    }
}

fn run(out: &std::path::Path) -> Result<(), String> {
    eprintln!("{}", nvrtc::describe()?);
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (file, _, _) in kernels::FILES {
        let src = kernels::source(file).expect("listed");
        for arch in kernels::ARCHS {
            let ptx = nvrtc::ptx(file, &src, arch)?;
            let p = out.join(format!("{}-{arch}.ptx", file.trim_end_matches(".cu")));
            std::fs::write(&p, ptx).map_err(|e| format!("{}: {e}", p.display()))?;
            println!("{}", p.display());
        }
    }
    Ok(())
}
