//! `config.json` → the architecture's GGUF hyper-parameter keys.

use std::path::Path;

use super::{label, read_json};
use crate::gguf::Value;
use crate::LoadError;

/// `model_type` values read, and the GGUF architecture each becomes.
pub const SUPPORTED: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("qwen2", "qwen2"),
    ("qwen3", "qwen3"),
    ("qwen3_moe", "qwen3moe"),
    ("gemma3_text", "gemma3"),
    ("lfm2", "lfm2"),
    ("qwen3_5", "qwen35"),
    ("qwen3_5_text", "qwen35"),
    ("qwen3_5_moe", "qwen35moe"),
    ("qwen3_5_moe_text", "qwen35moe"),
    ("qwen3_next", "qwen3next"),
    ("bert", "bert"),
];

/// `model_type`s whose config nests the text model's fields under `text_config` (the
/// `*ForConditionalGeneration` form): they are read as llama.cpp's converter reads them, the
/// nested fields over the top-level ones.
const NESTED: &[&str] = &["qwen3_5", "qwen3_5_moe"];

/// Qwen3.5 / Qwen3-Next's gated delta-net sizes (config.json's `linear_*` fields).
#[derive(Clone, Copy, Debug, Default)]
pub struct Linear {
    pub conv_kernel: u64,
    pub k_heads: u64,
    pub v_heads: u64,
    pub k_dim: u64,
    pub v_dim: u64,
}

pub struct Config {
    pub dir: std::path::PathBuf,
    pub json: serde_json::Value,
    /// GGUF architecture name.
    pub arch: &'static str,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_embd: u64,
    pub vocab_size: u64,
    pub n_expert: u64,
    pub tie_embeddings: bool,
    /// LFM2: per layer, whether it is attention (else a short convolution). Qwen3.5 /
    /// Qwen3-Next: whether it is full attention (else gated delta-net).
    pub attention_layers: Vec<bool>,
    /// Qwen3.5 / Qwen3-Next: the delta-net sizes.
    pub linear: Linear,
    /// Qwen3.5 / Qwen3-Next: multi-token-prediction blocks in the checkpoint (`mtp.*`), stored
    /// after the main layers as llama.cpp's converter does.
    pub n_mtp: u64,
    /// Fields that came from `text_config` (named so in errors).
    text_keys: Vec<String>,
}

/// The architectures of Qwen3.5 / Qwen3-Next (gated delta-net and full attention layers).
pub fn is_qwen35(arch: &str) -> bool {
    matches!(arch, "qwen35" | "qwen35moe" | "qwen3next")
}

