//! Built-in plugin: GPT-2 (`GPT2LMHeadModel`).
//!
//! What sets it apart from Llama: learned absolute position embeddings
//! (`wpe`, gathered at `batch.positions`), LayerNorms with biases, biases on
//! every projection, GELU-tanh (`gelu_new`), multi-head attention without
//! rope (over the paged KV cache like every model), and the LM head tied to
//! `wte`.
//!
//! Projections are Hugging Face `Conv1D`s, whose weights are stored `[in,
//! out]`; llama.cpp's converter transposes them, so GGUF files hold the usual
//! `[out, in]`. The [`Conv1D`] module declares its weight in the checkpoint's
//! layout and multiplies accordingly — `x @ W` for safetensors, `x @ Wᵀ`
//! (the host's Linear kernel, quantized or not) for GGUF — so nothing is ever
//! copied or transposed in memory. The fused `c_attn` projection is computed
//! whole and its output split into q, k and v (a column split of an `[in,
//! out]` weight is not a row range).
//!
//! Module names are the Hugging Face ones without `transformer.`: `wte`,
//! `wpe`, `h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}`,
//! `ln_f` and (untied only) `lm_head`.

use kiln_plugin_api::adapters::{self, AdaptRequest, AdaptResponse};
use kiln_plugin_api::graph::{ops, AttentionSpec, DType, GraphIr, RaggedBatch, TensorValue};
use kiln_plugin_api::nn::{
    build_decoder_graph, Activation, Embedding, Layer, LayerNorm, Linear, Module, Registry, Weight,
};
use kiln_plugin_api::{
    ArchConfig, ConfigRequest, Encoding, Error, GraphRequest, HfConfig, KvCacheParams, Plugin,
    Result, SupportedArchitecture, Task, WeightsFormat,
};
use serde_json::Value;

/// How a projection's weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[in, out]`, Hugging Face's `Conv1D`: `y = x W + b`.
    InOut,
    /// `[out, in]`, PyTorch's `Linear` (GGUF): `y = x Wᵀ + b`.
    OutIn,
}

impl WeightLayout {
    /// The layout of a checkpoint format's projection weights.
    pub fn of(format: Option<WeightsFormat>) -> Self {
        match format {
            Some(WeightsFormat::Gguf) => WeightLayout::OutIn,
            _ => WeightLayout::InOut,
        }
    }
}

/// A projection with a bias whose weight is used in its stored layout
/// (see [`WeightLayout`]).
pub struct Conv1D {
    /// `[in, out]` or `[out, in]`, per `layout`; may be quantized.
    pub weight: Weight,
    /// `[out]`.
    pub bias: Weight,
    /// How `weight` is stored.
    pub layout: WeightLayout,
}

impl Conv1D {
    /// A projection from `in_dim` to `out_dim`.
    pub fn new(in_dim: u64, out_dim: u64, dtype: DType, layout: WeightLayout) -> Self {
        let shape = match layout {
            WeightLayout::InOut => [in_dim, out_dim],
            WeightLayout::OutIn => [out_dim, in_dim],
        };
        Self {
            weight: Weight::new("weight", dtype, &shape).quantizable(),
            bias: Weight::new("bias", dtype, &[out_dim]),
            layout,
        }
    }
}

impl Module for Conv1D {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.weight("weight", &self.weight);
        registry.weight("bias", &self.bias);
    }
}

impl Layer for Conv1D {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let graph = x.graph();
        let _scope = graph.scope(self.weight.module_path());
        let w = self.weight.value(graph);
        let y = match self.layout {
            WeightLayout::InOut => ops::matmul(x, &w),
            WeightLayout::OutIn => ops::matmul(x, &ops::transpose(&w, 0, 1)),
        };
        &y + &self.bias.value(graph)
    }
}

/// GPT-2's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Params {
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Model width (`n_embd`).
    pub hidden_size: u64,
    /// MLP width (`n_inner`, default 4 · `n_embd`).
    pub inner_size: u64,
    /// Blocks (`n_layer`).
    pub num_layers: u64,
    /// Heads (`n_head`).
    pub num_heads: u64,
    /// Head size.
    pub head_dim: u64,
    /// Learned positions (`n_positions`).
    pub max_positions: u64,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// MLP activation.
    pub activation: Activation,
    /// Scores scaled by `1/sqrt(head_dim)`.
    pub scale_attn_weights: bool,
    /// Scores of layer `i` also divided by `i + 1`.
    pub scale_attn_by_inverse_layer_idx: bool,
    /// LM head tied to `wte`.
    pub tie_word_embeddings: bool,
}

