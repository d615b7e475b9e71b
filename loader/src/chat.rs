//! Chat templates (`tokenizer.chat_template`, Jinja) rendered with minijinja.
//!
//! Templates are written for Python's Jinja2 as Hugging Face runs it, so the environment copies
//! those settings: `trim_blocks` and `lstrip_blocks` on, Python string methods (`.strip()`,
//! `.startswith()`...) through minijinja-contrib's pycompat callback, a `raise_exception`
//! function, and `tools` passed as none when there are no tools.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::gguf::ModelFile;
use crate::LoadError;

/// One message as chat templates read it (Hugging Face's shape).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant's calls: `{"type": "function", "function": {"name", "arguments"}}` with
    /// the arguments as an object (templates write them with `tojson`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool result's call id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name, or a participant's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// What a rendering is given besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderExtras {
    /// The request's tools (`[{"type": "function", "function": {...}}]`), or none.
    pub tools: Option<serde_json::Value>,
    /// More variables for the template (`chat_template_kwargs`: `enable_thinking`, ...).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    file: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("file", &self.file)
            .field("len", &self.source.len())
            .finish()
    }
}

/// Instructions one rendering may run. A real template spends a few hundred a message, so this
/// holds conversations of thousands of messages; a template with nested loops (a "template
/// bomb") stops here instead of running for minutes.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// An `io::Write` into a string that refuses to grow past `max` bytes.
struct Capped {
    out: Vec<u8>,
    max: usize,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.max {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Templates that files name instead of carrying (llama.cpp's converter writes `rwkv-world`
/// when a RWKV checkpoint has no template; `chatml` is the common fallback name), as Jinja
/// sources of mollm's own that write what llama.cpp's built-in formatter for the name writes.
const NAMED: &[(&str, &str)] = &[
    (
        // System, user and assistant turns each as "Role: text\n\n" (trimmed), and
        // "Assistant:" after a last user turn, whatever add_generation_prompt says.
        "rwkv-world",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{- 'System: ' + m.content|trim + '\n\n' -}}\
         {%- elif m.role == 'user' -%}{{- 'User: ' + m.content|trim + '\n\n' -}}\
         {%- if loop.last -%}{{- 'Assistant:' -}}{%- endif -%}\
         {%- elif m.role == 'assistant' -%}{{- 'Assistant: ' + m.content|trim + '\n\n' -}}\
         {%- endif -%}{%- endfor -%}",
    ),
    (
        "chatml",
        "{%- for m in messages -%}\
         {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}",
    ),
];

/// The Jinja source for a template that is only a name of [`NAMED`].
pub fn named_template(source: &str) -> Option<&'static str> {
    NAMED
        .iter()
        .find(|(name, _)| source.trim() == *name)
        .map(|(_, src)| *src)
}

impl ChatTemplate {
    /// The model's template, or `None` when the file has no `tokenizer.chat_template`.
    /// `bos_token`/`eos_token` are the texts of the GGUF's BOS/EOS ids ("" if absent).
    pub fn from_gguf(gguf: &ModelFile) -> Result<Option<ChatTemplate>, LoadError> {
        let Some(src) = gguf.get_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let text = |key: &str| -> Result<String, LoadError> {
            Ok(match (gguf.get_u32(key)?, tokens) {
                (Some(id), Some(t)) => t.get(id as usize).unwrap_or("").to_string(),
                _ => String::new(),
            })
        };
        let (bos, eos) = (
            text("tokenizer.ggml.bos_token_id")?,
            text("tokenizer.ggml.eos_token_id")?,
        );
        Self::new(src, &bos, &eos, &gguf.file_label()).map(Some)
    }

