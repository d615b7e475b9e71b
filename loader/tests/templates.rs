//! The chat templates of the hybrid and recurrent families (Qwen3.5, Qwen3's for Qwen3-Next,
//! LFM2 and LFM2-MoE, llama.cpp's RWKV world template) render through mollm's minijinja
//! environment to exactly the text Jinja2 gives with Hugging Face's settings
//! (fixtures/golden/templates.json, made by scripts/golden/make_template_golden.py).

use loader::{ChatMessage, ChatTemplate};
use serde_json::Value;
use std::path::Path;

#[test]
fn family_templates_render_what_jinja2_renders() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let golden: Value = serde_json::from_slice(
        &std::fs::read(root.join("fixtures/golden/templates.json")).unwrap(),
    )
    .unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let mut templates = std::collections::BTreeSet::new();
    for c in cases {
        let name = c["template"].as_str().unwrap();
        templates.insert(name);
        let src = std::fs::read_to_string(root.join("fixtures/templates").join(name)).unwrap();
        let (bos, eos) = (
            c["bos_token"].as_str().unwrap(),
            c["eos_token"].as_str().unwrap(),
        );
        let t = ChatTemplate::new(&src, bos, eos, name).unwrap();
        let messages: Vec<ChatMessage> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let gen = c["add_generation_prompt"].as_bool().unwrap();
        let got = t.render(&messages, gen).unwrap();
        assert_eq!(
            got,
            c["text"].as_str().unwrap(),
            "{name}: {}",
            c["conversation"]
        );
    }
    assert_eq!(templates.len(), 5, "{templates:?}");
}
