//! A walk over a JSON schema before llguidance compiles it, so that the common mistakes are
//! reported with the path of the subschema that has them (llguidance names the problem, not
//! where it is): a type that is not a JSON type, keywords of the wrong kind, `$ref`s that are
//! not local or do not resolve.

use serde_json::Value;

const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
];
/// Keywords whose value is a list of subschemas.
const LIST: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// The first problem found, as "`/json/pointer`: what is wrong".
pub fn check(root: &Value) -> Result<(), String> {
    walk(root, root, &mut String::new(), 0)
}

fn at(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

fn walk(root: &Value, s: &Value, path: &mut String, depth: usize) -> Result<(), String> {
    if depth > 64 {
        return Err(format!("{}: nested deeper than 64 subschemas", at(path)));
    }
    let o = match s {
        Value::Bool(_) => return Ok(()),
        Value::Object(o) => o,
        _ => {
            return Err(format!(
                "{}: a schema must be an object or a boolean",
                at(path)
            ))
        }
    };
    let err = |path: &str, k: &str, msg: &str| Err(format!("{}/{k}: {msg}", path));
    if let Some(t) = o.get("type") {
        let names: Vec<&Value> = match t {
            Value::Array(a) => a.iter().collect(),
            v => vec![v],
        };
        for n in names {
            match n.as_str() {
                Some(x) if TYPES.contains(&x) => {}
                Some(x) => {
                    return err(
                        path,
                        "type",
                        &format!("'{x}' is not a JSON type (one of {})", TYPES.join(", ")),
                    )
                }
                None => return err(path, "type", "must be a type name or a list of them"),
            }
        }
    }
    if let Some(e) = o.get("enum") {
        if !e.is_array() {
            return err(path, "enum", "must be a list of values");
        }
    }
    if let Some(r) = o.get("required") {
        if !r.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
            return err(path, "required", "must be a list of property names");
        }
    }
    if let Some(r) = o.get("$ref") {
        let Some(r) = r.as_str() else {
            return err(path, "$ref", "must be a string");
        };
        let Some(ptr) = r.strip_prefix('#') else {
            return err(
                path,
                "$ref",
                &format!("'{r}': only references within the schema (#/...) are supported"),
            );
        };
        if root.pointer(ptr).is_none() {
            return err(
                path,
                "$ref",
                &format!("'{r}' points at nothing in the schema"),
            );
        }
    }
    let len = path.len();
    for (k, v) in o {
        let k = k.as_str();
        if ONE.contains(&k) {
            // Draft-4 `items` may be a list of schemas.
            if let (true, Value::Array(a)) = (k == "items", v) {
                for (i, x) in a.iter().enumerate() {
                    path.push_str(&format!("/{k}/{i}"));
                    walk(root, x, path, depth + 1)?;
                    path.truncate(len);
                }
                continue;
            }
            path.push_str(&format!("/{k}"));
            walk(root, v, path, depth + 1)?;
        } else if LIST.contains(&k) {
            let Some(a) = v.as_array() else {
                return err(path, k, "must be a list of schemas");
            };
            for (i, x) in a.iter().enumerate() {
                path.push_str(&format!("/{k}/{i}"));
                walk(root, x, path, depth + 1)?;
                path.truncate(len);
            }
        } else if MAP.contains(&k) {
            let Some(m) = v.as_object() else {
                return err(path, k, "must map names to schemas");
            };
            for (name, x) in m {
                path.push_str(&format!(
                    "/{k}/{}",
                    name.replace('~', "~0").replace('/', "~1")
                ));
                walk(root, x, path, depth + 1)?;
                path.truncate(len);
            }
        }
        path.truncate(len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::json;

    #[test]
    fn problems_are_named_by_their_path() {
        let e = check(&json!({"properties": {"a": {"items": {"type": "frob"}}}})).unwrap_err();
        assert!(e.starts_with("/properties/a/items/type: 'frob'"), "{e}");
        let e = check(&json!({"anyOf": [{"type": "string"}, {"$ref": "#/$defs/x"}]})).unwrap_err();
        assert!(
            e.starts_with("/anyOf/1/$ref: '#/$defs/x' points at nothing"),
            "{e}"
        );
        let e = check(&json!({"$ref": "https://example.com/s.json"})).unwrap_err();
        assert!(e.contains("only references within the schema"), "{e}");
        let e = check(&json!({"properties": {"a/b": {"required": "x"}}})).unwrap_err();
        assert!(e.starts_with("/properties/a~1b/required"), "{e}");
        let e = check(&json!(3)).unwrap_err();
        assert!(e.starts_with("/: a schema must be"), "{e}");
        let mut deep = json!({"type": "string"});
        for _ in 0..70 {
            deep = json!({"items": deep});
        }
        assert!(check(&deep).unwrap_err().contains("deeper than 64"));
        let ok = json!({"$defs": {"p": {"type": ["string", "null"]}},
                        "type": "object", "properties": {"p": {"$ref": "#/$defs/p"}},
                        "required": ["p"], "items": [{"type": "integer"}]});
        assert_eq!(check(&ok), Ok(()));
    }
}
