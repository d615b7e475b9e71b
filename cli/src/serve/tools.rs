//! Tool calls: the request's `tools` and `tool_choice` checked into [`Tools`], rendered by the
//! model's own chat template (its tool section), and the model's output read back into calls
//! in the template's dialect (Hermes / Qwen `<tool_call>` JSON, Llama 3.x JSON, Mistral
//! `[TOOL_CALLS]`, or a bare JSON object naming a tool). With `required` or a named function
//! the output is constrained ([`Tools::forced`]): it is a call, and its arguments validate
//! against the function's schema.

use super::error::ApiError;
use serde_json::{json, Value};

#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    Auto,
    None,
    Required,
    Named(String),
}

#[derive(Clone, Debug)]
pub struct Tools {
    /// As templates read them: `{"type": "function", "function": {name, description,
    /// parameters}}`.
    pub list: Vec<Value>,
    pub choice: Choice,
    pub parallel: bool,
}

/// How a template asks the model to write calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen 2.5/3).
    Hermes,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.
    Mistral,
    /// `{"name": ..., "parameters": {...}}` (Llama 3.x).
    Llama3,
    /// A bare `{"name": ..., "arguments": {...}}`.
    Generic,
}

impl Dialect {
    pub fn of_template(src: &str) -> Dialect {
        if src.contains("<tool_call>") {
            Dialect::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            Dialect::Mistral
        } else if src.contains("<|python_tag|>") || src.contains("Environment: ipython") {
            Dialect::Llama3
        } else {
            Dialect::Generic
        }
    }

    fn args_key(self) -> &'static str {
        match self {
            Dialect::Llama3 => "parameters",
            _ => "arguments",
        }
    }
}

/// One call read from the output.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; None when no tools are given (then
/// `tool_choice` may only be `none` or `auto`).
pub fn parse(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::field("tools", "must be a list of tools")),
    };
    let mut out = Vec::with_capacity(list.len());
    let mut names: Vec<String> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = |k: &str| format!("tools[{i}].{k}");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::field(&at("type"), "must be \"function\""));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::field(&at("function"), "required (an object)"))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        if !valid_name(name) {
            return Err(ApiError::field(
                &at("function.name"),
                "must be 1-64 letters, digits, '_', '-' or '.'",
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(ApiError::field(
                &at("function.name"),
                format!("'{name}' is given twice"),
            ));
        }
        if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
            if !d.is_string() {
                return Err(ApiError::field(
                    &at("function.description"),
                    "must be a string",
                ));
            }
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => {
                grammar::check_schema(p)
                    .map_err(|e| ApiError::field(&at("function.parameters"), format!("at {e}")))?;
                p.clone()
            }
            Some(_) => {
                return Err(ApiError::field(
                    &at("function.parameters"),
                    "must be a JSON schema (an object)",
                ))
            }
        };
        let mut fun = f.clone();
        fun.insert("parameters".into(), params);
        out.push(json!({"type": "function", "function": Value::Object(fun)}));
        names.push(name.to_string());
    }
    let choice = match choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => Choice::None,
            "required" => Choice::Required,
            _ => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("'{s}' is not one of auto, none, required, or a function"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let n = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::field("tool_choice.function.name", "required"))?;
            if !names.iter().any(|x| x == n) {
                return Err(ApiError::field(
                    "tool_choice.function.name",
                    format!("'{n}' is not one of the request's tools"),
                ));
            }
            Choice::Named(n.to_string())
        }
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "must be a string or an object",
            ))
        }
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::field(
                "parallel_tool_calls",
                "must be true or false",
            ))
        }
    };
    if out.is_empty() {
        if matches!(choice, Choice::Required | Choice::Named(_)) {
            return Err(ApiError::field("tool_choice", "needs 'tools'"));
        }
        return Ok(None);
    }
    Ok(Some(Tools {
        list: out,
        choice,
        parallel,
    }))
}

/// An assistant message's `tool_calls` for the template: arguments as objects.
pub fn message_calls(v: &Value, at: &str) -> Result<Vec<Value>, ApiError> {
    let a = v
        .as_array()
        .ok_or_else(|| ApiError::field(at, "must be a list of calls"))?;
    a.iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| ApiError::field(&format!("{at}[{i}].function"), "required"))?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::field(&format!("{at}[{i}].function.name"), "required (a string)")
            })?;
            let args = match f.get("arguments") {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => json!({}),
            };
            let mut call =
                json!({"type": "function", "function": {"name": name, "arguments": args}});
            if let Some(id) = c.get("id").and_then(Value::as_str) {
                call["id"] = json!(id);
            }
            Ok(call)
        })
        .collect()
}

impl Tools {
    pub fn names(&self) -> Vec<&str> {
        self.list
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect()
    }

