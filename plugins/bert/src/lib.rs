//! Built-in plugin: BERT-family encoders (`BertModel`, and `RobertaModel` /
//! `XLMRobertaModel`), for embeddings, and their `…ForSequenceClassification`
//! variants: cross-encoder rerankers and text classifiers.
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
//!
//! A sequence classifier is the same encoder with the plugin API's
//! [`ClassificationHead`](kiln_plugin_api::nn::ClassificationHead) on each
//! text's first token: BERT's `pooler.dense` and `classifier` are read as
//! the head's `classifier.dense` and `classifier.out_proj`, RoBERTa's
//! `classifier.*` keep their names.
//!
//! RoBERTa is the same encoder with positions counted from
//! `pad_token_id + 1` (its embedding rows below that are never used): the
//! adapter hands the encoder the position table from that row on, zero-copy,
//! so nothing else differs. Its checkpoints' `roberta.` prefix is stripped.

use kiln_plugin_api::adapters::{self, AdaptRequest, AdaptResponse};
use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{
    build_classifier_graph, build_encoder_graph, Activation, Encoder, EncoderConfig,
    SequenceClassifier,
};
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

/// RoBERTa's first position row: `pad_token_id + 1` (1 when absent, as
/// transformers' default pad id is 1).
pub fn roberta_position_offset(raw: &Value) -> Result<u64> {
    Ok(u64::from(HfConfig::new(raw)?.opt_u32("pad_token_id")?.unwrap_or(1)) + 1)
}

/// [`bert_params`] for RoBERTa: the positions a text can use are the rows
/// after the offset.
pub fn roberta_params(raw: &Value) -> Result<EncoderConfig> {
    let mut params = bert_params(raw)?;
    let offset = roberta_position_offset(raw)?;
    params.max_positions = params
        .max_positions
        .checked_sub(offset)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
        Error::invalid(format!(
            "config.json `max_position_embeddings` ({}) leaves no position after `pad_token_id` + 1 ({offset})",
            params.max_positions
        ))
    })?;
    Ok(params)
}

/// Parses the config: the sequence limit (positions), and no KV cache.
pub fn bert_config(request: &ConfigRequest) -> Result<ArchConfig> {
    encoder_config(request, bert_params(&request.hf_config)?)
}

/// [`bert_config`] for RoBERTa.
pub fn roberta_config(request: &ConfigRequest) -> Result<ArchConfig> {
    encoder_config(request, roberta_params(&request.hf_config)?)
}