impl Gpt2Params {
    /// Reads the parameters from a Hugging Face `GPT2Config` (its own key
    /// names first, the standard ones as a fallback).
    pub fn parse(raw: &Value) -> Result<Self> {
        let config = HfConfig::new(raw)?;
        let first = |keys: &[&str]| -> Result<Option<u32>> {
            for key in keys {
                if let Some(value) = config.opt_u32(key)? {
                    return Ok(Some(value));
                }
            }
            Ok(None)
        };
        let required = |keys: &[&str]| -> Result<u64> {
            first(keys)?
                .map(u64::from)
                .ok_or_else(|| Error::invalid(format!("config.json has no `{}`", keys[0])))
        };
        let hidden_size = required(&["n_embd", "hidden_size"])?;
        let num_heads = required(&["n_head", "num_attention_heads"])?;
        if num_heads == 0 || hidden_size % num_heads != 0 {
            return Err(Error::invalid(format!(
                "config.json `n_head` ({num_heads}) must divide `n_embd` ({hidden_size})"
            )));
        }
        if let Some(kv) = config.opt_u32("num_key_value_heads")? {
            if u64::from(kv) != num_heads {
                return Err(Error::invalid(format!(
                    "GPT-2 attention has one key/value head per query head, \
                     the config has {kv} for {num_heads}"
                )));
            }
        }
        if config.opt_bool("add_cross_attention")?.unwrap_or(false) {
            return Err(Error::unsupported(
                "GPT-2 with cross-attention (`add_cross_attention`) is not supported",
            ));
        }
        let name = config
            .opt_string("activation_function")?
            .unwrap_or("gelu_new");
        let activation = Activation::from_hf_name(name).ok_or_else(|| {
            Error::unsupported(format!(
                "activation_function `{name}` is not supported \
                 (gelu_new, gelu_pytorch_tanh, gelu, relu, silu)"
            ))
        })?;
        Ok(Self {
            vocab_size: required(&["vocab_size"])?,
            hidden_size,
            inner_size: match first(&["n_inner", "intermediate_size"])? {
                Some(inner) => u64::from(inner),
                None => 4 * hidden_size,
            },
            num_layers: required(&["n_layer", "num_hidden_layers"])?,
            num_heads,
            head_dim: hidden_size / num_heads,
            max_positions: required(&["n_positions", "max_position_embeddings", "n_ctx"])?,
            eps: first_f64(&config, &["layer_norm_epsilon", "layer_norm_eps"])?.unwrap_or(1e-5)
                as f32,
            activation,
            scale_attn_weights: config.opt_bool("scale_attn_weights")?.unwrap_or(true),
            scale_attn_by_inverse_layer_idx: config
                .opt_bool("scale_attn_by_inverse_layer_idx")?
                .unwrap_or(false),
            tie_word_embeddings: config.opt_bool("tie_word_embeddings")?.unwrap_or(true),
        })
    }

    /// The KV cache shape.
    pub fn kv(&self) -> KvCacheParams {
        KvCacheParams {
            num_layers: self.num_layers as u32,
            num_kv_heads: self.num_heads as u32,
            head_dim: self.head_dim as u32,
        }
    }

    /// The model as modules of `dtype`, projections in `layout`.
    pub fn model(&self, dtype: DType, layout: WeightLayout) -> Gpt2Model {
        let norm = || LayerNorm::new(self.hidden_size, dtype, self.eps, true);
        let hidden = self.hidden_size;
        let h = (0..self.num_layers)
            .map(|layer| {
                let mut scale = if self.scale_attn_weights {
                    1.0 / (self.head_dim as f32).sqrt()
                } else {
                    1.0
                };
                if self.scale_attn_by_inverse_layer_idx {
                    scale /= (layer + 1) as f32;
                }
                Gpt2Block {
                    ln_1: norm(),
                    attn: Gpt2Attention {
                        c_attn: Conv1D::new(hidden, 3 * hidden, dtype, layout),
                        c_proj: Conv1D::new(hidden, hidden, dtype, layout),
                        num_heads: self.num_heads,
                        head_dim: self.head_dim,
                        scale,
                        layer: layer as u32,
                    },
                    ln_2: norm(),
                    mlp: Gpt2Mlp {
                        c_fc: Conv1D::new(hidden, self.inner_size, dtype, layout),
                        c_proj: Conv1D::new(self.inner_size, hidden, dtype, layout),
                        activation: self.activation,
                    },
                }
            })
            .collect();
        Gpt2Model {
            wte: Embedding::new(self.vocab_size, hidden, dtype),
            wpe: Embedding::new(self.max_positions, hidden, dtype),
            h,
            ln_f: norm(),
            lm_head: (!self.tie_word_embeddings)
                .then(|| Linear::new(hidden, self.vocab_size, dtype, false)),
        }
    }
}