    /// What the template is given: none when the choice is `none` (the model is not told of
    /// tools it may not call).
    pub fn for_template(&self) -> Option<Value> {
        (self.choice != Choice::None).then(|| Value::Array(self.list.clone()))
    }

    /// The grammar (llguidance's Lark) a `required` or named choice constrains the output
    /// to: one call (several when parallel calls are allowed) in `dialect`, each a JSON
    /// object whose arguments validate against the function's parameters. `special(text)`
    /// says how to write a marker (a quoted string, or `<text>` when it is a control token).
    pub fn forced(&self, d: Dialect, special: impl Fn(&str) -> String) -> Option<String> {
        let allowed: Vec<&Value> = match &self.choice {
            Choice::Required => self.list.iter().collect(),
            Choice::Named(n) => self
                .list
                .iter()
                .filter(|t| t["function"]["name"] == n.as_str())
                .collect(),
            _ => return None,
        };
        let key = d.args_key();
        let one: Vec<Value> = allowed
            .iter()
            .map(|t| {
                let f = &t["function"];
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]}, key: f["parameters"]},
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let compact =
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        let call = json!({"anyOf": one, "x-guidance": compact});
        // More calls only where parallel calls are allowed.
        let more = if self.parallel {
            " (\"\\n\" call)*"
        } else {
            ""
        };
        Some(match d {
            Dialect::Hermes => format!(
                "start: call{more}\ncall: {} \"\\n\" %json {} \"\\n\" {}\n",
                special("<tool_call>"),
                call,
                special("</tool_call>")
            ),
            Dialect::Mistral => {
                let max = if self.parallel { json!(null) } else { json!(1) };
                let mut arr = json!({"type": "array", "items": {"anyOf": one}, "minItems": 1, "x-guidance": compact});
                if !max.is_null() {
                    arr["maxItems"] = max;
                }
                format!("start: {} %json {}\n", special("[TOOL_CALLS]"), arr)
            }
            Dialect::Llama3 | Dialect::Generic => format!("start: %json {call}\n"),
        })
    }

    /// The calls in `text` (the content before them, and the calls), or None when it has
    /// none naming one of the tools. A bare JSON call is taken in every dialect: small models
    /// often leave out the tags their template asks for.
    pub fn read(&self, text: &str, d: Dialect) -> Option<(String, Vec<Call>)> {
        self.read_as(text, d)
            .or_else(|| self.read_as(text, Dialect::Generic))
    }

    fn read_as(&self, text: &str, d: Dialect) -> Option<(String, Vec<Call>)> {
        let names = self.names();
        let call_of = |v: &Value| -> Option<Call> {
            let name = v.get("name")?.as_str()?;
            if !names.contains(&name) {
                return None;
            }
            let args = v
                .get("arguments")
                .or_else(|| v.get("parameters"))
                .cloned()
                .unwrap_or(json!({}));
            let arguments = match args {
                Value::String(s) => s,
                v => v.to_string(),
            };
            Some(Call {
                name: name.to_string(),
                arguments,
            })
        };
        let calls_in = |v: Value| -> Vec<Call> {
            match v {
                Value::Array(a) => a.iter().filter_map(call_of).collect(),
                v => call_of(&v).into_iter().collect(),
            }
        };
        let (content, calls) = match d {
            Dialect::Hermes => {
                let start = text.find("<tool_call>")?;
                let mut calls = Vec::new();
                for part in text[start..].split("<tool_call>").skip(1) {
                    let body = part.split("</tool_call>").next().unwrap_or("");
                    calls.extend(json_values(body).into_iter().flat_map(calls_in));
                }
                (text[..start].trim().to_string(), calls)
            }
            Dialect::Mistral => {
                let start = text.find("[TOOL_CALLS]")?;
                let body = &text[start + "[TOOL_CALLS]".len()..];
                let calls = json_values(body).into_iter().flat_map(calls_in).collect();
                (text[..start].trim().to_string(), calls)
            }
            Dialect::Llama3 | Dialect::Generic => {
                let t = text.trim_start().trim_start_matches("<|python_tag|>");
                let t = t
                    .strip_prefix("```json")
                    .or_else(|| t.strip_prefix("```"))
                    .map_or(t, |x| x.trim_end().trim_end_matches("```"));
                let t = t.trim();
                if !t.starts_with('{') && !t.starts_with('[') {
                    return None;
                }
                let calls: Vec<Call> = json_values(t).into_iter().flat_map(calls_in).collect();
                (String::new(), calls)
            }
        };
        (!calls.is_empty()).then_some((content, calls))
    }

    /// Where in `text` calls may have begun (what a stream holds back): the first marker of
    /// the dialect, or the start when the output opens with JSON; a tail that could be the
    /// start of a marker is held too.
    pub fn hold_from(&self, text: &str, d: Dialect) -> usize {
        let marker = match d {
            Dialect::Hermes => "<tool_call>",
            Dialect::Mistral => "[TOOL_CALLS]",
            Dialect::Llama3 | Dialect::Generic => "",
        };
        let lead = text.len() - text.trim_start().len();
        let opener = text[lead..]
            .chars()
            .next()
            .is_some_and(|c| matches!(c, '{' | '[' | '`' | '<'));
        if opener || text.trim().is_empty() {
            return 0;
        }
        if marker.is_empty() {
            return text.len();
        }
        if let Some(i) = text.find(marker) {
            return i;
        }
        // The longest tail that is a prefix of the marker.
        (1..marker.len().min(text.len()) + 1)
            .rev()
            .find(|&n| {
                text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
            })
            .map_or(text.len(), |n| text.len() - n)
    }
}

