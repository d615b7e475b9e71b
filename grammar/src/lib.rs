//! Constrained decoding: what a request asks its output to be (any JSON object, JSON that
//! validates against a schema, or text of a Lark grammar) compiled by
//! [llguidance](https://github.com/guidance-ai/llguidance) into a matcher over the model's
//! vocabulary, which masks each step's logits ([`engine::TokenConstraint`]).
//!
//! [`Vocab`] is built once per model (the token trie: every token's bytes, control tokens as
//! llguidance's special tokens); [`Vocab::compile`] turns a [`Spec`] into a [`Grammar`] (checked
//! when the request arrives, so a bad schema is the request's error), and
//! [`Grammar::constraint`] gives each sequence its own matcher. Compilation and matching run
//! within llguidance's limits (lexer fuel, grammar size), so a hostile schema is refused rather
//! than run for long.

use engine::{ConstraintError, TokenConstraint};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use loader::Tokenizer;
use serde_json::Value;
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// What the output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this schema (OpenAI's `json_schema`).
    JsonSchema(Value),
    /// Text of a grammar in llguidance's Lark syntax.
    Lark(String),
    /// Text of a grammar in llama.cpp's GBNF (rewritten into Lark, [`gbnf`]).
    Gbnf(String),
}

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The schema or grammar is not valid or uses what llguidance does not support; the
    /// message is llguidance's, which names the place.
    #[error("{0}")]
    Invalid(String),
    /// The model's vocabulary cannot be given to llguidance.
    #[error("vocabulary: {0}")]
    Vocab(String),
}

/// A model's vocabulary as llguidance sees it, and its parser factory.
pub struct Vocab {
    factory: ParserFactory,
    /// End-of-generation ids: llguidance's EOS stands for all of them.
    eog: Vec<u32>,
    eos: u32,
    n_vocab: usize,
}

impl Vocab {
    /// Builds the token trie of `tok` (a few hundred milliseconds for 150,000 tokens: once per
    /// model).
    pub fn new(tok: &Tokenizer) -> Result<Vocab, GrammarError> {
        let n = tok.vocab_size();
        let eog: Vec<u32> = tok.eog_ids().collect();
        let eos = tok
            .eos()
            .or_else(|| tok.eot())
            .or_else(|| eog.first().copied())
            .ok_or_else(|| {
                GrammarError::Vocab("the model has no end-of-generation token".into())
            })?;
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                if tok.is_control(id) || eog.contains(&id) {
                    // llguidance's special tokens: a 0xFF byte, then the text.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).as_bytes());
                    w
                } else {
                    tok.token_to_piece(id, false)
                }
            })
            .collect();
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tok.bos(),
            tok_pad: tok.pad(),
            tok_unk: tok.unk(),
            tok_end_of_turn: tok.eot(),
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocab(e.to_string()))?;
        factory.quiet();
        Ok(Vocab {
            factory,
            eog,
            eos,
            n_vocab: n,
        })
    }

    /// Compiles `spec`; its errors name what is wrong (a schema's path among them).
    pub fn compile(self: &Arc<Self>, spec: &Spec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            Spec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Spec::JsonSchema(s) => {
                schema::check(s).map_err(|e| GrammarError::Invalid(format!("at {e}")))?;
                TopLevelGrammar::from_json_schema(compact(s.clone()))
            }
            Spec::Lark(g) => {
                if g.trim().is_empty() {
                    return Err(GrammarError::Invalid("the grammar is empty".into()));
                }
                TopLevelGrammar::from_lark(g.clone())
            }
            Spec::Gbnf(g) => TopLevelGrammar::from_lark(
                gbnf::to_lark(g).map_err(|e| GrammarError::Invalid(format!("GBNF: {e}")))?,
            ),
        };
        let m = Matcher::new(self.factory.create_parser(top));
        if let Some(e) = m.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(Grammar {
            vocab: self.clone(),
            matcher: m,
        })
    }
}

/// JSON laid out as `json.dumps` lays it out (", " and ": ", no other whitespace) unless the
/// schema sets llguidance's options itself (`x-guidance`): with free whitespace a sampled
/// model can write blanks until it runs out of tokens, and the output would not parse.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// A compiled spec, ready to constrain any number of sequences.
pub struct Grammar {
    vocab: Arc<Vocab>,
    matcher: Matcher,
}

impl Grammar {
    /// A fresh matcher for one sequence.
    pub fn constraint(&self) -> Constrained {
        Constrained {
            vocab: self.vocab.clone(),
            matcher: self.matcher.deep_clone(),
            ready: None,
        }
    }
}

/// One sequence's matcher.
pub struct Constrained {
    vocab: Arc<Vocab>,
    matcher: Matcher,
    /// The next mask, worked out ahead ([`TokenConstraint::prepare`]).
    ready: Option<SimpleVob>,
}

impl Constrained {
    fn error(&self, what: &str) -> ConstraintError {
        ConstraintError(
            self.matcher
                .get_error()
                .unwrap_or_else(|| format!("the grammar {what}")),
        )
    }
}

impl TokenConstraint for Constrained {
    fn prepare(&mut self) {
        self.ready = self.matcher.compute_mask().ok();
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let allowed = match self.ready.take() {
            Some(m) => m,
            None => self
                .matcher
                .compute_mask()
                .map_err(|e| ConstraintError(e.to_string()))?,
        };
        if allowed.is_zero() {
            return Err(self.error("allows no token here"));
        }
        let n = self.vocab.n_vocab.min(logits.len());
        // Any end-of-generation token stands for the grammar's EOS: kept where EOS may come.
        let eog: Vec<(usize, f32)> = match allowed.is_allowed(self.vocab.eos) {
            true => (self.vocab.eog.iter())
                .map(|&t| t as usize)
                .filter(|&t| t < n)
                .map(|t| (t, logits[t]))
                .collect(),
            false => Vec::new(),
        };
        // A word of the mask at a time: most words are all in or all out.
        for (w, &bits) in allowed.as_slice().iter().enumerate() {
            let start = w * 32;
            if start >= n {
                break;
            }
            let row = &mut logits[start..(start + 32).min(n)];
            match bits {
                u32::MAX => {}
                0 => row.fill(f32::NEG_INFINITY),
                _ => {
                    for (j, l) in row.iter_mut().enumerate() {
                        if bits >> j & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        // Past the mask's words, and past the tokenizer's vocabulary (padding rows): out.
        let covered = (allowed.as_slice().len() * 32).min(n);
        logits[covered..].fill(f32::NEG_INFINITY);
        for (t, v) in eog {
            logits[t] = v;
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        // Any end-of-generation token is the grammar's EOS.
        let t = if self.vocab.eog.contains(&token) {
            self.vocab.eos
        } else {
            token
        };
        self.matcher
            .consume_token(t)
            .map_err(|e| ConstraintError(e.to_string()))
    }

    fn finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }
}

pub mod gbnf;
mod schema;

/// Checks a JSON schema's shape (types, `enum`, `required`, local `$ref`s): the first problem
/// as "`/json/pointer`: what is wrong".
pub fn check_schema(schema: &Value) -> Result<(), String> {
    schema::check(schema)
}

#[cfg(test)]
mod tests;