fn first_f64(config: &HfConfig<'_>, keys: &[&str]) -> Result<Option<f64>> {
    for key in keys {
        if let Some(value) = config.opt_f64(key)? {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Causal multi-head self-attention without rope, over layer `layer`'s
/// paged KV cache. Sub-modules: `c_attn` (fused q, k, v), `c_proj`.
pub struct Gpt2Attention {
    /// Fused q, k, v projection (`hidden → 3·hidden`).
    pub c_attn: Conv1D,
    /// Output projection.
    pub c_proj: Conv1D,
    /// Heads.
    pub num_heads: u64,
    /// Head size.
    pub head_dim: u64,
    /// Score scale.
    pub scale: f32,
    /// Which KV-cache layer.
    pub layer: u32,
}

impl Gpt2Attention {
    /// Attention of `x [T, hidden]` for the tokens of `batch`.
    pub fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let hidden = self.num_heads * self.head_dim;
        let qkv = self.c_attn.forward(x);
        let graph = x.graph();
        let path = self.c_attn.weight.module_path();
        let _scope = graph.scope(path.rsplit_once('.').map_or("", |(parent, _)| parent));
        let parts = ops::split(&qkv, &[hidden, hidden, hidden], -1);
        let heads =
            |t: &TensorValue| ops::reshape(t, [-1, self.num_heads as i64, self.head_dim as i64]);
        let spec = AttentionSpec {
            layer: self.layer,
            scale: self.scale,
            sliding_window: None,
            softcap: None,
        };
        let attended = ops::paged_attention(
            &heads(&parts[0]),
            &heads(&parts[1]),
            &heads(&parts[2]),
            batch,
            spec,
        );
        self.c_proj
            .forward(&ops::reshape(&attended, [-1, hidden as i64]))
    }
}

impl Module for Gpt2Attention {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("c_attn", &self.c_attn);
        registry.module("c_proj", &self.c_proj);
    }
}

/// `c_proj(act(c_fc(x)))`.
pub struct Gpt2Mlp {
    /// Up projection.
    pub c_fc: Conv1D,
    /// Down projection.
    pub c_proj: Conv1D,
    /// Activation.
    pub activation: Activation,
}

impl Module for Gpt2Mlp {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("c_fc", &self.c_fc);
        registry.module("c_proj", &self.c_proj);
    }
}

impl Layer for Gpt2Mlp {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        self.c_proj
            .forward(&self.activation.apply(&self.c_fc.forward(x)))
    }
}

/// A pre-norm block: `h = x + attn(ln_1(x))`, `out = h + mlp(ln_2(h))`.
pub struct Gpt2Block {
    /// Norm before attention.
    pub ln_1: LayerNorm,
    /// Attention.
    pub attn: Gpt2Attention,
    /// Norm before the MLP.
    pub ln_2: LayerNorm,
    /// MLP.
    pub mlp: Gpt2Mlp,
}

impl Gpt2Block {
    /// The block applied to `x [T, hidden]`.
    pub fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let h = x + &self.attn.forward(&self.ln_1.forward(x), batch);
        let out = self.mlp.forward(&self.ln_2.forward(&h));
        &h + &out
    }
}

impl Module for Gpt2Block {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("ln_1", &self.ln_1);
        registry.module("attn", &self.attn);
        registry.module("ln_2", &self.ln_2);
        registry.module("mlp", &self.mlp);
    }
}

/// The whole model: embeddings, blocks, final norm, LM head.
pub struct Gpt2Model {
    /// Token embeddings.
    pub wte: Embedding,
    /// Position embeddings.
    pub wpe: Embedding,
    /// The blocks.
    pub h: Vec<Gpt2Block>,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// Output projection; `None` reuses `wte`.
    pub lm_head: Option<Linear>,
}

impl Gpt2Model {
    /// Logits `[R, vocab]` for the rows `batch.logit_rows`.
    pub fn forward(&self, batch: &RaggedBatch) -> TensorValue {
        let mut h = &self.wte.forward(&batch.tokens) + &self.wpe.forward(&batch.positions);
        for block in &self.h {
            h = block.forward(&h, batch);
        }
        // LayerNorm is per row: normalize only the rows whose logits are wanted.
        let last = self.ln_f.forward(&ops::gather(&h, &batch.logit_rows, 0));
        match &self.lm_head {
            Some(head) => head.forward(&last),
            None => {
                let graph = h.graph();
                let _scope = graph.scope("lm_head");
                ops::matmul(&last, &ops::transpose(&self.wte.weight.value(graph), 0, 1))
            }
        }
    }
}