impl Config {
    pub fn load(dir: &Path) -> Result<Config, LoadError> {
        let json = read_json(dir, "config.json")?.ok_or_else(|| LoadError::Format {
            file: label(dir, "config.json"),
            msg: "missing: not a Hugging Face model directory".into(),
        })?;
        let file = label(dir, "config.json");
        let err = |field: &str, msg: String| LoadError::Metadata {
            file: file.clone(),
            key: field.to_string(),
            msg,
        };
        if !json.is_object() {
            return Err(err("(root)", "expected a JSON object".into()));
        }
        let model_type = json
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| err("model_type", "missing or not a string".into()))?
            .to_string();
        let model_type = model_type.as_str();
        // `text_config` over the top level, as the converter merges them.
        let mut text_keys = Vec::new();
        let mut json = json;
        if NESTED.contains(&model_type) {
            let text = json
                .get("text_config")
                .and_then(|t| t.as_object())
                .cloned()
                .ok_or_else(|| err("text_config", "missing or not an object".into()))?;
            let root = json.as_object_mut().expect("checked above");
            for (k, v) in text {
                if k != "model_type" {
                    text_keys.push(k.clone());
                    root.insert(k, v);
                }
            }
        }
        let arch = SUPPORTED
            .iter()
            .find(|(m, _)| *m == model_type)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                err(
                    "model_type",
                    format!(
                        "'{model_type}' is not supported (supported: {})",
                        SUPPORTED.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
        let mut c = Config {
            dir: dir.to_path_buf(),
            json,
            arch,
            n_layer: 0,
            n_head: 0,
            n_head_kv: 0,
            head_dim: 0,
            n_embd: 0,
            vocab_size: 0,
            n_expert: 0,
            tie_embeddings: false,
            attention_layers: Vec::new(),
            linear: Linear::default(),
            n_mtp: 0,
            text_keys,
        };
        c.n_layer = c.req_u("num_hidden_layers", 1, 4096)?;
        c.n_embd = c.req_u("hidden_size", 1, 1 << 20)?;
        c.n_head = c.req_u("num_attention_heads", 1, 4096)?;
        c.n_head_kv = c.opt_u("num_key_value_heads", 1, 4096)?.unwrap_or(c.n_head);
        if c.n_head % c.n_head_kv != 0 {
            return Err(err(
                "num_key_value_heads",
                format!("{} does not divide {} heads", c.n_head_kv, c.n_head),
            ));
        }
        c.head_dim = match c.opt_u("head_dim", 1, 1 << 16)? {
            Some(d) => d,
            None if c.n_embd % c.n_head == 0 => c.n_embd / c.n_head,
            None => {
                return Err(err(
                    "head_dim",
                    "missing, and hidden_size is not a multiple of num_attention_heads".into(),
                ))
            }
        };
        c.vocab_size = c.req_u("vocab_size", 1, 1 << 24)?;
        // Gemma's configs leave the (tied) default unsaid.
        c.tie_embeddings = c
            .opt_bool("tie_word_embeddings")?
            .unwrap_or(arch == "gemma3");
        if arch == "qwen3moe" {
            c.n_expert = c.req_u("num_experts", 1, 4096)?;
        }
        if arch == "lfm2" {
            c.attention_layers = c.lfm2_layers()?;
            // Hugging Face's LFM2 ties its embeddings unless the config says otherwise.
            c.tie_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(true);
        }
        if is_qwen35(arch) {
            c.qwen35_load()?;
        }
        Ok(c)
    }

    /// Qwen3.5 / Qwen3-Next: the delta-net sizes, the layer kinds (`layer_types`, else every
    /// `full_attention_interval`-th layer is full attention) and the experts.
    fn qwen35_load(&mut self) -> Result<(), LoadError> {
        let l = Linear {
            conv_kernel: self.req_u("linear_conv_kernel_dim", 2, 64)?,
            k_heads: self.req_u("linear_num_key_heads", 1, 4096)?,
            v_heads: self.req_u("linear_num_value_heads", 1, 4096)?,
            k_dim: self.req_u("linear_key_head_dim", 1, 1024)?,
            v_dim: self.req_u("linear_value_head_dim", 1, 1024)?,
        };
        if l.v_heads % l.k_heads != 0 {
            return Err(self.err(
                "linear_num_value_heads",
                format!(
                    "{} is not a multiple of linear_num_key_heads {}",
                    l.v_heads, l.k_heads
                ),
            ));
        }
        if l.v_dim != l.k_dim {
            return Err(self.err(
                "linear_value_head_dim",
                format!(
                    "{} differs from linear_key_head_dim {} (mollm's delta-net needs them equal)",
                    l.v_dim, l.k_dim
                ),
            ));
        }
        self.linear = l;
        if self.opt_bool("attn_output_gate")? == Some(false) {
            return Err(self.err(
                "attn_output_gate",
                "false is not supported (llama.cpp's graph always gates attention output)".into(),
            ));
        }
        let n = self.n_layer as usize;
        self.attention_layers = match self
            .layer_types([("linear_attention", false), ("full_attention", true)])?
        {
            Some(kinds) => kinds,
            None => {
                let every = self.opt_u("full_attention_interval", 1, 4096)?.unwrap_or(4) as usize;
                (0..n).map(|il| (il + 1) % every == 0).collect()
            }
        };
        if self.arch != "qwen35" {
            self.n_expert = self.req_u("num_experts", 1, 4096)?;
        }
        Ok(())
    }
    /// `layer_types`, one entry per layer, each one of the two `kinds` (a name and its flag);
    /// `None` when the config has none.
    fn layer_types(&self, kinds: [(&str, bool); 2]) -> Result<Option<Vec<bool>>, LoadError> {
        let n = self.n_layer as usize;
        let Some(v) = self.json.get("layer_types").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let list = v.as_array().filter(|l| l.len() == n).ok_or_else(|| {
            self.err(
                "layer_types",
                format!("expected a list of {n} layer types, found {v}"),
            )
        })?;
        list.iter()
            .map(|t| match kinds.iter().find(|k| t.as_str() == Some(k.0)) {
                Some(&(_, flag)) => Ok(flag),
                None => Err(self.err(
                    "layer_types",
                    format!("{t}: expected \"{}\" or \"{}\"", kinds[0].0, kinds[1].0),
                )),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// LFM2's layer kinds: `layer_types` ("conv" / "full_attention"), or the attention layers
    /// listed in `full_attn_idxs` (older configs).
    fn lfm2_layers(&self) -> Result<Vec<bool>, LoadError> {
        let n = self.n_layer as usize;
        if let Some(kinds) = self.layer_types([("conv", false), ("full_attention", true)])? {
            return Ok(kinds);
        }
        let idx = self
            .json
            .get("full_attn_idxs")
            .and_then(|v| v.as_array())
            .ok_or_else(|| self.err("layer_types", "missing (and no full_attn_idxs)".into()))?;
        let mut attn = vec![false; n];
        for v in idx {
            match v.as_u64().filter(|&i| (i as usize) < n) {
                Some(i) => attn[i as usize] = true,
                None => {
                    return Err(self.err(
                        "full_attn_idxs",
                        format!("{v}: expected a layer index below {n}"),
                    ))
                }
            }
        }
        Ok(attn)
    }

    fn err(&self, field: &str, msg: String) -> LoadError {
        // In a nested config, the text model's fields (and missing ones) are text_config's.
        let nested = !self.text_keys.is_empty()
            && (self.text_keys.iter().any(|k| k == field) || self.json.get(field).is_none());
        let key = match nested {
            true => format!("text_config.{field}"),
            false => field.to_string(),
        };
        LoadError::Metadata {
            file: label(&self.dir, "config.json"),
            key,
            msg,
        }
    }

    fn opt_u(&self, field: &str, lo: u64, hi: u64) -> Result<Option<u64>, LoadError> {
        match self.json.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                _ => Err(self.err(
                    field,
                    format!("expected an integer in {lo}..={hi}, found {v}"),
                )),
            },
        }
    }

    fn req_u(&self, field: &str, lo: u64, hi: u64) -> Result<u64, LoadError> {
        self.opt_u(field, lo, hi)?
            .ok_or_else(|| self.err(field, "missing".into()))
    }

    fn opt_f(&self, field: &str) -> Result<Option<f32>, LoadError> {
        match self.json.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(self.err(field, format!("expected a number, found {v}"))),
            },
        }
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, LoadError> {
        match self.json.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    /// The GGUF keys llama.cpp's converter writes for this architecture.
    pub fn metadata(&self, meta: &mut Vec<(String, Value)>) -> Result<(), LoadError> {
        let a = self.arch;
        if a == "bert" {
            return self.bert_metadata(meta);
        }
        let mut put = |k: &str, v: Value| meta.push((format!("{a}.{k}"), v));
        let u = |n: u64| Value::U32(n as u32);
        put("block_count", u(self.n_layer + self.n_mtp));
        put("embedding_length", u(self.n_embd));
        let ff = match a {
            "lfm2" => self.lfm2_ff()?,
            // The MoE configs may have no dense width (the converter then writes none; mollm's
            // graphs for them do not read it).
            "qwen35moe" | "qwen3next" => self.opt_u("intermediate_size", 1, 1 << 24)?.unwrap_or(0),
            _ => self.req_u("intermediate_size", 1, 1 << 24)?,
        };
        put("feed_forward_length", u(ff));
        put("attention.head_count", u(self.n_head));
        match a {
            // Per layer, 0 for a convolution layer (llama.cpp's converter writes it so).
            "lfm2" => put(
                "attention.head_count_kv",
                Value::Array(crate::gguf::Array::U32(
                    self.attention_layers
                        .iter()
                        .map(|&att| if att { self.n_head_kv as u32 } else { 0 })
                        .collect(),
                )),
            ),
            _ => put("attention.head_count_kv", u(self.n_head_kv)),
        }
        put("attention.key_length", u(self.head_dim));
        put("attention.value_length", u(self.head_dim));
        if let Some(n) = self.opt_u("max_position_embeddings", 1, 1 << 26)? {
            put("context_length", u(n));
        }
        let eps_key = if a == "lfm2" {
            "norm_eps"
        } else {
            "rms_norm_eps"
        };
        let eps = self
            .opt_f(eps_key)?
            .ok_or_else(|| self.err(eps_key, "missing".into()))?;
        put("attention.layer_norm_rms_epsilon", Value::F32(eps));
        if is_qwen35(a) {
            self.qwen35_metadata(&mut put)?;
        } else {
            put(
                "rope.freq_base",
                Value::F32(self.opt_f("rope_theta")?.unwrap_or(10000.0)),
            );
        }
        match self.json.get("rope_scaling").filter(|_| !is_qwen35(a)) {
            None | Some(serde_json::Value::Null) => {}
            Some(rs) => {
                let kind = rs
                    .get("rope_type")
                    .or_else(|| rs.get("type"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                let factor = rs.get("factor").and_then(|v| v.as_f64());
                match (kind, factor) {
                    ("default", _) => {}
                    ("linear", Some(f)) if f > 0.0 => {
                        put("rope.scaling.type", Value::String("linear".into()));
                        put("rope.scaling.factor", Value::F32(f as f32));
                    }
                    _ => {
                        return Err(self.err(
                            "rope_scaling",
                            format!("{rs} is not supported (only linear scaling)"),
                        ))
                    }
                }
            }
        }
        if self.arch == "qwen3moe" {
            put("expert_count", u(self.n_expert));
            let used = self.req_u("num_experts_per_tok", 1, self.n_expert)?;
            put("expert_used_count", u(used));
            put(
                "expert_feed_forward_length",
                u(self.req_u("moe_intermediate_size", 1, 1 << 24)?),
            );
            // Hugging Face's Qwen3MoE renormalizes the top-k weights only when this is set.
            let norm = self.opt_bool("norm_topk_prob")?.unwrap_or(false);
            put("expert_weights_norm", Value::Bool(norm));
            let dense = self.json.get("mlp_only_layers").and_then(|v| v.as_array());
            if dense.is_some_and(|l| !l.is_empty())
                || self.opt_u("decoder_sparse_step", 0, 1 << 20)?.unwrap_or(1) != 1
            {
                return Err(self.err(
                    "mlp_only_layers",
                    "dense layers between MoE layers are not supported".into(),
                ));
            }
        }
        if self.arch == "gemma3" {
            self.gemma3_metadata(&mut put)?;
        }
        if self.arch == "lfm2" {
            if self.opt_bool("conv_bias")? == Some(true) {
                return Err(self.err(
                    "conv_bias",
                    "a bias on the short convolution is not supported (llama.cpp has none)".into(),
                ));
            }
            put("shortconv.l_cache", u(self.req_u("conv_L_cache", 2, 64)?));
            put("vocab_size", u(self.vocab_size));
        }
        meta.push(("general.architecture".into(), Value::String(a.into())));
        Ok(())
    }

    /// Qwen3.5 / Qwen3-Next's keys as llama.cpp's converter writes them (`Qwen3NextModel`,
    /// `_Qwen35MRopeMixin`, `Qwen2MoeModel`, `_QwenMtpMixin`): rope from `rope_parameters` (or
    /// `rope_scaling`, and the top-level `rope_theta` / `partial_rotary_factor`), rotating
    /// `head_dim * partial_rotary_factor` (default 0.25) dimensions in `mrope_section`'s
    /// sections (Qwen3.5's default [11, 11, 10, 0]); the delta-net sizes; the layer kinds; the
    /// experts and the shared expert.
    fn qwen35_metadata(&self, put: &mut impl FnMut(&str, Value)) -> Result<(), LoadError> {
        let u = |n: u64| Value::U32(n as u32);
        let (rp_key, rp) = match self.json.get("rope_parameters") {
            Some(v) if !v.is_null() => ("rope_parameters", Some(v)),
            _ => (
                "rope_scaling",
                self.json.get("rope_scaling").filter(|v| !v.is_null()),
            ),
        };
        if let Some(rp) = rp {
            if !rp.is_object() {
                return Err(self.err(rp_key, format!("expected an object, found {rp}")));
            }
            let kind = rp
                .get("rope_type")
                .or_else(|| rp.get("type"))
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            if kind != "default" {
                return Err(self.err(
                    rp_key,
                    format!("rope_type '{kind}' is not supported (only default)"),
                ));
            }
        }
        let num = |field: &str| -> Result<Option<f64>, LoadError> {
            match rp.and_then(|r| r.get(field)) {
                None | Some(serde_json::Value::Null) => {}
                Some(v) => {
                    return match v.as_f64() {
                        Some(x) if x.is_finite() => Ok(Some(x)),
                        _ => Err(self.err(
                            &format!("{rp_key}.{field}"),
                            format!("expected a number, found {v}"),
                        )),
                    }
                }
            }
            Ok(self.opt_f(field)?.map(|x| x as f64))
        };
        put(
            "rope.freq_base",
            Value::F32(num("rope_theta")?.unwrap_or(10000.0) as f32),
        );
        let factor = num("partial_rotary_factor")?.unwrap_or(0.25);
        let n_rot = (self.head_dim as f64 * factor) as u64;
        if factor <= 0.0 || n_rot == 0 || n_rot > self.head_dim {
            return Err(self.err(
                "partial_rotary_factor",
                format!(
                    "{factor} of head_dim {} rotates no or too many dimensions",
                    self.head_dim
                ),
            ));
        }
        put("rope.dimension_count", u(n_rot));
        let sections = match rp.and_then(|r| r.get("mrope_section")) {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                let list = v
                    .as_array()
                    .filter(|l| l.len() <= 4)
                    .and_then(|l| l.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>())
                    .ok_or_else(|| {
                        self.err(
                            &format!("{rp_key}.mrope_section"),
                            format!("expected up to 4 non-negative integers, found {v}"),
                        )
                    })?;
                Some(list)
            }
        };
        let sections = match (sections, self.arch) {
            (Some(mut s), _) => {
                s.resize(4, 0);
                Some(s)
            }
            (None, "qwen3next") => None,
            (None, _) => Some(vec![11, 11, 10, 0]),
        };
        if let Some(s) = sections {
            put(
                "rope.dimension_sections",
                // INT32, as gguf-py's add_rope_dimension_sections writes them.
                Value::Array(crate::gguf::Array::I32(
                    s.iter().map(|&x| x.min(i32::MAX as u64) as i32).collect(),
                )),
            );
        }
        let l = self.linear;
        put("ssm.conv_kernel", u(l.conv_kernel));
        put("ssm.state_size", u(l.k_dim));
        put("ssm.group_count", u(l.k_heads));
        put("ssm.time_step_rank", u(l.v_heads));
        put("ssm.inner_size", u(l.v_dim * l.v_heads));
        // Per block, whether it is recurrent (the MTP blocks after the layers are not).
        let mut recurrent: Vec<bool> = self.attention_layers.iter().map(|&a| !a).collect();
        recurrent.resize((self.n_layer + self.n_mtp) as usize, false);
        put(
            "attention.recurrent_layers",
            Value::Array(crate::gguf::Array::Bool(recurrent)),
        );
        put(
            "full_attention_interval",
            u(self.opt_u("full_attention_interval", 1, 4096)?.unwrap_or(4)),
        );
        if self.n_mtp > 0 {
            put("nextn_predict_layers", u(self.n_mtp));
        }
        if self.arch != "qwen35" {
            put("expert_count", u(self.n_expert));
            let used = self.req_u("num_experts_per_tok", 1, self.n_expert)?;
            put("expert_used_count", u(used));
            put(
                "expert_feed_forward_length",
                u(self.req_u("moe_intermediate_size", 1, 1 << 24)?),
            );
            put(
                "expert_shared_feed_forward_length",
                u(self.req_u("shared_expert_intermediate_size", 1, 1 << 24)?),
            );
            let dense = self.json.get("mlp_only_layers").and_then(|v| v.as_array());
            if dense.is_some_and(|l| !l.is_empty())
                || self.opt_u("decoder_sparse_step", 0, 1 << 20)?.unwrap_or(1) != 1
            {
                return Err(self.err(
                    "mlp_only_layers",
                    "dense layers between MoE layers are not supported".into(),
                ));
            }
        }
        Ok(())
    }

    /// BERT's keys as llama.cpp's converter writes them (`TextModel.set_gguf_parameters`,
    /// `BertModel.set_gguf_parameters`): sizes, `context_length` (max_position_embeddings:
    /// the position table's rows), `attention.layer_norm_epsilon` (`layer_norm_eps`, Hugging
    /// Face's default 1e-12 when the config has none), `attention.causal` false and
    /// `pooling_type` (see [`Config::bert_pooling`]); `attention.head_count_kv` and
    /// `key_length` / `value_length` only when the config has `num_key_value_heads` /
    /// `head_dim`, as the converter writes them. Refused: what mollm's BERT graph (llama.cpp's)
    /// does not compute: an activation other than exact GELU, position embeddings other than
    /// absolute, a decoder.
    fn bert_metadata(&self, meta: &mut Vec<(String, Value)>) -> Result<(), LoadError> {
        let act = match self.json.get("hidden_act") {
            None | Some(serde_json::Value::Null) => "gelu",
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err("hidden_act", format!("expected a string, found {v}")))?,
        };
        if act != "gelu" {
            return Err(self.err(
                "hidden_act",
                format!("'{act}' is not supported (mollm's BERT runs gelu, as llama.cpp's)"),
            ));
        }
        let pos = match self.json.get("position_embedding_type") {
            None | Some(serde_json::Value::Null) => "absolute",
            Some(v) => v.as_str().ok_or_else(|| {
                self.err(
                    "position_embedding_type",
                    format!("expected a string, found {v}"),
                )
            })?,
        };
        if pos != "absolute" {
            return Err(self.err(
                "position_embedding_type",
                format!("'{pos}' is not supported (only absolute position embeddings)"),
            ));
        }
        for field in ["is_decoder", "add_cross_attention"] {
            if self.opt_bool(field)? == Some(true) {
                return Err(self.err(
                    field,
                    "true is not supported (mollm runs BERT as an encoder)".into(),
                ));
            }
        }
        let u = |n: u64| Value::U32(n as u32);
        let mut put = |k: &str, v: Value| meta.push((format!("bert.{k}"), v));
        put("block_count", u(self.n_layer));
        put(
            "context_length",
            u(self.req_u("max_position_embeddings", 1, 1 << 26)?),
        );
        put("embedding_length", u(self.n_embd));
        put(
            "feed_forward_length",
            u(self.req_u("intermediate_size", 1, 1 << 24)?),
        );
        put("attention.head_count", u(self.n_head));
        if self.opt_u("num_key_value_heads", 1, 4096)?.is_some() {
            put("attention.head_count_kv", u(self.n_head_kv));
        }
        if self.opt_u("head_dim", 1, 1 << 16)?.is_some() {
            put("attention.key_length", u(self.head_dim));
            put("attention.value_length", u(self.head_dim));
        }
        let eps = self.opt_f("layer_norm_eps")?.unwrap_or(1e-12);
        if eps <= 0.0 {
            return Err(self.err("layer_norm_eps", format!("{eps} is not positive")));
        }
        put("attention.layer_norm_epsilon", Value::F32(eps));
        put("attention.causal", Value::Bool(false));
        put("pooling_type", u(self.bert_pooling()?));
        meta.push(("general.architecture".into(), Value::String("bert".into())));
        Ok(())
    }

    /// llama.cpp's pooling type (1 mean, 2 CLS, 3 last token) from sentence-transformers'
    /// pooling module, as the converter's `_try_set_pooling_type` reads it: the first module of
    /// `modules.json` whose type ends with "Pooling" names a folder whose `config.json` has
    /// `pooling_mode_mean_tokens`, `pooling_mode_cls_token`, `pooling_mode_lasttoken` (checked
    /// in that order) or `pooling_mode`. Without `modules.json`, `1_Pooling/config.json` if
    /// present; without either, mean (the converter would then write no key, which llama.cpp
    /// reads as no pooling).
    fn bert_pooling(&self) -> Result<u64, LoadError> {
        const MODULES: &str = "modules.json";
        let dir = &self.dir;
        let merr = |key: String, msg: String| LoadError::Metadata {
            file: label(dir, MODULES),
            key,
            msg,
        };
        let folder = match read_json(dir, MODULES)? {
            Some(modules) => {
                let list = modules
                    .as_array()
                    .ok_or_else(|| merr("(root)".into(), "expected a list of modules".into()))?;
                let pooling = list.iter().enumerate().find(|(_, m)| {
                    m.get("type")
                        .and_then(|t| t.as_str())
                        .is_some_and(|t| t.ends_with("Pooling"))
                });
                match pooling {
                    None => None,
                    Some((i, m)) => {
                        let path = m.get("path").and_then(|p| p.as_str()).unwrap_or("");
                        // A folder inside the model directory, nothing else.
                        let inside = !path.is_empty()
                            && std::path::Path::new(path)
                                .components()
                                .all(|c| matches!(c, std::path::Component::Normal(_)));
                        if !inside {
                            return Err(merr(
                                format!("[{i}].path"),
                                format!("{path:?}: expected a folder inside the model directory"),
                            ));
                        }
                        Some(path.to_string())
                    }
                }
            }
            None => dir
                .join("1_Pooling/config.json")
                .is_file()
                .then(|| "1_Pooling".to_string()),
        };
        let Some(folder) = folder else {
            return Ok(1);
        };
        let name = format!("{folder}/config.json");
        let pcfg = read_json(dir, &name)?.ok_or_else(|| LoadError::Format {
            file: label(dir, &name),
            msg: format!("missing (the pooling module of {MODULES})"),
        })?;
        let on = |k: &str| pcfg.get(k).and_then(|v| v.as_bool()) == Some(true);
        let mode = pcfg.get("pooling_mode").and_then(|v| v.as_str());
        Ok(match () {
            _ if on("pooling_mode_mean_tokens") => 1,
            _ if on("pooling_mode_cls_token") => 2,
            _ if on("pooling_mode_lasttoken") => 3,
            _ if mode == Some("mean") => 1,
            _ if mode == Some("cls") => 2,
            _ if mode == Some("lasttoken") => 3,
            _ => {
                let on: Vec<&str> = pcfg
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, v)| k.starts_with("pooling_mode") && v.as_bool() == Some(true))
                    .map(|(k, _)| k.as_str())
                    .collect();
                return Err(LoadError::Metadata {
                    file: label(dir, &name),
                    key: on.first().copied().unwrap_or("pooling_mode").to_string(),
                    msg: format!(
                        "{}: only mean, CLS and last-token pooling are supported",
                        match (on.is_empty(), mode) {
                            (false, _) => on.join(", "),
                            (true, Some(m)) => format!("'{m}'"),
                            (true, None) => "no pooling mode set".into(),
                        }
                    ),
                });
            }
        })
    }