/// The sequence limit is the position table's length (RoBERTa's after its
/// offset).
fn encoder_config(request: &ConfigRequest, params: EncoderConfig) -> Result<ArchConfig> {
    let mut usable = request.hf_config.clone();
    usable["max_position_embeddings"] = params.max_positions.into();
    Ok(ArchConfig {
        max_seq_len: HfConfig::new(&usable)?.max_seq_len(request.max_length)?,
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
    encoder_graph("bert", &bert_params(&request.config.model)?, request)
}

/// The RoBERTa graph: BERT's, over the positions after the offset.
pub fn roberta_graph(request: &GraphRequest) -> Result<GraphIr> {
    encoder_graph("roberta", &roberta_params(&request.config.model)?, request)
}

fn encoder_graph(name: &str, params: &EncoderConfig, request: &GraphRequest) -> Result<GraphIr> {
    let model = Encoder::new(params);
    build_encoder_graph(name, &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

/// The BERT classifier's graph: token ids in, each text's class logits out.
pub fn bert_classifier_graph(request: &GraphRequest) -> Result<GraphIr> {
    classifier_graph("bert", bert_params(&request.config.model)?, request)
}

/// The RoBERTa classifier's graph.
pub fn roberta_classifier_graph(request: &GraphRequest) -> Result<GraphIr> {
    classifier_graph("roberta", roberta_params(&request.config.model)?, request)
}

fn classifier_graph(name: &str, params: EncoderConfig, request: &GraphRequest) -> Result<GraphIr> {
    let labels = HfConfig::new(&request.config.model)?.num_labels()?;
    let model = SequenceClassifier::new(&params, labels);
    build_classifier_graph(name, &model, request.state_dict.as_ref(), |batch| {
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

/// `BertForSequenceClassification`'s names: the pooler and the classifier
/// become the head's `classifier.dense` and `classifier.out_proj`.
pub fn bert_classifier_hf_name(name: &str) -> Option<String> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if let Some(part) = name.strip_prefix("pooler.dense.") {
        return Some(format!("classifier.dense.{part}"));
    }
    if let Some(part @ ("weight" | "bias")) = name.strip_prefix("classifier.") {
        return Some(format!("classifier.out_proj.{part}"));
    }
    bert_hf_name(name)
}

/// RoBERTa classifiers' names: the encoder's as [`adapt_roberta`] has them,
/// `classifier.*` kept.
fn roberta_classifier_hf_name(name: &str) -> Option<String> {
    match name.strip_prefix("classifier.") {
        Some(_) => Some(name.to_owned()),
        None => bert_hf_name(name),
    }
}

/// RoBERTa's names: BERT's after the `roberta.` prefix, with the position
/// table taken from row `pad_token_id + 1` on.
pub fn adapt_roberta(request: &AdaptRequest) -> Result<AdaptResponse> {
    adapt_roberta_names(request, bert_hf_name)
}

/// [`adapt_roberta`] for `…ForSequenceClassification`.
pub fn adapt_roberta_classifier(request: &AdaptRequest) -> Result<AdaptResponse> {
    adapt_roberta_names(request, roberta_classifier_hf_name)
}

fn adapt_roberta_names(
    request: &AdaptRequest,
    name_of: fn(&str) -> Option<String>,
) -> Result<AdaptResponse> {
    let offset = roberta_position_offset(&request.config)?;
    let mut response = adapters::rename(request, |name| {
        name_of(name.strip_prefix("roberta.").unwrap_or(name))
    });
    for weight in &mut response.weights {
        if weight.name == "embeddings.position_embeddings.weight" {
            let rows = request
                .tensors
                .iter()
                .find(|t| t.name == weight.source)
                .and_then(|t| t.shape.first().copied())
                .unwrap_or(0);
            if rows <= offset {
                return Err(Error::invalid(format!(
                    "`{}` has {rows} rows, none after `pad_token_id` + 1 ({offset})",
                    weight.source
                )));
            }
            weight.rows = Some((offset, rows));
        }
    }
    Ok(response)
}

/// The plugin.
pub fn plugin() -> Plugin {
    let model = |name: &str, task: Task, aliases: &[&str], example: &str| {
        SupportedArchitecture::new(name, task)
            .with_aliases(aliases.iter().copied())
            .with_encodings(Encoding::Float32, Encoding::ALL.iter().copied())
            .with_example_repo_ids([example])
    };
    let bert = |name: &str, task: Task, aliases: &[&str], example: &str| {
        model(name, task, aliases, example).with_config(bert_config)
    };
    let roberta = |name: &str, task: Task, aliases: &[&str], example: &str| {
        model(name, task, aliases, example).with_config(roberta_config)
    };
    let embeddings = Task::Embeddings;
    let classifier = Task::SequenceClassification;
    Plugin::new("bert", env!("CARGO_PKG_VERSION"))
        .with_architecture(
            bert(
                "BertModel",
                embeddings,
                &["bert"],
                "sentence-transformers/all-MiniLM-L6-v2",
            )
            .with_graph(bert_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, |r| {
                Ok(adapters::rename(r, bert_hf_name))
            }),
        )
        .with_architecture(
            roberta(
                "RobertaModel",
                embeddings,
                &["roberta"],
                "sentence-transformers/all-distilroberta-v1",
            )
            .with_graph(roberta_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_roberta),
        )
        .with_architecture(
            roberta(
                "XLMRobertaModel",
                embeddings,
                &["xlm-roberta"],
                "intfloat/multilingual-e5-small",
            )
            .with_graph(roberta_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_roberta),
        )
        .with_architecture(
            bert(
                "BertForSequenceClassification",
                classifier,
                &[],
                "cross-encoder/ms-marco-MiniLM-L-6-v2",
            )
            .with_graph(bert_classifier_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, |r| {
                Ok(adapters::rename(r, bert_classifier_hf_name))
            }),
        )
        .with_architecture(
            roberta(
                "RobertaForSequenceClassification",
                classifier,
                &[],
                "cardiffnlp/twitter-roberta-base-sentiment-latest",
            )
            .with_graph(roberta_classifier_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_roberta_classifier),
        )
        .with_architecture(
            roberta(
                "XLMRobertaForSequenceClassification",
                classifier,
                &[],
                "BAAI/bge-reranker-v2-m3",
            )
            .with_graph(roberta_classifier_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_roberta_classifier),
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
    fn classifier_heads_take_the_head_names() {
        assert_eq!(
            bert_classifier_hf_name("bert.pooler.dense.weight").as_deref(),
            Some("classifier.dense.weight")
        );
        assert_eq!(
            bert_classifier_hf_name("classifier.bias").as_deref(),
            Some("classifier.out_proj.bias")
        );
        assert_eq!(
            bert_classifier_hf_name("bert.encoder.layer.1.output.dense.bias").as_deref(),
            Some("encoder.layer.1.output.dense.bias")
        );
        assert_eq!(
            roberta_classifier_hf_name("classifier.out_proj.weight").as_deref(),
            Some("classifier.out_proj.weight")
        );
        let names: Vec<String> = {
            use kiln_plugin_api::nn::Module;
            SequenceClassifier::new(&bert_params(&minilm()).unwrap(), 1)
                .raw_state_dict()
                .into_keys()
                .collect()
        };
        assert_eq!(names.len(), 5 + 6 * 16 + 4);
        assert!(names.contains(&"classifier.out_proj.weight".to_owned()));
    }

    #[test]
    fn labels_come_from_id2label_then_num_labels() {
        let labels = |config: &Value| HfConfig::new(config)?.num_labels();
        let mut config = minilm();
        assert_eq!(labels(&config).unwrap(), 2);
        config["num_labels"] = json!(5);
        assert_eq!(labels(&config).unwrap(), 5);
        config["id2label"] = json!({"0": "LABEL_0"});
        assert_eq!(labels(&config).unwrap(), 1);
        config["id2label"] = json!({});
        assert!(labels(&config).is_err());
        config["id2label"] = json!(["a"]);
        assert!(labels(&config).is_err());
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

    fn roberta_request(config: Value, positions: u64) -> AdaptRequest {
        let tensor = |name: &str, shape: &[u64]| kiln_plugin_api::adapters::CheckpointTensor {
            name: name.to_owned(),
            shape: shape.to_vec(),
            storage: "F32".to_owned(),
            encoding: None,
        };
        AdaptRequest {
            format: WeightsFormat::Safetensors,
            tensors: vec![
                tensor(
                    "roberta.embeddings.position_embeddings.weight",
                    &[positions, 8],
                ),
                tensor("roberta.embeddings.word_embeddings.weight", &[50, 8]),
                tensor("roberta.pooler.dense.weight", &[8, 8]),
            ],
            config,
        }
    }

    #[test]
    fn roberta_positions_start_after_the_padding_id() {
        let mut config = minilm();
        config["pad_token_id"] = json!(1);
        config["max_position_embeddings"] = json!(514);
        assert_eq!(roberta_params(&config).unwrap().max_positions, 512);
        let response = adapt_roberta(&roberta_request(config.clone(), 514)).unwrap();
        let names: Vec<(&str, Option<(u64, u64)>)> = response
            .weights
            .iter()
            .map(|w| (w.name.as_str(), w.rows))
            .collect();
        assert_eq!(
            names,
            [
                ("embeddings.position_embeddings.weight", Some((2, 514))),
                ("embeddings.word_embeddings.weight", None),
            ]
        );
        // A position table with nothing after the offset is refused.
        config["max_position_embeddings"] = json!(2);
        assert!(roberta_params(&config).is_err());
        assert!(adapt_roberta(&roberta_request(config, 2)).is_err());
    }
}
