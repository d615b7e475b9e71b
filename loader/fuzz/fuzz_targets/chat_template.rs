//! Any text as a chat template (the part before the first NUL byte; the rest is one user
//! message): compiling and rendering end with a text or an error, never a panic, within the
//! fuel, and the output never passes the byte cap the caller gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::{ChatMessage, ChatTemplate};

const CAP: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (src, content) = text.split_once('\0').unwrap_or((&text, "Hi!"));
    let Ok(t) = ChatTemplate::new(src, "<s>", "</s>", "fuzz.gguf") else {
        return;
    };
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", content),
    ];
    if let Ok(Some(out)) = t.render_limited(&msgs, true, CAP) {
        assert!(out.len() <= CAP);
    }
});