impl Module for Gpt2Model {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("wte", &self.wte);
        registry.module("wpe", &self.wpe);
        registry.list("h", &self.h);
        registry.module("ln_f", &self.ln_f);
        registry.optional("lm_head", self.lm_head.as_ref().map(|m| m as &dyn Module));
    }
}

/// Parses the config: KV shape and sequence limit (and checks the rest).
pub fn gpt2_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let params = Gpt2Params::parse(&request.hf_config)?;
    let limit = u32::try_from(params.max_positions)
        .map_err(|_| Error::invalid("config.json `n_positions` is too large"))?;
    let max_seq_len = match request.max_length {
        None => limit,
        Some(0) => return Err(Error::invalid("--max-length must be at least 1")),
        Some(n) if n > limit => {
            return Err(Error::invalid(format!(
                "--max-length {n} exceeds the model's limit of {limit} tokens"
            )))
        }
        Some(n) => n,
    };
    Ok(ArchConfig {
        max_seq_len,
        kv: params.kv(),
        model: request.hf_config.clone(),
    })
}

/// The GPT-2 graph: ragged-batch inputs in, logits out.
pub fn gpt2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let params = Gpt2Params::parse(&request.config.model)?;
    let model = params.model(DType::F32, WeightLayout::of(request.weights_format));
    build_decoder_graph("gpt2", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

/// Hugging Face names: `transformer.` stripped (the original checkpoints have
/// none), the causal-mask buffers `attn.bias` / `attn.masked_bias` dropped.
pub fn gpt2_hf_name(name: &str) -> Option<String> {
    let name = name.strip_prefix("transformer.").unwrap_or(name);
    if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return None;
    }
    Some(name.to_owned())
}

/// llama.cpp's GPT-2 names mapped to the module names.
pub fn gpt2_gguf_name(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("wte.weight"),
        "position_embd.weight" => Some("wpe.weight"),
        "output_norm.weight" => Some("ln_f.weight"),
        "output_norm.bias" => Some("ln_f.bias"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_owned());
    }
    let (layer, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    layer.parse::<u32>().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "ln_1",
        "attn_qkv" => "attn.c_attn",
        "attn_output" => "attn.c_proj",
        "ffn_norm" => "ln_2",
        "ffn_up" => "mlp.c_fc",
        "ffn_down" => "mlp.c_proj",
        _ => return None,
    };
    Some(format!("h.{layer}.{module}.{suffix}"))
}

/// Safetensors: [`gpt2_hf_name`]; a stored `lm_head.weight` of a tied model
/// (a copy of `wte`) is left unused.
pub fn adapt_safetensors(request: &AdaptRequest) -> Result<AdaptResponse> {
    let tied = Gpt2Params::parse(&request.config)?.tie_word_embeddings;
    Ok(adapters::rename(request, |name| {
        gpt2_hf_name(name).filter(|n| !(tied && n == "lm_head.weight"))
    }))
}

/// GGUF: [`gpt2_gguf_name`].
pub fn adapt_gguf(request: &AdaptRequest) -> Result<AdaptResponse> {
    Ok(adapters::rename(request, gpt2_gguf_name))
}