    /// LFM2's FFN width as llama.cpp's converter derives it: `block_ff_dim` (or
    /// `intermediate_size`), when `block_auto_adjust_ff_dim` two thirds of it, times
    /// `block_ffn_dim_multiplier`, rounded up to a multiple of `block_multiple_of`.
    fn lfm2_ff(&self) -> Result<u64, LoadError> {
        let key = match self.json.get("block_ff_dim") {
            Some(v) if !v.is_null() => "block_ff_dim",
            _ => "intermediate_size",
        };
        let mut ff = self.req_u(key, 1, 1 << 24)?;
        if self.opt_bool("block_auto_adjust_ff_dim")?.unwrap_or(false) {
            ff = (2.0 * ff as f64 / 3.0) as u64;
            if let Some(m) = self
                .json
                .get("block_ffn_dim_multiplier")
                .and_then(|v| v.as_f64())
            {
                ff = (m * ff as f64) as u64;
            }
            let multiple = self.opt_u("block_multiple_of", 1, 1 << 20)?.unwrap_or(1);
            ff = ff.div_ceil(multiple) * multiple;
        }
        if ff == 0 {
            return Err(self.err(key, "gives a feed-forward width of 0".into()));
        }
        Ok(ff)
    }

    /// Gemma 3's attention: local (sliding-window) layers with their own rope base, the
    /// layer pattern (written as llama.cpp's per-layer bool array, which it also reads), and
    /// the query scale from `query_pre_attn_scalar` (llama.cpp derives the same value from
    /// the model size).
    fn gemma3_metadata(&self, put: &mut impl FnMut(&str, Value)) -> Result<(), LoadError> {
        let act = self
            .json
            .get("hidden_activation")
            .or_else(|| self.json.get("hidden_act"))
            .and_then(|v| v.as_str())
            .unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return Err(self.err(
                "hidden_activation",
                format!("'{act}' is not supported (Gemma 3 uses gelu_pytorch_tanh)"),
            ));
        }
        for field in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if self.opt_f(field)?.is_some() {
                return Err(self.err(field, "logit soft-capping is not supported".into()));
            }
        }
        put(
            "rope.freq_base_swa",
            Value::F32(self.opt_f("rope_local_base_freq")?.unwrap_or(10000.0)),
        );
        let scalar = self
            .opt_f("query_pre_attn_scalar")?
            .unwrap_or(self.head_dim as f32);
        if scalar <= 0.0 {
            return Err(self.err("query_pre_attn_scalar", format!("{scalar} is not positive")));
        }
        put("attention.scale", Value::F32(1.0 / scalar.sqrt()));
        let n = self.n_layer as usize;
        let local: Vec<bool> =
            match self.layer_types([("sliding_attention", true), ("full_attention", false)])? {
                Some(kinds) => kinds,
                None => {
                    let pattern = match self.opt_u("sliding_window_pattern", 1, 1 << 16)? {
                        Some(p) => p,
                        None => self
                            .opt_u("_sliding_window_pattern", 1, 1 << 16)?
                            .unwrap_or(6),
                    } as usize;
                    (0..n).map(|il| (il + 1) % pattern != 0).collect()
                }
            };
        if local.iter().any(|&l| l) {
            let window = self.req_u("sliding_window", 1, 1 << 26)?;
            put("attention.sliding_window", Value::U32(window as u32));
            put(
                "attention.sliding_window_pattern",
                Value::Array(crate::gguf::Array::Bool(local)),
            );
        }
        Ok(())
    }
}