    /// Compiles `source` (or the template it names: [`named_template`]). `file` labels error
    /// messages.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        file: &str,
    ) -> Result<ChatTemplate, LoadError> {
        let source = named_template(source).unwrap_or(source);
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned("chat_template", source.to_string())
            .map_err(|e| LoadError::Template {
                file: file.to_string(),
                msg: format!("does not compile: {}", describe(&e)),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            file: file.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with the header
    /// that opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, LoadError> {
        // No text reaches usize::MAX bytes: `None` cannot come back.
        Ok(self
            .render_limited(messages, add_generation_prompt, usize::MAX)?
            .unwrap_or_default())
    }

    /// [`ChatTemplate::render`] that stops, with `None`, once the text passes `max_bytes`
    /// (callers pass what their context could hold). Every rendering also runs on at most
    /// [`TEMPLATE_FUEL`] instructions.
    pub fn render_limited(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        max_bytes: usize,
    ) -> Result<Option<String>, LoadError> {
        self.render_with(
            messages,
            add_generation_prompt,
            &RenderExtras::default(),
            max_bytes,
        )
    }

    /// [`ChatTemplate::render_limited`] with tools and extra template variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &RenderExtras,
        max_bytes: usize,
    ) -> Result<Option<String>, LoadError> {
        let err = |e: Error| LoadError::Template {
            file: self.file.clone(),
            msg: if e.kind() == ErrorKind::OutOfFuel {
                format!("rendering stopped after {TEMPLATE_FUEL} instructions (a template that loops this long is refused)")
            } else {
                describe(&e)
            },
        };
        let tmpl = self.env.get_template("chat_template").map_err(err)?;
        let mut out = Capped {
            out: Vec::new(),
            max: max_bytes,
            over: false,
        };
        // The request's variables first: the ones below are the template's contract.
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            tools => minijinja::Value::from_serialize(&extras.tools),
            ..minijinja::Value::from_serialize(&extras.kwargs)
        };
        let r = tmpl.render_captured_to(ctx, &mut out);
        if out.over {
            return Ok(None);
        }
        r.map_err(err)?;
        // minijinja writes whole strings: what it wrote is UTF-8.
        Ok(Some(String::from_utf8_lossy(&out.out).into_owned()))
    }
}

