//! Tool calls read while they are written: where each call's name and arguments are in the
//! text so far, so that a stream sends `delta.tool_calls` as the model writes the arguments
//! (OpenAI's shape: a call's id, type and name first, then fragments of its arguments), not
//! all at the end.

use super::tools::Dialect;

/// One call found in the text so far.
#[derive(Debug, Default, PartialEq)]
pub struct Partial {
    /// Its `name`, once the string is complete.
    pub name: Option<String>,
    /// Its arguments (an object or array): the byte offset where the value starts, and where
    /// it ends (`None` while it is still being written: it runs to the text's end).
    pub args: Option<(usize, Option<usize>)>,
}

/// The calls in `text` (from where calls may begin: the stream's held text), laid out as
/// `d` writes them, or as a bare JSON call (what small models often write instead).
pub fn scan(text: &str, d: Dialect) -> Vec<Partial> {
    let marker = match d {
        Dialect::Hermes => Some("<tool_call>"),
        Dialect::Mistral => Some("[TOOL_CALLS]"),
        Dialect::Llama3 | Dialect::Generic => None,
    };
    let mut out = Vec::new();
    if let Some(m) = marker.filter(|m| text.contains(m)) {
        let mut at = 0;
        while let Some(i) = text[at..].find(m) {
            let start = at + i + m.len();
            let end = match d {
                Dialect::Hermes => text[start..]
                    .find("</tool_call>")
                    .map_or(text.len(), |j| start + j),
                _ => text.len(),
            };
            region(text, start, end, &mut out);
            at = end;
        }
        return out;
    }
    let lead = text.len() - text.trim_start().len();
    let mut start = lead;
    for prefix in ["<|python_tag|>", "```json", "```"] {
        if text[start..].starts_with(prefix) {
            start += prefix.len();
            break;
        }
    }
    region(text, start, text.len(), &mut out);
    out
}

/// `json` without the whitespace between its tokens (strings kept as written): the
/// arguments' text as sent, streamed or not. Each prefix's result is a prefix of the whole's,
/// so a stream sends what the text adds.
pub fn compact(json: &str) -> String {
    let (mut in_str, mut esc) = (false, false);
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if in_str {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if matches!(c, ' ' | '\t' | '\n' | '\r') {
            continue;
        }
        out.push(c);
    }
    out
}

