//! Architecture configuration: the Hugging Face `config.json` in, what the
//! host needs to size caches and build graphs out (MAX's `ArchConfig`).
//!
//! These types cross the ABI as JSON ([`ConfigRequest`] in, [`ArchConfig`]
//! out). New fields are added as optional ones, which keeps older plugins and
//! hosts working without an interface bump.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::nn::RopeScaling;

/// What the host hands an architecture's config entry point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigRequest {
    /// The model's Hugging Face `config.json`, parsed (GGUF metadata is mapped
    /// into the same shape by the host).
    pub hf_config: Value,
    /// The user's `--max-length`, if given.
    #[serde(default)]
    pub max_length: Option<u32>,
}

/// What the host needs from an architecture's config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArchConfig {
    /// The longest sequence (prompt + generated) a request may reach.
    pub max_seq_len: u32,
    /// The shape of the key/value cache.
    pub kv: KvCacheParams,
    /// The plugin's own parsed config, handed back to it when building graphs.
    #[serde(default)]
    pub model: Value,
}

/// What the host hands an architecture's graph entry point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphRequest {
    /// The architecture's config, as its config entry point returned it.
    pub config: ArchConfig,
    /// The checkpoint's format (GGUF llama stores Q and K rows permuted for
    /// the interleaved rotary layout).
    #[serde(default)]
    pub weights_format: Option<crate::WeightsFormat>,
    /// The adapted checkpoint's weights (names, types, encodings), bound to the
    /// module with `load_state_dict`; `None` builds with the module's own
    /// declarations (for inspection without a checkpoint).
    #[serde(default)]
    pub state_dict: Option<crate::nn::StateDict>,
    /// The task the host runs the model for, when it is not the
    /// architecture's own (since 1.8; `None`: its own). Only a task the
    /// architecture [converts to](crate::SupportedArchitecture::converts_to)
    /// reaches its graph entry point: [`Task::Embeddings`](crate::Task) asks
    /// a text-generation architecture for its final hidden states (after
    /// the final norm) at the logits rows instead of logits, as vLLM's
    /// `--runner pooling` turns a causal LM into an embedding model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<crate::Task>,
}

impl GraphRequest {
    /// Whether the host asks for hidden states rather than logits.
    pub fn wants_hidden_states(&self) -> bool {
        self.task == Some(crate::Task::Embeddings)
    }
}

/// The per-layer shape of the key/value cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheParams {
    /// Transformer layers that keep a cache.
    pub num_layers: u32,
    /// Key/value heads per layer.
    pub num_kv_heads: u32,
    /// Size of one head.
    pub head_dim: u32,
}

/// Typed, error-reporting access to a Hugging Face `config.json` object.
#[derive(Clone, Copy, Debug)]
pub struct HfConfig<'a> {
    object: &'a serde_json::Map<String, Value>,
}

impl<'a> HfConfig<'a> {
    /// Wraps a parsed config; fails unless it is a JSON object.
    pub fn new(config: &'a Value) -> Result<Self> {
        config
            .as_object()
            .map(|object| Self { object })
            .ok_or_else(|| Error::invalid("config.json is not a JSON object"))
    }

    /// A required non-negative integer field.
    pub fn u32(&self, key: &str) -> Result<u32> {
        self.opt_u32(key)?
            .ok_or_else(|| Error::invalid(format!("config.json has no `{key}`")))
    }

