//! One error type for everything the loader reads. Every message names the file it came from,
//! because the engine may load several models and a bare "truncated" is useless in a log.

use std::path::Path;

/// Every text field is shown through [`printable`]: a corrupted or hostile file can put any
/// bytes into a key name or a string, and an error message must not carry raw control bytes
/// (terminal escapes) to a terminal or a log.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or mapped.
    #[error("{}: {source}", printable(.file))]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid GGUF file (bad magic, truncation, absurd sizes, bad ids...).
    #[error("{}: {}", printable(.file), printable(.msg))]
    Format { file: String, msg: String },
    /// A metadata key is present but has the wrong type or an invalid value.
    #[error("{}: metadata key '{}': {}", printable(.file), printable(.key), printable(.msg))]
    Metadata {
        file: String,
        key: String,
        msg: String,
    },
    /// The vocabulary cannot be turned into a tokenizer, or encoding failed.
    #[error("{}: tokenizer: {}", printable(.file), printable(.msg))]
    Tokenizer { file: String, msg: String },
    /// The chat template does not compile or failed to render.
    #[error("{}: chat template: {}", printable(.file), printable(.msg))]
    Template { file: String, msg: String },
}

/// `s` with control characters (C0, DEL, C1: terminal escapes, NUL, newlines) written as
/// `\u{..}` escapes; borrowed when there are none.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.into()
}

pub(crate) fn file_label(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_bytes_in_messages_are_escaped() {
        assert_eq!(printable("plain 'text' é"), "plain 'text' é");
        let e = LoadError::Metadata {
            file: "m\u{1b}[2J.gguf".into(),
            key: "general.\u{0}arch\u{9b}".into(),
            msg: "bad\nvalue\u{7f}".into(),
        }
        .to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(
            e.contains("\\u{1b}[2J") && e.contains("\\u{0}") && e.contains("\\u{a}"),
            "{e}"
        );
    }
}
