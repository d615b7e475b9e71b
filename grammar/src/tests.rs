//! Against Qwen2's real vocabulary (llama.cpp's vocab-only GGUF, committed under
//! fixtures/tokenizer): a "model" that draws random logits each step, masked by the constraint,
//! always ends with text of the spec's language.

use super::*;
use loader::ModelFile;

fn vocab() -> (Arc<Vocab>, Tokenizer) {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/tokenizer/ggml-vocab-qwen2.gguf");
    let tok = Tokenizer::from_gguf(&ModelFile::open(&p).unwrap()).unwrap();
    (Arc::new(Vocab::new(&tok).unwrap()), tok)
}

/// Random logits masked by `c`, the best one taken, until the constraint finishes, an
/// end-of-generation token comes, or `max` tokens; the text.
fn run(c: &mut Constrained, tok: &Tokenizer, seed: u64, max: usize) -> (String, bool) {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::new();
    let mut logits = vec![0f32; tok.vocab_size() + 7]; // models pad their output rows
    for _ in 0..max {
        for l in logits.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *l = (s >> 40) as f32 / (1u64 << 24) as f32;
        }
        c.mask(&mut logits).unwrap();
        let (best, _) = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &l)| if l > b.1 { (i, l) } else { b },
            );
        let t = best as u32;
        c.accept(t).unwrap();
        if tok.is_eog(t) {
            return (tok.decode(&out), true);
        }
        out.push(t);
        if c.finished() {
            return (tok.decode(&out), true);
        }
    }
    (tok.decode(&out), false)
}

#[test]
fn random_draws_give_json_valid_against_the_schema() {
    let (v, tok) = vocab();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "pet": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"],
                    "additionalProperties": false}
        },
        "required": ["name", "age", "tags", "pet"],
        "additionalProperties": false
    });
    let g = v.compile(&Spec::JsonSchema(schema)).unwrap();
    for seed in 0..20 {
        let (text, ended) = run(&mut g.constraint(), &tok, seed, 400);
        assert!(ended, "seed {seed}: no end in 400 tokens: {text:?}");
        let j: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = j.as_object().unwrap();
        assert!(o["name"].as_str().unwrap().chars().count() <= 12, "{text}");
        let age = o["age"].as_i64().unwrap();
        assert!((0..=150).contains(&age), "{text}");
        let tags = o["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 3
                && tags
                    .iter()
                    .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap()))
        );
        assert_eq!(o["pet"], serde_json::json!({"kind": "cat"}), "{text}");
        assert_eq!(o.len(), 4, "{text}");
    }
}

#[test]
fn json_object_and_lark_grammars_hold() {
    let (v, tok) = vocab();
    let g = v.compile(&Spec::JsonObject).unwrap();
    for seed in 0..5 {
        let mut c = g.constraint();
        let (text, ended) = run(&mut c, &tok, seed, 300);
        if ended {
            let j: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(j.is_object(), "{text}");
        } else {
            // Random draws may nest deeply; what there is must still be an object's prefix.
            assert!(text.trim_start().starts_with('{'), "{text}");
        }
    }
    let g = v
        .compile(&Spec::Lark(r#"start: "yes" | "no" | /[0-9]{2}/"#.into()))
        .unwrap();
    for seed in 0..10 {
        let (text, ended) = run(&mut g.constraint(), &tok, seed, 20);
        assert!(ended, "{text}");
        assert!(
            text == "yes"
                || text == "no"
                || (text.len() == 2 && text.bytes().all(|b| b.is_ascii_digit())),
            "{text:?}"
        );
    }
}

#[test]
fn bad_schemas_and_grammars_are_refused_with_the_reason() {
    let (v, _) = vocab();
    let e = v
        .compile(&Spec::JsonSchema(serde_json::json!({"type": "frobnicate"})))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("frobnicate"), "{e}");
    let e = v
        .compile(&Spec::JsonSchema(
            serde_json::json!({"$ref": "#/$defs/missing"}),
        ))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing"), "{e}");
    let e = v
        .compile(&Spec::Lark("start: undefined_rule".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("undefined_rule"), "{e}");
    let e = v
        .compile(&Spec::Lark("  ".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn gbnf_grammars_constrain_as_llama_cpp_writes_them() {
    let (v, tok) = vocab();
    let g = v
        .compile(&Spec::Gbnf(
            r#"root ::= ("yes" | "no") " " num
num ::= [1-9] [0-9]? # one or two digits"#
                .into(),
        ))
        .unwrap();
    for seed in 0..10 {
        let (text, ended) = run(&mut g.constraint(), &tok, seed, 20);
        assert!(ended, "{text}");
        let (word, n) = text.split_once(' ').unwrap();
        assert!(word == "yes" || word == "no", "{text:?}");
        assert!((1..=99).contains(&n.parse::<u32>().unwrap()), "{text:?}");
    }
    let e = v
        .compile(&Spec::Gbnf("answer ::= \"x\"".into()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("GBNF") && e.contains("root"), "{e}");
}

/// A mask worked out ahead (`prepare`, beside the forward pass) is the one `mask` works out
/// itself, and both are the per-token rule: allowed by the matcher, or an end-of-generation
/// token where EOS is allowed; rows past the vocabulary are out.
#[test]
fn prepared_masks_equal_masks_computed_in_place_and_the_per_token_rule() {
    let (v, tok) = vocab();
    let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"]});
    let g = v.compile(&Spec::JsonSchema(schema)).unwrap();
    let (mut a, mut b, mut r) = (g.constraint(), g.constraint(), g.constraint());
    let text: Vec<u32> = tok.encode("{\"n\": 42}", false, false).unwrap();
    let width = tok.vocab_size() + 7;
    for (step, &t) in text.iter().enumerate() {
        let raw: Vec<f32> = (0..width)
            .map(|i| (i % 97) as f32 * 0.01 + step as f32)
            .collect();
        let (mut la, mut lb) = (raw.clone(), raw.clone());
        a.prepare();
        a.mask(&mut la).unwrap();
        b.mask(&mut lb).unwrap();
        assert_eq!(la, lb, "step {step}");
        let allowed = r.matcher.compute_mask().unwrap();
        let eos = allowed.is_allowed(v.eos);
        for (i, (&l, &x)) in la.iter().zip(&raw).enumerate() {
            let ok = i < v.n_vocab
                && (allowed.is_allowed(i as u32) || (eos && v.eog.contains(&(i as u32))));
            assert_eq!(
                l,
                if ok { x } else { f32::NEG_INFINITY },
                "step {step} token {i}"
            );
        }
        for c in [&mut a, &mut b, &mut r] {
            c.accept(t).unwrap();
        }
    }
}