    /// An optional non-negative integer field (`null` counts as absent).
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "config.json field `{key}` must be a non-negative integer, found {value}"
                    ))
                }),
        }
    }

    /// A required number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| Error::invalid(format!("config.json has no `{key}`")))
    }

    /// An optional number (`null` counts as absent).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_f64().map(Some).ok_or_else(|| {
                Error::invalid(format!(
                    "config.json field `{key}` must be a number, found {value}"
                ))
            }),
        }
    }

    /// An optional string (`null` counts as absent).
    pub fn opt_string(&self, key: &str) -> Result<Option<&'a str>> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_str().map(Some).ok_or_else(|| {
                Error::invalid(format!(
                    "config.json field `{key}` must be a string, found {value}"
                ))
            }),
        }
    }

    /// An optional boolean (`null` counts as absent).
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.object.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_bool().map(Some).ok_or_else(|| {
                Error::invalid(format!(
                    "config.json field `{key}` must be true or false, found {value}"
                ))
            }),
        }
    }

    /// The rotary base and scaling, from `rope_parameters` (transformers 5)
    /// or `rope_theta` + `rope_scaling` (earlier checkpoints).
    pub fn rope(&self) -> Result<(f64, RopeScaling)> {
        let params = ["rope_parameters", "rope_scaling"]
            .iter()
            .find_map(|key| self.object.get(*key).filter(|v| v.is_object()));
        let theta = match params
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            Some(theta) => theta,
            None => self.opt_f64("rope_theta")?.unwrap_or(10_000.0),
        };
        let Some(params) = params else {
            return Ok((theta, RopeScaling::Default));
        };
        let p = HfConfig::new(params)?;
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let original = || -> Result<f64> {
            match p.opt_f64("original_max_position_embeddings")? {
                Some(n) => Ok(n),
                None => self.f64("max_position_embeddings"),
            }
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: p.f64("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: p.f64("factor")?,
                low_freq_factor: p.f64("low_freq_factor")?,
                high_freq_factor: p.f64("high_freq_factor")?,
                original_max_position_embeddings: original()?,
            },
            "freq_factors" => RopeScaling::FreqFactors {
                factors: freq_factors(params)?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: p.f64("factor")?,
                original_max_position_embeddings: original()?,
                beta_fast: p.opt_f64("beta_fast")?.unwrap_or(32.0),
                beta_slow: p.opt_f64("beta_slow")?.unwrap_or(1.0),
                attention_factor: p.opt_f64("attention_factor")?,
                mscale: p.opt_f64("mscale")?.unwrap_or(0.0),
                mscale_all_dim: p.opt_f64("mscale_all_dim")?.unwrap_or(0.0),
                truncate: p.opt_bool("truncate")?.unwrap_or(true),
            },
            other => {
                return Err(Error::invalid(format!(
                    "rope type `{other}` is not supported"
                )))
            }
        };
        Ok((theta, scaling))
    }

    /// The classes of a `…ForSequenceClassification` config (since 1.8):
    /// `id2label`'s length, else `num_labels`, else 2 (transformers'
    /// default).
    pub fn num_labels(&self) -> Result<u64> {
        let labels = match self.object.get("id2label") {
            Some(Value::Object(labels)) => labels.len() as u64,
            Some(_) => return Err(Error::invalid("config.json `id2label` must be an object")),
            None => u64::from(self.opt_u32("num_labels")?.unwrap_or(2)),
        };
        if labels == 0 {
            return Err(Error::invalid(
                "config.json has no labels (`id2label`, `num_labels`)",
            ));
        }
        Ok(labels)
    }

    /// The sequence limit: the model's `max_position_embeddings`, lowered to the
    /// user's `--max-length` when that is smaller. Asking for more than the
    /// model supports is an error rather than a silent clamp.
    pub fn max_seq_len(&self, requested: Option<u32>) -> Result<u32> {
        let model_limit = self.u32("max_position_embeddings")?;
        match requested {
            None => Ok(model_limit),
            Some(0) => Err(Error::invalid("--max-length must be at least 1")),
            Some(n) if n > model_limit => Err(Error::invalid(format!(
                "--max-length {n} exceeds the model's limit of {model_limit} tokens"
            ))),
            Some(n) => Ok(n),
        }
    }

    /// KV parameters of a standard decoder: `num_hidden_layers`,
    /// `num_key_value_heads` (default: `num_attention_heads`) and `head_dim`
    /// (default: `hidden_size / num_attention_heads`).
    pub fn decoder_kv_params(&self) -> Result<KvCacheParams> {
        let num_layers = self.u32("num_hidden_layers")?;
        let num_heads = self.u32("num_attention_heads")?;
        if num_heads == 0 {
            return Err(Error::invalid("config.json `num_attention_heads` is 0"));
        }
        let num_kv_heads = self.opt_u32("num_key_value_heads")?.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "config.json `num_key_value_heads` ({num_kv_heads}) must divide `num_attention_heads` ({num_heads})"
            )));
        }
        let head_dim = match self.opt_u32("head_dim")? {
            Some(dim) => dim,
            None => self.u32("hidden_size")? / num_heads,
        };
        Ok(KvCacheParams {
            num_layers,
            num_kv_heads,
            head_dim,
        })
    }
}

/// The `factors` of a `freq_factors` rope scaling: positive, finite numbers.
fn freq_factors(params: &Value) -> Result<Vec<f64>> {
    let bad = || {
        Error::invalid("rope scaling `freq_factors` needs `factors`: a list of positive numbers")
    };
    let factors = params
        .get("factors")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    factors
        .iter()
        .map(|f| {
            f.as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(bad)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_decoder_params_with_defaults() {
        let value = json!({
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "hidden_size": 576, "max_position_embeddings": 8192
        });
        let config = HfConfig::new(&value).unwrap();
        assert_eq!(
            config.decoder_kv_params().unwrap(),
            KvCacheParams {
                num_layers: 30,
                num_kv_heads: 3,
                head_dim: 64
            }
        );
        assert_eq!(config.max_seq_len(None).unwrap(), 8192);
        assert_eq!(config.max_seq_len(Some(2048)).unwrap(), 2048);
        let err = config.max_seq_len(Some(9000)).unwrap_err().to_string();
        assert!(err.contains("exceeds the model's limit of 8192"), "{err}");
    }

    #[test]
    fn reports_missing_and_mistyped_fields() {
        let value = json!({"num_hidden_layers": "thirty", "num_attention_heads": 4});
        let config = HfConfig::new(&value).unwrap();
        let err = config.decoder_kv_params().unwrap_err().to_string();
        assert!(
            err.contains("`num_hidden_layers` must be a non-negative integer"),
            "{err}"
        );
        let value =
            json!({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3});
        let err = HfConfig::new(&value)
            .unwrap()
            .decoder_kv_params()
            .unwrap_err()
            .to_string();
        assert!(err.contains("must divide"), "{err}");
        assert!(HfConfig::new(&json!([1])).is_err());
    }

    #[test]
    fn reads_per_frequency_rope_factors() {
        let value = json!({"rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "freq_factors", "factors": [1.0, 2.5, 8.0]}});
        let (theta, scaling) = HfConfig::new(&value).unwrap().rope().unwrap();
        assert_eq!(theta, 500000.0);
        assert_eq!(
            scaling,
            RopeScaling::FreqFactors {
                factors: vec![1.0, 2.5, 8.0]
            }
        );
        for factors in [json!([1.0, 0.0]), json!("8"), json!(null)] {
            let value = json!({"rope_scaling": {"rope_type": "freq_factors", "factors": factors}});
            let err = HfConfig::new(&value)
                .unwrap()
                .rope()
                .unwrap_err()
                .to_string();
            assert!(err.contains("list of positive numbers"), "{err}");
        }
    }
}