/// The calls of one region `text[start..end]`: a call object, or an array of them.
fn region(text: &str, start: usize, end: usize, out: &mut Vec<Partial>) {
    let b = &text.as_bytes()[..end];
    let Some(first) = (start..end).find(|&i| !b[i].is_ascii_whitespace()) else {
        return;
    };
    // Depth at which call objects open: 0 for a bare object, 1 inside an array.
    let cd = match b[first] {
        b'{' => 0,
        b'[' => 1,
        _ => return,
    };
    let mut depth = 0usize;
    let (mut in_str, mut esc, mut str_at) = (false, false, 0);
    let mut cur: Option<Partial> = None;
    // At the call object's own level: the last key, and whether its value comes next.
    let (mut key, mut value_next) = (String::new(), false);
    let mut args_depth: Option<usize> = None;
    for i in first..end {
        let c = b[i];
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
                if depth == cd + 1 {
                    let s: String = serde_json::from_str(&text[str_at..=i]).unwrap_or_default();
                    match (value_next, cur.as_mut()) {
                        (false, _) => key = s,
                        (true, Some(p)) if key == "name" => p.name = Some(s),
                        _ => {}
                    }
                    value_next = false;
                }
            }
            continue;
        }
        match c {
            b'"' => {
                in_str = true;
                str_at = i;
            }
            b'{' | b'[' => {
                if depth == cd && c == b'{' {
                    cur = Some(Partial::default());
                    (key, value_next) = (String::new(), false);
                } else if depth == cd + 1
                    && value_next
                    && (key == "arguments" || key == "parameters")
                {
                    if let Some(p) = cur.as_mut() {
                        p.args = Some((i, None));
                        args_depth = Some(depth);
                    }
                    value_next = false;
                }
                depth += 1;
            }
            b'}' | b']' => {
                if depth == 0 {
                    return;
                }
                depth -= 1;
                if args_depth == Some(depth) {
                    if let Some((s, _)) = cur.as_ref().and_then(|p| p.args) {
                        cur.as_mut().expect("args of a call").args = Some((s, Some(i + 1)));
                    }
                    args_depth = None;
                }
                if depth == cd && c == b'}' {
                    out.extend(cur.take());
                }
                if depth < cd || (depth == 0 && cd == 0) {
                    return;
                }
            }
            b':' if depth == cd + 1 => value_next = true,
            b',' if depth == cd + 1 => value_next = false,
            _ => {}
        }
    }
    // A call still being written.
    out.extend(cur);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments' text of each call, as far as written.
    fn args(text: &str, d: Dialect) -> Vec<(Option<String>, Option<String>, bool)> {
        scan(text, d)
            .into_iter()
            .map(|p| {
                let a = p
                    .args
                    .map(|(s, e)| text[s..e.unwrap_or(text.len())].to_string());
                let done = p.args.is_some_and(|(_, e)| e.is_some());
                (p.name, a, done)
            })
            .collect()
    }

    #[test]
    fn calls_are_found_as_they_are_written() {
        let full = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\", \"d\": [1, {\"x\": 2}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
        let want_args = "{\"city\": \"Pa}ris\", \"d\": [1, {\"x\": 2}]}";
        let got = args(full, Dialect::Hermes);
        assert_eq!(
            got,
            vec![
                (Some("get_weather".into()), Some(want_args.into()), true),
                (Some("add".into()), Some("{}".into()), true)
            ]
        );
        // Every prefix: the arguments so far are a prefix of the whole, never past it.
        for n in 0..=full.len() {
            if !full.is_char_boundary(n) {
                continue;
            }
            for (k, (name, a, _)) in args(&full[..n], Dialect::Hermes).into_iter().enumerate() {
                if let Some(a) = a {
                    assert!(name.is_some(), "{n}: arguments before the name");
                    let whole = [want_args, "{}"][k];
                    assert!(whole.starts_with(&a), "{n}: {a:?}");
                }
            }
        }
        // Mistral's array, Llama 3's tag, a bare object with escapes in the name's value.
        let m = args(
            r#"[TOOL_CALLS][{"name": "a", "arguments": {"q": 1}}, {"name": "b", "arguments": {}}]"#,
            Dialect::Mistral,
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[1], (Some("b".into()), Some("{}".into()), true));
        let l = args(
            r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}"#,
            Dialect::Llama3,
        );
        assert_eq!(l[0].1.as_deref(), Some(r#"{"city": "Oslo"}"#));
        let g = args(
            r#"{"name": "a\"b", "arguments": {"k": "v"#,
            Dialect::Generic,
        );
        assert_eq!(
            g,
            vec![(Some("a\"b".into()), Some(r#"{"k": "v"#.into()), false)]
        );
        // Arguments as a string are not streamed; plain text has no calls.
        assert_eq!(
            args(r#"{"name": "a", "arguments": "{}"}"#, Dialect::Generic)[0].1,
            None
        );
        assert!(scan("The weather is fine.", Dialect::Hermes).is_empty());
        assert!(scan("", Dialect::Generic).is_empty());
    }

    #[test]
    fn compact_text_drops_only_whitespace_between_tokens() {
        let raw = "{ \"a b\": [1, 2],\n \"c\": \"x \\\" y\" }";
        assert_eq!(compact(raw), "{\"a b\":[1,2],\"c\":\"x \\\" y\"}");
        let whole = compact(raw);
        for n in 0..=raw.len() {
            assert!(whole.starts_with(&compact(&raw[..n])), "{n}");
        }
    }
}
