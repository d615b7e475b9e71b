//! Tells the native-backend test (`tests/native.rs`) which target it is compiled for, so that
//! it builds the backend libraries for the same one (a cross build: `--target`).

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=CONFORMANCE_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