/// The plugin.
pub fn plugin() -> Plugin {
    Plugin::new("gpt2", env!("CARGO_PKG_VERSION")).with_architecture(
        SupportedArchitecture::new("GPT2LMHeadModel", Task::TextGeneration)
            .with_aliases(["gpt2"])
            .with_encodings(Encoding::Float32, Encoding::ALL.iter().copied())
            .with_default_weights_format(WeightsFormat::Safetensors)
            .with_example_repo_ids(["openai-community/gpt2"])
            .with_config(gpt2_config)
            .with_graph(gpt2_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_safetensors)
            .with_weight_adapter(WeightsFormat::Gguf, adapt_gguf),
    )
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_api::adapters::CheckpointTensor;
    use kiln_plugin_api::graph::Op;
    use serde_json::json;

    /// `openai-community/gpt2`'s config.json.
    fn gpt2_small() -> Value {
        json!({
            "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
            "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
            "n_head": 12, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257
        })
    }

    fn graph(format: Option<WeightsFormat>) -> GraphIr {
        let config = gpt2_config(&ConfigRequest {
            hf_config: gpt2_small(),
            max_length: None,
        })
        .unwrap();
        gpt2_graph(&GraphRequest {
            config,
            weights_format: format,
            state_dict: None,
            task: None,
        })
        .unwrap()
    }

    #[test]
    fn parses_gpt2_small() {
        let config = gpt2_config(&ConfigRequest {
            hf_config: gpt2_small(),
            max_length: Some(512),
        })
        .unwrap();
        assert_eq!(config.max_seq_len, 512);
        assert_eq!(
            config.kv,
            KvCacheParams {
                num_layers: 12,
                num_kv_heads: 12,
                head_dim: 64
            }
        );
        let params = Gpt2Params::parse(&gpt2_small()).unwrap();
        assert_eq!(params.inner_size, 3072);
        assert!(params.tie_word_embeddings);
        assert_eq!(params.activation, Activation::GeluTanh);
    }

    #[test]
    fn projections_multiply_in_their_stored_layout() {
        for (format, shape, transposed) in [
            (Some(WeightsFormat::Safetensors), [768, 2304], false),
            (Some(WeightsFormat::Gguf), [2304, 768], true),
        ] {
            let ir = graph(format);
            let index = ir
                .weights
                .iter()
                .position(|w| w.name == "h.3.attn.c_attn.weight")
                .unwrap();
            assert_eq!(ir.weights[index].shape, shape);
            let weight = ir
                .nodes
                .iter()
                .position(|n| n.op == Op::Weight { index })
                .unwrap() as u32;
            let user = ir
                .nodes
                .iter()
                .find(|n| n.inputs.contains(&weight))
                .unwrap();
            match transposed {
                true => assert_eq!(user.op, Op::Permute { perm: vec![1, 0] }),
                false => assert_eq!(user.op, Op::MatMul),
            }
        }
        let names: Vec<String> = graph(None).weights.into_iter().map(|w| w.name).collect();
        assert!(names.contains(&"wpe.weight".to_owned()));
        assert!(names.contains(&"h.11.mlp.c_proj.bias".to_owned()));
        assert!(!names.iter().any(|n| n.starts_with("lm_head")), "tied");
        // wte, wpe, ln_f (2) + 12 blocks × (2 norms × 2 + 4 projections × 2).
        assert_eq!(names.len(), 4 + 12 * 12);
    }

    #[test]
    fn hugging_face_and_gguf_names_meet_in_one_module_tree() {
        for (gguf, hf) in [
            ("token_embd.weight", "transformer.wte.weight"),
            ("position_embd.weight", "wpe.weight"),
            ("blk.0.attn_norm.bias", "transformer.h.0.ln_1.bias"),
            (
                "blk.0.attn_qkv.weight",
                "transformer.h.0.attn.c_attn.weight",
            ),
            ("blk.0.attn_output.bias", "h.0.attn.c_proj.bias"),
            ("blk.11.ffn_norm.weight", "transformer.h.11.ln_2.weight"),
            ("blk.11.ffn_up.weight", "transformer.h.11.mlp.c_fc.weight"),
            ("blk.11.ffn_down.bias", "transformer.h.11.mlp.c_proj.bias"),
            ("output_norm.bias", "transformer.ln_f.bias"),
            ("output.weight", "lm_head.weight"),
        ] {
            assert_eq!(gpt2_gguf_name(gguf), gpt2_hf_name(hf), "{gguf}");
        }
        assert_eq!(gpt2_hf_name("h.0.attn.bias"), None);
        assert_eq!(gpt2_hf_name("transformer.h.0.attn.masked_bias"), None);
        assert_eq!(gpt2_gguf_name("blk.0.attn_q.weight"), None);

        let tensor = |name: &str| CheckpointTensor {
            name: name.into(),
            shape: vec![1],
            storage: "F32".into(),
            encoding: Some(Encoding::Float32),
        };
        let request = AdaptRequest {
            format: WeightsFormat::Safetensors,
            tensors: vec![
                tensor("h.0.attn.bias"),
                tensor("lm_head.weight"),
                tensor("wte.weight"),
            ],
            config: gpt2_small(),
        };
        let names: Vec<String> = adapt_safetensors(&request)
            .unwrap()
            .weights
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["wte.weight"]);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let mut config = gpt2_small();
        config["activation_function"] = json!("swish");
        let error = Gpt2Params::parse(&config).unwrap_err().to_string();
        assert!(error.contains("`swish`"), "{error}");
        let mut config = gpt2_small();
        config["add_cross_attention"] = json!(true);
        assert!(Gpt2Params::parse(&config).is_err());
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
