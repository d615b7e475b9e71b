//! llama.cpp's GBNF grammars, rewritten into llguidance's Lark syntax so the one matcher runs
//! both. GBNF: rules `name ::= ...` (a rule runs until the next `name ::=`), `root` the start,
//! strings in quotes, character classes `[...]` and `[^...]`, `.`, groups, `|`, `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`, `{,n}`, comments from `#`. Each rule becomes a Lark rule of its own
//! (`g_` + the name, `-` as `_`), strings JSON-quoted, classes and `.` regex terminals.

use std::collections::BTreeMap;

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// The string's characters (escapes resolved).
    Str(String),
    /// A class as a Rust regex (`[...]`).
    Class(String),
    Dot,
    /// `(`, `)`, `|`, `*`, `+`, `?`, or a `{m,n}` repeat, as written.
    Op(String),
}

/// The GBNF escape after a backslash (`\n`, `\xHH`, `\uHHHH`, ...): the character, and how
/// many bytes of `rest` it used.
fn escape(rest: &str, at: usize) -> Result<(char, usize), String> {
    let mut it = rest.chars();
    let c = it
        .next()
        .ok_or_else(|| format!("at byte {at}: a backslash at the end"))?;
    let hex = |n: usize| -> Result<(char, usize), String> {
        let h = rest
            .get(1..1 + n)
            .ok_or_else(|| format!("at byte {at}: a short \\{c} escape"))?;
        let v = u32::from_str_radix(h, 16)
            .map_err(|_| format!("at byte {at}: '\\{c}{h}' is not hex"))?;
        let ch =
            char::from_u32(v).ok_or_else(|| format!("at byte {at}: U+{v:X} is not a character"))?;
        Ok((ch, 1 + n))
    };
    Ok(match c {
        'n' => ('\n', 1),
        't' => ('\t', 1),
        'r' => ('\r', 1),
        'x' => return hex(2),
        'u' => return hex(4),
        'U' => return hex(8),
        c => (c, c.len_utf8()),
    })
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    let b = src.as_bytes();
    while i < b.len() {
        let c = src[i..].chars().next().unwrap_or(' ');
        match c {
            '#' => i += src[i..].find('\n').unwrap_or(src.len() - i),
            c if c.is_whitespace() => i += c.len_utf8(),
            ':' if src[i..].starts_with("::=") => {
                out.push(Tok::Defines);
                i += 3;
            }
            '"' => {
                let (mut s, mut j) = (String::new(), i + 1);
                loop {
                    let Some(c) = src[j..].chars().next() else {
                        return Err(format!("at byte {i}: a string that does not end"));
                    };
                    match c {
                        '"' => break,
                        '\\' => {
                            let (ch, n) = escape(&src[j + 1..], j)?;
                            s.push(ch);
                            j += 1 + n;
                        }
                        c => {
                            s.push(c);
                            j += c.len_utf8();
                        }
                    }
                }
                out.push(Tok::Str(s));
                i = j + 1;
            }
            '[' => {
                let (mut s, mut j) = (String::from("["), i + 1);
                if src[j..].starts_with('^') {
                    s.push('^');
                    j += 1;
                }
                loop {
                    let Some(c) = src[j..].chars().next() else {
                        return Err(format!("at byte {i}: a character class that does not end"));
                    };
                    let (ch, n, escaped) = match c {
                        ']' => break,
                        '\\' => {
                            let (ch, n) = escape(&src[j + 1..], j)?;
                            (ch, 1 + n, true)
                        }
                        c => (c, c.len_utf8(), false),
                    };
                    // A '-' between two characters is a range; everything else is literal.
                    if ch == '-'
                        && !escaped
                        && !s.ends_with('[')
                        && !s.ends_with('^')
                        && !src[j + 1..].starts_with(']')
                    {
                        s.push('-');
                    } else {
                        s.push_str(&format!("\\x{{{:X}}}", ch as u32));
                    }
                    j += n;
                }
                s.push(']');
                out.push(Tok::Class(s));
                i = j + 1;
            }
            '.' => {
                out.push(Tok::Dot);
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = src[i..]
                    .find('}')
                    .ok_or_else(|| format!("at byte {i}: a repeat '{{' that does not end"))?;
                let inner: String = src[i + 1..i + end]
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let ok = !inner.is_empty()
                    && inner.chars().all(|c| c.is_ascii_digit() || c == ',')
                    && inner.matches(',').count() <= 1;
                if !ok {
                    return Err(format!("at byte {i}: '{{{inner}}}' is not a repeat count"));
                }
                // Lark has no {,n}: it is {0,n}.
                let inner = if inner.starts_with(',') {
                    format!("0{inner}")
                } else {
                    inner
                };
                out.push(Tok::Op(format!("{{{inner}}}")));
                i += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let len = src[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                    .unwrap_or(src.len() - i);
                out.push(Tok::Name(src[i..i + len].to_string()));
                i += len;
            }
            c => return Err(format!("at byte {i}: unexpected '{c}'")),
        }
    }
    Ok(out)
}

fn lark_name(n: &str) -> String {
    format!("g_{}", n.to_ascii_lowercase().replace('-', "_"))
}

/// The Lark grammar a GBNF grammar means; errors name the byte offset or the rule.
pub fn to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    let mut rules: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    let mut order = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (Some(Tok::Name(name)), Some(Tok::Defines)) = (toks.get(i), toks.get(i + 1)) else {
            return Err(format!(
                "expected 'name ::=' to start a rule, found {:?}",
                toks[i]
            ));
        };
        i += 2;
        let mut body = Vec::new();
        while i < toks.len()
            && !matches!(
                (toks.get(i), toks.get(i + 1)),
                (Some(Tok::Name(_)), Some(Tok::Defines))
            )
        {
            body.push(match &toks[i] {
                Tok::Name(n) => lark_name(n),
                Tok::Str(s) => serde_json::to_string(s).unwrap_or_default(),
                Tok::Class(c) => format!("/{c}/"),
                Tok::Dot => "/(?s:.)/".to_string(),
                Tok::Op(o) => o.clone(),
                Tok::Defines => unreachable!("a rule boundary"),
            });
            i += 1;
        }
        if body.is_empty() {
            return Err(format!("rule '{name}' is empty"));
        }
        let key = lark_name(name);
        if let Some((other, _)) = rules.get(&key) {
            return Err(format!(
                "rules '{other}' and '{name}' have the same name here"
            ));
        }
        order.push(key.clone());
        rules.insert(key, (name.clone(), body));
    }
    if !rules.contains_key("g_root") {
        return Err("the grammar has no 'root' rule".into());
    }
    let mut out = String::from("start: g_root\n");
    for k in order {
        let (_, body) = &rules[&k];
        out.push_str(&format!("{k}: {}\n", body.join(" ")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn rules_strings_classes_and_repeats_are_rewritten() {
        let g = r#"
            # yes or no, or a number
            root ::= answer ("\n" answer)?
            answer ::= "yes" | "no" | num
            num ::= [1-9] [0-9]{0,2} | "0"
            ws-x ::= [ \t\n]* "\x41" .
        "#;
        let l = to_lark(g).unwrap();
        assert!(l.starts_with("start: g_root\n"), "{l}");
        assert!(l.contains(r#"g_root: g_answer ( "\n" g_answer ) ?"#), "{l}");
        assert!(
            l.contains("g_num: /[\\x{31}-\\x{39}]/ /[\\x{30}-\\x{39}]/ {0,2} | \"0\""),
            "{l}"
        );
        assert!(
            l.contains(r#"g_ws_x: /[\x{20}\x{9}\x{A}]/ * "A" /(?s:.)/"#),
            "{l}"
        );
    }

    /// Random text over GBNF's characters (and multibyte ones) gives a grammar or an error,
    /// never a panic.
    #[test]
    fn random_text_never_panics() {
        let alphabet: Vec<char> = "root ::= \"\\[]^-().|*+?{},0123456789#\nxuU é→"
            .chars()
            .collect();
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..5000 {
            let mut g = String::from("root ::= ");
            for _ in 0..(s % 40) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                g.push(alphabet[(s % alphabet.len() as u64) as usize]);
            }
            let _ = to_lark(&g);
        }
    }

    #[test]
    fn bad_grammars_are_named() {
        assert!(to_lark("root ::= \"abc")
            .unwrap_err()
            .contains("does not end"));
        assert!(to_lark("x ::= \"a\"").unwrap_err().contains("no 'root'"));
        assert!(to_lark("root ::= a{x}")
            .unwrap_err()
            .contains("repeat count"));
        assert!(to_lark("root ::= \"a\" ; ")
            .unwrap_err()
            .contains("unexpected ';'"));
        assert!(to_lark("root ::= ").unwrap_err().contains("empty"));
        assert!(to_lark("\"a\" ::= b")
            .unwrap_err()
            .contains("expected 'name ::='"));
    }
}