/// minijinja's error plus its causes, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convo() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("user", "Hi!"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "  What is 2+2?  "),
        ]
    }

    #[test]
    fn pycompat_methods_and_raise_exception() {
        let t = ChatTemplate::new(
            "{{ messages[0].content.strip() }}|{{ messages[0].content.startswith('  What') }}|{{ bos_token }}",
            "<s>",
            "</s>",
            "x.gguf",
        )
        .unwrap();
        assert_eq!(
            t.render(&convo()[2..], false).unwrap(),
            "What is 2+2?|True|<s>"
        );
        let t =
            ChatTemplate::new("{{ raise_exception('no system role') }}", "", "", "x.gguf").unwrap();
        let e = t.render(&convo(), false).unwrap_err().to_string();
        assert!(e.contains("x.gguf") && e.contains("no system role"), "{e}");
        let e = ChatTemplate::new("{% if %}", "", "", "x.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.gguf") && e.contains("does not compile"),
            "{e}"
        );
    }

    #[test]
    fn template_bombs_run_out_of_fuel_or_room() {
        // Nested loops that write nothing: stopped by fuel, quickly.
        let quiet = ChatTemplate::new(
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
            "",
            "",
            "bomb.gguf",
        )
        .unwrap();
        let t = std::time::Instant::now();
        let e = quiet.render(&convo(), true).unwrap_err().to_string();
        assert!(e.contains("bomb.gguf") && e.contains("instructions"), "{e}");
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
        // Few instructions, a huge output: stopped at the byte cap, with None.
        let loud = ChatTemplate::new(
            "{% for i in range(10000) %}{{ 'x' * 100000 }}{% endfor %}",
            "",
            "",
            "loud.gguf",
        )
        .unwrap();
        assert_eq!(loud.render_limited(&convo(), true, 1 << 20).unwrap(), None);
        // A real template is untouched by either bound, and fits a cap of its own length.
        let src = fixture_template("Qwen-Qwen2.5-7B-Instruct.jinja");
        let t = ChatTemplate::new(&src, "", "<|im_end|>", "qwen.jinja").unwrap();
        let whole = t.render(&convo(), true).unwrap();
        let capped = t.render_limited(&convo(), true, whole.len()).unwrap();
        assert_eq!(capped.as_deref(), Some(whole.as_str()));
        assert_eq!(
            t.render_limited(&convo(), true, whole.len() - 1).unwrap(),
            None
        );
        // A thousand-message conversation stays within the fuel.
        let many: Vec<ChatMessage> = (0..1000)
            .map(|i| ChatMessage::new(["user", "assistant"][i % 2], format!("message {i}")))
            .collect();
        assert!(t.render(&many, true).unwrap().contains("message 999"));
    }

    /// The chat-template fuzz target's property on seeded random templates built from the
    /// pieces hostile ones are made of (loops, ranges, repetition, recursion through macros,
    /// unbalanced tags): an error or a text within the cap, never a panic, each in bounded time.
    #[test]
    fn random_templates_end_within_their_bounds() {
        const PIECES: &[&str] = &[
            "{% for i in range(10000) %}",
            "{% for m in messages %}",
            "{% endfor %}",
            "{{ 'ab' * 99999 }}",
            "{{ messages[0].content * 1000 }}",
            "{% if add_generation_prompt %}",
            "{% endif %}",
            "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
            "{{ raise_exception('x') }}",
            "{{ messages | tojson }}",
            "{% set ns = namespace(x='') %}{% for i in range(1000) %}{% set ns.x = ns.x ~ 'abcdefgh' %}{% endfor %}{{ ns.x }}",
            "{{ m.content.strip().split(' ') | join('-') }}",
            "<|im_start|>",
            "{{ bos_token }}",
            "{{",
            "{% for",
            "}}",
        ];
        const CAP: usize = 1 << 16;
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut rendered, mut refused) = (0, 0);
        for _ in 0..300 {
            let n = 1 + next() % 6;
            let src: String = (0..n)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>", "fuzz.gguf") else {
                refused += 1;
                continue;
            };
            let start = std::time::Instant::now();
            match t.render_limited(&convo(), true, CAP) {
                Ok(Some(out)) => {
                    assert!(out.len() <= CAP, "{src}");
                    rendered += 1;
                }
                Ok(None) | Err(_) => refused += 1,
            }
            assert!(
                start.elapsed().as_secs() < 5,
                "{src}: {:?}",
                start.elapsed()
            );
        }
        assert!(
            rendered > 0 && refused > 0,
            "{rendered} rendered, {refused} refused"
        );
    }

    /// Templates copied from llama.cpp's models/templates (see fixtures/templates/README.md).
    fn fixture_template(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/templates")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn vendored_qwen25_template_renders_chatml() {
        let src = fixture_template("Qwen-Qwen2.5-7B-Instruct.jinja");
        let t = ChatTemplate::new(&src, "", "<|im_end|>", "qwen.jinja").unwrap();
        assert_eq!(
            t.render(&convo()[..2], true).unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// A template that is only a name renders as llama.cpp's built-in formatter of that name.
    #[test]
    fn named_templates_render_as_llama_cpps_builtins() {
        let t = ChatTemplate::new("rwkv-world", "", "\n\n", "rwkv.gguf").unwrap();
        let convo = [
            ChatMessage::new("system", "Be brief. "),
            ChatMessage::new("user", " Hi!\n"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        assert_eq!(
            t.render(&convo, true).unwrap(),
            "System: Be brief.\n\nUser: Hi!\n\nAssistant: Hello.\n\nUser: Bye\n\nAssistant:"
        );
        assert_eq!(
            t.render(&convo[..3], true).unwrap(),
            "System: Be brief.\n\nUser: Hi!\n\nAssistant: Hello.\n\n"
        );
        let t = ChatTemplate::new(" chatml\n", "", "<|im_end|>", "x.gguf").unwrap();
        assert_eq!(
            t.render(&convo[1..3], true).unwrap(),
            "<|im_start|>user\n Hi!\n<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        // Any other text is a template of its own.
        let t = ChatTemplate::new("rwkv-world2", "", "", "x.gguf").unwrap();
        assert_eq!(t.render(&convo, true).unwrap(), "rwkv-world2");
    }

    #[test]
    fn vendored_gemma2_template_raises_on_system_role() {
        let src = fixture_template("google-gemma-2-2b-it.jinja");
        let t = ChatTemplate::new(&src, "<bos>", "<eos>", "gemma.jinja").unwrap();
        assert_eq!(
            t.render(&convo()[..2], true).unwrap(),
            "<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>model\n"
        );
        let e = t
            .render(&[ChatMessage::new("system", "x")], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gemma.jinja"), "{e}");
    }
}
