//! What a sequence classifier's logits mean: its labels (`id2label`) and the
//! activation that turns them into scores, as sentence-transformers'
//! `CrossEncoder` and vLLM read a checkpoint's `config.json`.

use serde_json::Value;

/// The function applied to a text's class logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `1 / (1 + e^-x)` on each logit: a reranker's relevance in (0, 1).
    Sigmoid,
    /// Probabilities over the classes.
    Softmax,
    /// The logits unchanged.
    Identity,
}

impl Activation {
    /// `logits` with the activation applied.
    pub fn apply(self, logits: &[f32]) -> Vec<f32> {
        match self {
            Activation::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            Activation::Identity => logits.to_vec(),
            Activation::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                exps.iter().map(|e| e / sum).collect()
            }
        }
    }
}

/// A classifier's labels and default activation.
#[derive(Clone, Debug, PartialEq)]
pub struct Classes {
    /// Label names by class index (`id2label`, else `LABEL_N`).
    pub labels: Vec<String>,
    /// The activation: the checkpoint's sentence-transformers setting, else
    /// sigmoid for one class and softmax for several (vLLM's default).
    pub activation: Activation,
}

impl Classes {
    /// Reads `config.json`: `id2label` (else `num_labels`, else 2 as in
    /// transformers) and sentence-transformers' `activation_fn` (or its older
    /// `sbert_ce_default_activation_function`). An activation that is not
    /// sigmoid, softmax or identity is refused by name.
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let labels = match config.get("id2label") {
            Some(Value::Object(map)) => {
                let mut labels = vec![String::new(); map.len()];
                for (id, name) in map {
                    let index = id
                        .parse::<usize>()
                        .ok()
                        .filter(|&i| i < labels.len())
                        .ok_or_else(|| {
                            format!("config.json `id2label` has the key `{id}`, not a class index below {}", map.len())
                        })?;
                    labels[index] = name.as_str().unwrap_or_default().to_owned();
                }
                labels
            }
            _ => {
                let count = config
                    .get("num_labels")
                    .and_then(Value::as_u64)
                    .unwrap_or(2);
                (0..count).map(|i| format!("LABEL_{i}")).collect()
            }
        };
        let named = config
            .pointer("/sentence_transformers/activation_fn")
            .or_else(|| config.get("sbert_ce_default_activation_function"))
            .and_then(Value::as_str);
        let activation = match named {
            None if labels.len() == 1 => Activation::Sigmoid,
            None => Activation::Softmax,
            Some(name) => match name.rsplit('.').next() {
                Some("Sigmoid") => Activation::Sigmoid,
                Some("Softmax") => Activation::Softmax,
                Some("Identity") => Activation::Identity,
                _ => {
                    return Err(format!(
                        "config.json names the activation `{name}`; supported: Sigmoid, Softmax, Identity"
                    ))
                }
            },
        };
        Ok(Self { labels, activation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_and_activation_come_from_the_config() {
        let reranker = Classes::from_config(&json!({"id2label": {"0": "LABEL_0"}})).unwrap();
        assert_eq!(reranker.labels, ["LABEL_0"]);
        assert_eq!(reranker.activation, Activation::Sigmoid);
        let sentiment =
            Classes::from_config(&json!({"id2label": {"1": "positive", "0": "negative"}})).unwrap();
        assert_eq!(sentiment.labels, ["negative", "positive"]);
        assert_eq!(sentiment.activation, Activation::Softmax);
        let named = Classes::from_config(&json!({
            "num_labels": 1,
            "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}
        }))
        .unwrap();
        assert_eq!(named.activation, Activation::Identity);
        let error = Classes::from_config(&json!({
            "sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"
        }))
        .unwrap_err();
        assert!(error.contains("Tanh"), "{error}");
        assert!(Classes::from_config(&json!({"id2label": {"3": "x"}})).is_err());
    }

    #[test]
    fn activations_are_as_defined() {
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(
            &Activation::Sigmoid.apply(&[0.0, 2.0]),
            &[0.5, 0.880_797]
        ));
        assert!(close(&Activation::Softmax.apply(&[1.0, 1.0]), &[0.5, 0.5]));
        assert!(close(&Activation::Identity.apply(&[-3.0]), &[-3.0]));
    }
}
