//! Any byte string must parse or fail with an error: never panic, never allocate from an
//! unchecked count, and every accepted tensor range must lie inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = loader::ModelFile::from_bytes("fuzz.gguf", data.to_vec()) {
        for t in &f.tensors {
            assert_eq!(f.tensor_data(t).len() as u64, t.size);
        }
        let _ = f.architecture();
        // A vocabulary that parsed must also be safe to build a tokenizer from.
        if let Ok(tok) = loader::Tokenizer::from_gguf(&f) {
            let _ = tok.encode("Hello <|im_start|> wörld 🦙", true, true);
        }
    }
});
