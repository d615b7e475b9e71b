//! Any byte string given as a `.mollm` package must parse or fail with an error: never panic,
//! and every accepted tensor must lie inside the image.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((_, tensors)) = loader::package::parse(data, "fuzz.mollm") {
        for t in tensors {
            let span = t.span().expect("an accepted tensor has a span");
            assert!(t.offset + span <= data.len() as u64);
        }
    }
});
