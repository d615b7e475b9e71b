use crate::error::{EngineError, Result};
use loader::ModelFile;

/// Hyper-parameters of a decoder-only model, from GGUF `{arch}.*` keys.
#[derive(Clone, Debug)]
pub struct HParams {
    pub arch: String,
    pub n_layer: usize,
    /// Multi-token-prediction blocks stored after the `n_layer` the model runs
    /// (`nextn_predict_layers`): their tensors are in the file, unused.
    pub n_layer_mtp: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub rope_freq_scale: f32,
    /// Sliding-window length for the layers that use one (0: none).
    pub n_swa: usize,
    pub rope_base_swa: f32,
    /// Per layer: does it use the sliding window?
    pub swa_layers: Vec<bool>,
    /// The query scale, where the file names one (Hugging Face Gemma 3's
    /// `query_pre_attn_scalar`); otherwise each graph's own default.
    pub attn_scale: Option<f32>,
    /// Mixture of experts (0: a dense FFN): routed experts, how many each token uses, their
    /// FFN width, and whether the selected experts' weights are renormalized to sum to 1.
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub expert_weights_norm: bool,
    /// Per layer: its KV heads, where the file gives them per layer (LFM2: 0 for a layer
    /// without attention); otherwise `n_head_kv` for every layer.
    pub n_head_kv_layers: Vec<usize>,
    /// LFM2's short convolution: its length in tokens (`shortconv.l_cache`; 0: none).
    pub shortconv_l_cache: usize,
    /// Layers before the first MoE layer (`leading_dense_block_count`; LFM2-MoE).
    pub n_layer_dense_lead: usize,
    /// The router's gating as llama.cpp numbers it (`expert_gating_func`: 1 softmax, 2
    /// sigmoid; 0 when the file names none).
    pub expert_gating: usize,
    /// The shared expert's width (`expert_shared_feed_forward_length`; 0: none named).
    pub n_ff_shexp: usize,
    /// Qwen3.5/Qwen3-Next's gated delta-net layers (`ssm.*`).
    pub ssm: Option<Ssm>,
    /// Per layer: a recurrent (delta-net) layer rather than attention (Qwen3.5/Qwen3-Next:
    /// `attention.recurrent_layers`, or every layer but each `full_attention_interval`-th).
    pub recurrent_layers: Vec<bool>,
    /// `rope.dimension_sections` (Qwen3.5's multi-section rope; empty when the file has none).
    pub rope_sections: Vec<usize>,
    /// RWKV-7's head size (`wkv.head_size`; 0 for other models).
    pub wkv_head_size: usize,
    /// How the model pools embeddings, where it says (`pooling_type`, llama.cpp's numbers:
    /// 0 none, 1 mean, 2 CLS, 3 last token); graphs keep it as the constant `pooling_type`.
    pub pooling_type: Option<usize>,
}

/// The gated delta-net's sizes (llama.cpp's `ssm_*` hyper-parameters).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ssm {
    /// Convolution length in tokens (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Head size of keys and values (`ssm.state_size`).
    pub head_dim: usize,
    /// Key (and query) heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub v_heads: usize,
}

impl Ssm {
    /// Channels of the convolution: q and k of every key head, v of every value head.
    pub fn conv_channels(&self) -> usize {
        (2 * self.k_heads + self.v_heads) * self.head_dim
    }
}

impl HParams {
    /// What the engine needs to know of a model that brings its own graph: the sizes the
    /// graph names as constants (the graph itself holds everything else).
    pub fn from_graph(g: &crate::graph::GraphFile, file: &ModelFile) -> Result<HParams> {
        let c = |k: &str| -> Result<usize> {
            g.consts
                .get(k)
                .filter(|&&v| v > 0 && v < 1 << 40)
                .map(|&v| v as usize)
                .ok_or_else(|| EngineError::Model {
                    file: file.path.display().to_string(),
                    msg: format!("graph constant '{k}' is missing or not a positive size"),
                })
        };
        let n_layer = c("n_layer")?;
        Ok(HParams {
            arch: g.arch.clone(),
            n_layer,
            n_layer_mtp: 0,
            n_embd: c("n_embd")?,
            n_ff: c("n_ff").unwrap_or(0),
            n_head: c("n_head")?,
            n_head_kv: c("n_head_kv")?,
            head_dim: c("head_dim")?,
            n_rot: c("head_dim")?,
            n_vocab: c("n_vocab")?,
            n_ctx_train: c("n_ctx_train").unwrap_or(2048),
            eps: 0.0,
            rope_base: 0.0,
            rope_freq_scale: 1.0,
            n_swa: 0,
            rope_base_swa: 0.0,
            swa_layers: vec![false; n_layer],
            attn_scale: None,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            expert_weights_norm: false,
            n_head_kv_layers: vec![c("n_head_kv")?; n_layer],
            shortconv_l_cache: 0,
            n_layer_dense_lead: 0,
            expert_gating: 0,
            n_ff_shexp: 0,
            ssm: None,
            recurrent_layers: vec![false; n_layer],
            rope_sections: Vec::new(),
            wkv_head_size: 0,
            pooling_type: g.consts.get("pooling_type").map(|&v| v.max(0) as usize),
        })
    }

