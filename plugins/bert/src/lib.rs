//! Built-in plugin: BERT-family encoders (`BertModel`), for embeddings.
//!
//! The model is the plugin API's [`Encoder`]: word, position and token-type
//! embeddings summed and normalized, then post-norm layers of bidirectional
//! attention within each text and a plain MLP. The graph's output is every
//! token's last hidden state; the host pools it into one vector per text as
//! the checkpoint's sentence-transformers config says (mean, CLS, …) and
//! normalizes it when that config does.
//!
//! Checkpoint names are Hugging Face's `BertModel` ones; a `bert.` prefix
//! (task heads such as `BertForMaskedLM`) is stripped, the heads and the
//! pooler (`pooler.*`, `cls.*`) are dropped, and the old `LayerNorm.gamma` /
//! `.beta` spelling is read as `weight` / `bias`.

use kiln_plugin_api::adapters;
use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{build_encoder_graph, Activation, Encoder, EncoderConfig};
use kiln_plugin_api::{
    ArchConfig, ConfigRequest, Encoding, Error, GraphRequest, HfConfig, KvCacheParams, Plugin,
    Result, SupportedArchitecture, Task, WeightsFormat,
};
use serde_json::Value;

/// Reads a `BertConfig`, refusing the switches this encoder does not have.
pub fn bert_params(raw: &Value) -> Result<EncoderConfig> {
    let config = HfConfig::new(raw)?;
    if config.opt_bool("is_decoder")?.unwrap_or(false)
        || config.opt_bool("add_cross_attention")?.unwrap_or(false)
    {
        return Err(Error::invalid(
            "config.json sets `is_decoder` or `add_cross_attention`: only BERT encoders are supported",
        ));
    }
    match config.opt_string("position_embedding_type")? {
        None | Some("absolute") => {}
        Some(other) => {
            return Err(Error::invalid(format!(
                "config.json `position_embedding_type` `{other}` is not supported (only `absolute`)"
            )))
        }
    }
    let act = config.opt_string("hidden_act")?.unwrap_or("gelu");
    let activation = Activation::from_hf_name(act).ok_or_else(|| {
        Error::invalid(format!(
            "config.json `hidden_act` `{act}` is not supported (gelu, gelu_new, relu, silu)"
        ))
    })?;
    let hidden_size = u64::from(config.u32("hidden_size")?);
    let num_heads = u64::from(config.u32("num_attention_heads")?);
    if num_heads == 0 || hidden_size % num_heads != 0 {
        return Err(Error::invalid(format!(
            "config.json `num_attention_heads` ({num_heads}) must divide `hidden_size` ({hidden_size})"
        )));
    }
    Ok(EncoderConfig {
        vocab_size: u64::from(config.u32("vocab_size")?),
        hidden_size,
        num_layers: u64::from(config.u32("num_hidden_layers")?),
        num_heads,
        intermediate_size: u64::from(config.u32("intermediate_size")?),
        max_positions: u64::from(config.u32("max_position_embeddings")?),
        type_vocab_size: u64::from(config.opt_u32("type_vocab_size")?.unwrap_or(2)),
        eps: config.opt_f64("layer_norm_eps")?.unwrap_or(1e-12) as f32,
        activation,
        dtype: DType::F32,
    })
}

/// Parses the config: the sequence limit (positions), and no KV cache.
pub fn bert_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let params = bert_params(&request.hf_config)?;
    let config = HfConfig::new(&request.hf_config)?;
    Ok(ArchConfig {
        max_seq_len: config.max_seq_len(request.max_length)?,
        kv: KvCacheParams {
            num_layers: 0,
            num_kv_heads: params.num_heads as u32,
            head_dim: (params.hidden_size / params.num_heads) as u32,
        },
        model: request.hf_config.clone(),
    })
}

/// The BERT graph: token ids in, every token's last hidden state out.
pub fn bert_graph(request: &GraphRequest) -> Result<GraphIr> {
    let model = Encoder::new(&bert_params(&request.config.model)?);
    build_encoder_graph("bert", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

/// Hugging Face names as the module tree has them (see the crate docs).
pub fn bert_hf_name(name: &str) -> Option<String> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if name.starts_with("pooler.") || name.starts_with("cls.") || name.ends_with("position_ids") {
        return None;
    }
    let name = match name.rsplit_once('.') {
        Some((module, "gamma")) if module.ends_with("LayerNorm") => format!("{module}.weight"),
        Some((module, "beta")) if module.ends_with("LayerNorm") => format!("{module}.bias"),
        _ => name.to_owned(),
    };
    Some(name)
}

/// The plugin.
pub fn plugin() -> Plugin {
    Plugin::new("bert", env!("CARGO_PKG_VERSION")).with_architecture(
        SupportedArchitecture::new("BertModel", Task::Embeddings)
            .with_aliases(["bert"])
            .with_encodings(Encoding::Float32, Encoding::ALL.iter().copied())
            .with_example_repo_ids(["sentence-transformers/all-MiniLM-L6-v2"])
            .with_config(bert_config)
            .with_graph(bert_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, |r| {
                Ok(adapters::rename(r, bert_hf_name))
            }),
    )
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minilm() -> Value {
        json!({
            "architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
            "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
            "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6,
            "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522
        })
    }

    #[test]
    fn names_lose_their_prefix_heads_and_old_spellings() {
        assert_eq!(
            bert_hf_name("bert.encoder.layer.0.attention.self.query.weight").as_deref(),
            Some("encoder.layer.0.attention.self.query.weight")
        );
        assert_eq!(
            bert_hf_name("embeddings.LayerNorm.gamma").as_deref(),
            Some("embeddings.LayerNorm.weight")
        );
        assert_eq!(bert_hf_name("pooler.dense.weight"), None);
        assert_eq!(bert_hf_name("cls.predictions.bias"), None);
        assert_eq!(bert_hf_name("embeddings.position_ids"), None);
    }

    #[test]
    fn every_checkpoint_weight_has_a_module() {
        let names: Vec<String> = {
            use kiln_plugin_api::nn::Module;
            Encoder::new(&bert_params(&minilm()).unwrap())
                .raw_state_dict()
                .into_keys()
                .collect()
        };
        assert_eq!(names.len(), 5 + 6 * 16);
        assert!(names.contains(&"encoder.layer.5.output.LayerNorm.bias".to_owned()));
        assert!(names.contains(&"embeddings.token_type_embeddings.weight".to_owned()));
    }

    #[test]
    fn unsupported_switches_are_refused_by_name() {
        for (key, value) in [
            ("is_decoder", json!(true)),
            ("position_embedding_type", json!("relative_key")),
            ("hidden_act", json!("swish_glu")),
            ("num_attention_heads", json!(5)),
        ] {
            let mut config = minilm();
            config[key] = value;
            let error = bert_params(&config).unwrap_err().to_string();
            assert!(error.contains(key), "{key}: {error}");
        }
    }
}