/// The JSON values in `s`, one after another (separated by whitespace, commas or `;`).
fn json_values(s: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some(at) = rest.find(['{', '[']) else {
            break;
        };
        let mut it = serde_json::Deserializer::from_str(&rest[at..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                out.push(v);
                rest = &rest[at + it.byte_offset()..];
            }
            _ => break,
        }
    }
    out
}

/// A call as OpenAI's `tool_calls` entry.
pub fn call_json(c: &Call, id: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: Value) -> Tools {
        parse(
            Some(&json!([
                {"type": "function", "function": {"name": "get_weather", "parameters":
                    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "add"}}
            ])),
            Some(&choice),
            None,
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn calls_are_read_in_each_dialect() {
        let t = tools(json!("auto"));
        let (c, calls) = t
            .read(
                "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>",
                Dialect::Hermes,
            )
            .unwrap();
        assert_eq!(c, "Let me look.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let (_, calls) = t
            .read(
                r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]"#,
                Dialect::Mistral,
            )
            .unwrap();
        assert_eq!(calls[0].name, "add");
        let (_, calls) = t
            .read(
                r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}"#,
                Dialect::Llama3,
            )
            .unwrap();
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        let (_, calls) = t
            .read(
                "```json\n{\"name\": \"add\", \"arguments\": \"{}\"}\n```",
                Dialect::Generic,
            )
            .unwrap();
        assert_eq!(calls[0].arguments, "{}");
        // Unknown tools and plain text are not calls.
        assert!(t
            .read(r#"{"name": "rm_rf", "arguments": {}}"#, Dialect::Generic)
            .is_none());
        assert!(t.read("The weather is fine.", Dialect::Hermes).is_none());
        // A Hermes template's model that leaves out the tags.
        let (_, calls) = t
            .read(r#"{"name": "add", "arguments": {"a": 2}}"#, Dialect::Hermes)
            .unwrap();
        assert_eq!(calls[0].name, "add");
    }

    #[test]
    fn streams_hold_back_what_may_be_a_call() {
        let t = tools(json!("auto"));
        assert_eq!(t.hold_from("Sure, here", Dialect::Hermes), 10);
        assert_eq!(t.hold_from("Sure <tool_c", Dialect::Hermes), 5);
        assert_eq!(t.hold_from("Ok <tool_call>{", Dialect::Hermes), 3);
        assert_eq!(t.hold_from("  {\"name\"", Dialect::Generic), 0);
        assert_eq!(t.hold_from("Hello", Dialect::Generic), 5);
    }

    #[test]
    fn choices_and_bad_tools_are_checked() {
        assert_eq!(tools(json!("required")).choice, Choice::Required);
        assert_eq!(
            tools(json!({"type": "function", "function": {"name": "add"}})).choice,
            Choice::Named("add".into())
        );
        let e = parse(
            Some(&json!([{"type": "function", "function": {"name": "a b"}}])),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.name"));
        let e = parse(
            Some(&json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "frob"}}}])),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
        let e = parse(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = parse(
            Some(&json!([{"type": "function", "function": {"name": "f"}}])),
            Some(&json!({"type": "function", "function": {"name": "g"}})),
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice.function.name"));
        assert!(parse(Some(&json!([])), Some(&json!("none")), None)
            .unwrap()
            .is_none());
        let g = tools(json!("required"))
            .forced(Dialect::Hermes, |s| format!("{s:?}"))
            .unwrap();
        assert!(g.contains("%json") && g.contains("get_weather"), "{g}");
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        // Without parallel calls: exactly one.
        let mut one = tools(json!("required"));
        one.parallel = false;
        let g = one.forced(Dialect::Hermes, |s| format!("{s:?}")).unwrap();
        assert!(g.starts_with("start: call\ncall: "), "{g}");
    }
}