    pub fn from_gguf(g: &ModelFile) -> Result<HParams> {
        let file = g.path.display().to_string();
        let err = |msg: String| EngineError::Model {
            file: file.clone(),
            msg,
        };
        let arch = g.architecture()?.to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let req_u = |k: &str| -> Result<usize> {
            g.get_u64(&key(k))?
                .map(|v| v as usize)
                .ok_or_else(|| err(format!("missing metadata key '{}'", key(k))))
        };
        let opt_u =
            |k: &str| -> Result<Option<usize>> { Ok(g.get_u64(&key(k))?.map(|v| v as usize)) };
        let opt_f = |k: &str| -> Result<Option<f32>> { Ok(g.get_f32(&key(k))?) };

        if arch == "rwkv7" {
            return rwkv7(g, &arch);
        }
        let n_layer_all = req_u("block_count")?;
        // Multi-token-prediction blocks follow the trunk; the main graph does not run them.
        let n_layer_mtp = opt_u("nextn_predict_layers")?.unwrap_or(0);
        let n_layer = n_layer_all.saturating_sub(n_layer_mtp);
        if n_layer == 0 || n_layer_all > 1024 {
            return Err(err(format!(
                "implausible shape: {n_layer_all} layers, {n_layer_mtp} of them for multi-token prediction"
            )));
        }
        // A count per layer, or one for all (llama.cpp's get_key_or_arr).
        let per_layer = |k: &str| -> Result<Option<Vec<usize>>> {
            use loader::{Array, Value};
            let list: Vec<u64> = match g.get(&key(k)) {
                None => return Ok(None),
                Some(Value::Array(Array::U32(a))) => a.iter().map(|&x| x as u64).collect(),
                Some(Value::Array(Array::I32(a))) => a.iter().map(|&x| x.max(0) as u64).collect(),
                Some(Value::Array(Array::U64(a))) => a.clone(),
                Some(Value::Array(_)) => {
                    return Err(err(format!("'{}' must be integers", key(k))));
                }
                Some(_) => return Ok(Some(vec![req_u(k)?; n_layer])),
            };
            if list.len() != n_layer && list.len() != n_layer_all {
                return Err(err(format!(
                    "'{}' has {} entries for {n_layer_all} layers",
                    key(k),
                    list.len()
                )));
            }
            Ok(Some(list[..n_layer].iter().map(|&x| x as usize).collect()))
        };
        let n_embd = req_u("embedding_length")?;
        let n_ff = req_u("feed_forward_length")?;
        let heads = per_layer("attention.head_count")?.ok_or_else(|| {
            err(format!(
                "missing metadata key '{}'",
                key("attention.head_count")
            ))
        })?;
        let n_head = heads.iter().copied().find(|&h| h > 0).unwrap_or(0);
        let n_head_kv_layers = per_layer("attention.head_count_kv")?.unwrap_or(heads.clone());
        let n_head_kv = n_head_kv_layers
            .iter()
            .copied()
            .find(|&h| h > 0)
            .unwrap_or(n_head);
        let bad_layer = (0..n_layer).find(|&il| {
            let (h, kv) = (heads[il], n_head_kv_layers[il]);
            (kv > 0 && (h != n_head || h % kv != 0)) || (kv == 0 && h != 0 && h != n_head)
        });
        if n_embd == 0
            || n_head == 0
            || n_head_kv == 0
            || n_head % n_head_kv != 0
            || bad_layer.is_some()
        {
            return Err(err(format!(
                "implausible shape: {n_layer} layers, {n_embd} wide, {n_head} heads / {n_head_kv} kv heads{}",
                bad_layer.map(|il| format!(" (layer {il}: {} heads / {} kv heads)", heads[il], n_head_kv_layers[il])).unwrap_or_default()
            )));
        }
        let shortconv_l_cache = opt_u("shortconv.l_cache")?.unwrap_or(0);
        if n_head_kv_layers.contains(&0) && !(2..=64).contains(&shortconv_l_cache) {
            return Err(err(format!(
                "layers without attention need '{}' in 2..=64, got {shortconv_l_cache}",
                key("shortconv.l_cache")
            )));
        }
        let head_dim = opt_u("attention.key_length")?.unwrap_or(n_embd / n_head);
        let n_rot = opt_u("rope.dimension_count")?.unwrap_or(head_dim);
        // RMS norms' epsilon, or LayerNorms' (BERT).
        let eps = match opt_f("attention.layer_norm_rms_epsilon")? {
            Some(e) => e,
            None => opt_f("attention.layer_norm_epsilon")?.ok_or_else(|| {
                err(format!(
                    "missing metadata key '{}'",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })?,
        };
        let pooling_type = opt_u("pooling_type")?;
        if pooling_type.is_some_and(|p| p > 3) {
            return Err(err(format!(
                "'{}' is {}: mollm pools by none (0), mean (1), CLS (2) or the last token (3)",
                key("pooling_type"),
                pooling_type.unwrap_or(0)
            )));
        }
        let rope_base = opt_f("rope.freq_base")?.unwrap_or(10000.0);
        let mut rope_freq_scale = 1.0;
        if let Some(kind) = g.get_str(&key("rope.scaling.type"))? {
            match kind {
                "none" => {}
                "linear" => {
                    let f = opt_f("rope.scaling.factor")?.unwrap_or(1.0);
                    if f > 0.0 {
                        rope_freq_scale = 1.0 / f;
                    }
                }
                other => return Err(err(format!("rope scaling '{other}' is not supported yet"))),
            }
        }
        let n_vocab = match g.tensor("token_embd.weight") {
            Some(t) if t.shape.len() == 2 => t.shape[1] as usize,
            _ => return Err(err("missing tensor 'token_embd.weight'".into())),
        };
        let n_ctx_train = opt_u("context_length")?.unwrap_or(2048);

        let n_swa = opt_u("attention.sliding_window")?.unwrap_or(0);
        // llama.cpp's default for Gemma 3: five local layers, then one global, unless the file
        // names a pattern; local layers use rope base 10000 unless the file says otherwise.
        // The pattern is either a period or, as llama.cpp also reads it, one flag per layer
        // (bools, or integers as llama.cpp's own writers store them).
        let pattern_key = key("attention.sliding_window_pattern");
        let swa_layers = match g.get(&pattern_key) {
            Some(loader::Value::Array(_)) => {
                let list = g.get_flag_array(&pattern_key)?.unwrap_or_default();
                if list.len() != n_layer && list.len() != n_layer_all {
                    return Err(err(format!(
                        "'{pattern_key}' has {} entries for {n_layer_all} layers",
                        list.len()
                    )));
                }
                list[..n_layer].iter().map(|&l| n_swa > 0 && l).collect()
            }
            _ => {
                let pattern = opt_u("attention.sliding_window_pattern")?.unwrap_or(6);
                (0..n_layer)
                    .map(|il| n_swa > 0 && (pattern == 0 || il % pattern < pattern - 1))
                    .collect()
            }
        };
        let attn_scale = opt_f("attention.scale")?;
        let rope_base_swa = opt_f("rope.freq_base_swa")?.unwrap_or(10000.0);

        let n_expert = opt_u("expert_count")?.unwrap_or(0);
        let n_expert_used = opt_u("expert_used_count")?.unwrap_or(0);
        // The experts' width: llama.cpp's llama (Mixtral) uses feed_forward_length, qwen2moe
        // feed_forward_length / expert_used_count when the file names none.
        let n_ff_exp = match opt_u("expert_feed_forward_length")? {
            Some(w) => w,
            None if arch == "llama" => n_ff,
            None if arch == "qwen2moe" && n_expert_used > 0 => n_ff / n_expert_used,
            None => 0,
        };
        if n_expert > 0
            && (n_expert > 4096 || n_expert_used == 0 || n_expert_used > n_expert || n_ff_exp == 0)
        {
            return Err(err(format!(
                "implausible experts: {n_expert_used} of {n_expert} used, {n_ff_exp} wide"
            )));
        }
        // llama.cpp renormalizes Qwen3-MoE's top-k weights unless the file says otherwise.
        let expert_weights_norm = g.get_bool(&key("expert_weights_norm"))?.unwrap_or(true);

        let n_layer_dense_lead = opt_u("leading_dense_block_count")?.unwrap_or(0);
        let expert_gating = opt_u("expert_gating_func")?.unwrap_or(0);
        let n_ff_shexp = opt_u("expert_shared_feed_forward_length")?.unwrap_or(0);
        let (ssm, recurrent_layers) = match g.get(&key("ssm.conv_kernel")) {
            Some(_) => delta_net_layers(g, &arch, n_layer)?,
            None => (None, vec![false; n_layer]),
        };
        let rope_sections = match g.get(&key("rope.dimension_sections")) {
            None => Vec::new(),
            Some(_) => {
                let list = g
                    .get_i32_array(&key("rope.dimension_sections"))
                    .map(|a| a.map(|a| a.iter().map(|&x| x.max(0) as usize).collect()));
                match list {
                    Ok(l) => l.unwrap_or_default(),
                    Err(_) => per_u32(g, &key("rope.dimension_sections"))?,
                }
            }
        };
        Ok(HParams {
            arch,
            n_layer,
            n_layer_mtp,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            n_vocab,
            n_ctx_train,
            eps,
            rope_base,
            rope_freq_scale,
            n_swa,
            rope_base_swa,
            swa_layers,
            attn_scale,
            n_expert,
            n_expert_used,
            n_ff_exp,
            expert_weights_norm,
            n_head_kv_layers,
            shortconv_l_cache,
            n_layer_dense_lead,
            expert_gating,
            n_ff_shexp,
            ssm,
            recurrent_layers,
            rope_sections,
            wkv_head_size: 0,
            pooling_type,
        })
    }
}

/// An array of unsigned integers (`rope.dimension_sections` as some writers store it).
fn per_u32(g: &ModelFile, key: &str) -> Result<Vec<usize>> {
    use loader::{Array, Value};
    match g.get(key) {
        Some(Value::Array(Array::U32(a))) => Ok(a.iter().map(|&x| x as usize).collect()),
        _ => Err(EngineError::Model {
            file: g.path.display().to_string(),
            msg: format!("'{key}' must be an array of integers"),
        }),
    }
}

/// The delta-net sizes and which layers are recurrent, as llama.cpp's qwen35/qwen3next
/// loaders read them; sizes that do not fit together are refused naming the keys.
fn delta_net_layers(g: &ModelFile, arch: &str, n_layer: usize) -> Result<(Option<Ssm>, Vec<bool>)> {
    let keys = Keys::new(g, arch);
    let (err, key, req) = (|m| keys.err(m), |k| keys.key(k), |k| keys.req(k));
    let ssm = Ssm {
        conv_kernel: req("ssm.conv_kernel")?,
        head_dim: req("ssm.state_size")?,
        k_heads: req("ssm.group_count")?,
        v_heads: req("ssm.time_step_rank")?,
    };
    let inner = req("ssm.inner_size")?;
    if !(2..=64).contains(&ssm.conv_kernel) {
        return Err(err(format!(
            "'{}' is {}, expected 2..=64",
            key("ssm.conv_kernel"),
            ssm.conv_kernel
        )));
    }
    if ssm.head_dim == 0 || ssm.head_dim > 1024 || ssm.k_heads == 0 || ssm.v_heads > 4096 {
        return Err(err(format!(
            "implausible delta-net sizes: '{}' {}, '{}' {}, '{}' {}",
            key("ssm.state_size"),
            ssm.head_dim,
            key("ssm.group_count"),
            ssm.k_heads,
            key("ssm.time_step_rank"),
            ssm.v_heads
        )));
    }
    if ssm.v_heads % ssm.k_heads != 0 || inner != ssm.v_heads * ssm.head_dim {
        return Err(err(format!(
            "'{}' {inner} must be '{}' {} value heads of '{}' {} each, the heads a multiple of '{}' {}",
            key("ssm.inner_size"),
            key("ssm.time_step_rank"),
            ssm.v_heads,
            key("ssm.state_size"),
            ssm.head_dim,
            key("ssm.group_count"),
            ssm.k_heads
        )));
    }
    let layers_key = key("attention.recurrent_layers");
    let recurrent = match g.get(&layers_key) {
        Some(loader::Value::Array(_)) => {
            let list = g.get_flag_array(&layers_key)?.unwrap_or_default();
            if list.len() < n_layer {
                return Err(err(format!(
                    "'{layers_key}' has {} entries for {n_layer} layers",
                    list.len()
                )));
            }
            list[..n_layer].to_vec()
        }
        Some(_) => vec![g.get_u64(&layers_key)?.unwrap_or(0) != 0; n_layer],
        None => {
            let every = g.get_u64(&key("full_attention_interval"))?.unwrap_or(4) as usize;
            if every == 0 {
                return Err(err(format!("'{}' is 0", key("full_attention_interval"))));
            }
            (0..n_layer).map(|il| (il + 1) % every != 0).collect()
        }
    };
    Ok((Some(ssm), recurrent))
}

/// RWKV-7's hyper-parameters, as llama.cpp's `rwkv7` loader reads them: no attention heads in
/// the file (`attention.head_count` 0), `wkv.head_size` dividing the width, LayerNorm's
/// `attention.layer_norm_epsilon`, a token shift over 2 (the one `token_shift_count` it runs).
fn rwkv7(g: &ModelFile, arch: &str) -> Result<HParams> {
    let keys = Keys::new(g, arch);
    let (err, key, req) = (|m| keys.err(m), |k| keys.key(k), |k| keys.req(k));
    let n_layer = req("block_count")?;
    let n_embd = req("embedding_length")?;
    let n_ff = req("feed_forward_length")?;
    let head = req("wkv.head_size")?;
    if n_layer == 0 || n_layer > 1024 || n_embd == 0 || n_ff == 0 {
        return Err(err(format!(
            "implausible shape: {n_layer} layers, {n_embd} wide, FFN {n_ff}"
        )));
    }
    if head == 0 || head > 1024 || n_embd % head != 0 {
        return Err(err(format!(
            "'{}' {head} must divide '{}' {n_embd} (at most 1024)",
            key("wkv.head_size"),
            key("embedding_length")
        )));
    }
    let shift = g.get_u64(&key("token_shift_count"))?.unwrap_or(2);
    if shift != 2 {
        return Err(err(format!(
            "'{}' is {shift}; RWKV-7 shifts by 2 (llama.cpp runs no other)",
            key("token_shift_count")
        )));
    }
    let eps = g
        .get_f32(&key("attention.layer_norm_epsilon"))?
        .ok_or_else(|| {
            err(format!(
                "missing metadata key '{}'",
                key("attention.layer_norm_epsilon")
            ))
        })?;
    let n_vocab = match g.tensor("token_embd.weight") {
        Some(t) if t.shape.len() == 2 => t.shape[1] as usize,
        _ => return Err(err("missing tensor 'token_embd.weight'".into())),
    };
    let n_head = n_embd / head;
    Ok(HParams {
        arch: arch.to_string(),
        n_layer,
        n_layer_mtp: 0,
        n_embd,
        n_ff,
        n_head,
        n_head_kv: n_head,
        head_dim: head,
        n_rot: 0,
        n_vocab,
        // The converter writes 1048576: a recurrence has no trained context length.
        n_ctx_train: g.get_u64(&key("context_length"))?.unwrap_or(2048) as usize,
        eps,
        rope_base: 0.0,
        rope_freq_scale: 1.0,
        n_swa: 0,
        rope_base_swa: 0.0,
        swa_layers: vec![false; n_layer],
        attn_scale: None,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        expert_weights_norm: false,
        n_head_kv_layers: vec![0; n_layer],
        shortconv_l_cache: 0,
        n_layer_dense_lead: 0,
        expert_gating: 0,
        n_ff_shexp: 0,
        ssm: None,
        recurrent_layers: vec![true; n_layer],
        rope_sections: Vec::new(),
        wkv_head_size: head,
        pooling_type: None,
    })
}

/// An architecture's metadata keys (`{arch}.{k}`) and the errors naming them and the file.
struct Keys<'a> {
    g: &'a ModelFile,
    arch: &'a str,
    file: String,
}

impl<'a> Keys<'a> {
    fn new(g: &'a ModelFile, arch: &'a str) -> Keys<'a> {
        let file = g.path.display().to_string();
        Keys { g, arch, file }
    }
    fn err(&self, msg: String) -> EngineError {
        EngineError::Model {
            file: self.file.clone(),
            msg,
        }
    }
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    /// A required unsigned key.
    fn req(&self, k: &str) -> Result<usize> {
        self.g
            .get_u64(&self.key(k))?
            .map(|v| v as usize)
            .ok_or_else(|| self.err(format!("missing metadata key '{}'", self.key(k))))
    }
}
