//! Pooling a text's token states into one vector, as the checkpoint's
//! sentence-transformers files say (`modules.json`, `1_Pooling/config.json`,
//! `sentence_bert_config.json`).

use std::path::Path;

use serde_json::Value;

/// One way of pooling; several are concatenated in this enum's order (the
/// order of sentence-transformers' `Pooling.forward`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The first token (`[CLS]`).
    Cls,
    /// The element-wise maximum.
    Max,
    /// The mean.
    Mean,
    /// The sum divided by √length.
    MeanSqrtLen,
    /// The mean weighted by position (1, 2, …).
    WeightedMean,
    /// The last token.
    LastToken,
}

impl PoolingMode {
    /// Every mode with its `1_Pooling/config.json` key, in concatenation order.
    const KEYS: [(PoolingMode, &'static str); 6] = [
        (PoolingMode::Cls, "pooling_mode_cls_token"),
        (PoolingMode::Max, "pooling_mode_max_tokens"),
        (PoolingMode::Mean, "pooling_mode_mean_tokens"),
        (
            PoolingMode::MeanSqrtLen,
            "pooling_mode_mean_sqrt_len_tokens",
        ),
        (
            PoolingMode::WeightedMean,
            "pooling_mode_weightedmean_tokens",
        ),
        (PoolingMode::LastToken, "pooling_mode_lasttoken"),
    ];
}

/// How a model's embeddings are made from its token states.
#[derive(Clone, Debug, PartialEq)]
pub struct Pooling {
    /// The modes, concatenated in order.
    pub modes: Vec<PoolingMode>,
    /// Scale each embedding to unit length.
    pub normalize: bool,
    /// The longest text in tokens (`sentence_bert_config.json`
    /// `max_seq_length`), if the files name one.
    pub max_seq_length: Option<usize>,
    /// Where the settings came from, for the load log.
    pub source: &'static str,
}

impl Pooling {
    /// What a checkpoint without sentence-transformers files gets: the CLS
    /// token, normalized (vLLM's default for BERT embeddings).
    pub fn default_for_encoders() -> Self {
        Self {
            modes: vec![PoolingMode::Cls],
            normalize: true,
            max_seq_length: None,
            source: "default (CLS, normalized; the model has no modules.json)",
        }
    }

    /// What a decoder run as an embedding model gets without
    /// sentence-transformers files (a GGUF file, say): the last token,
    /// normalized (vLLM's default for decoders, and Qwen3-Embedding's).
    pub fn default_for_decoders() -> Self {
        Self {
            modes: vec![PoolingMode::LastToken],
            normalize: true,
            max_seq_length: None,
            source: "default (last token, normalized; the model has no modules.json)",
        }
    }

    /// The pooling `dir`'s sentence-transformers files describe, or
    /// `default` without them. Modules that change the vectors and are not
    /// implemented (a `Dense` projection, say) are refused by name.
    pub fn from_dir(dir: Option<&Path>, default: fn() -> Self) -> Result<Self, String> {
        let Some(dir) = dir.filter(|d| d.join("modules.json").is_file()) else {
            return Ok(default());
        };
        let modules: Value = read_json(&dir.join("modules.json"))?;
        let modules = modules
            .as_array()
            .ok_or("modules.json is not a list of modules")?;
        let mut pooling = None;
        let mut normalize = false;
        for module in modules {
            let kind = module.get("type").and_then(Value::as_str).unwrap_or("");
            let path = module.get("path").and_then(Value::as_str).unwrap_or("");
            match kind.rsplit('.').next().unwrap_or("") {
                "Transformer" => {}
                "Pooling" => pooling = Some(read_json(&dir.join(path).join("config.json"))?),
                "Normalize" => normalize = true,
                _ => {
                    return Err(format!(
                        "modules.json: the sentence-transformers module `{kind}` is not supported \
                         (Transformer, Pooling and Normalize are)"
                    ))
                }
            }
        }
        let pooling = pooling.ok_or("modules.json has no Pooling module")?;
        let mut modes = Vec::new();
        for (mode, key) in PoolingMode::KEYS {
            if pooling.get(key).and_then(Value::as_bool).unwrap_or(false) {
                modes.push(mode);
            }
        }
        if let Some(mode) = pooling.get("pooling_mode").and_then(Value::as_str) {
            // Newer files may name the mode instead of setting flags.
            let named = match mode {
                "cls" => PoolingMode::Cls,
                "max" => PoolingMode::Max,
                "mean" => PoolingMode::Mean,
                "mean_sqrt_len_tokens" => PoolingMode::MeanSqrtLen,
                "weightedmean" => PoolingMode::WeightedMean,
                "lasttoken" => PoolingMode::LastToken,
                other => return Err(format!("pooling mode `{other}` is not supported")),
            };
            if !modes.contains(&named) {
                modes.push(named);
            }
        }
        if modes.is_empty() {
            return Err("the Pooling config enables no pooling mode".to_owned());
        }
        let max_seq_length = match dir.join("sentence_bert_config.json") {
            path if path.is_file() => read_json(&path)?
                .get("max_seq_length")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
            _ => None,
        };
        Ok(Self {
            modes,
            normalize,
            max_seq_length,
            source: "sentence-transformers files",
        })
    }

    /// The embedding of one text from its token states `rows` (each
    /// `hidden` wide).
    pub fn pool(&self, rows: &[Vec<f32>]) -> Vec<f32> {
        let hidden = rows.first().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(hidden * self.modes.len());
        for mode in &self.modes {
            let weighted_sum = |weight: &dyn Fn(usize) -> f32| {
                let mut sum = vec![0f32; hidden];
                for (i, row) in rows.iter().enumerate() {
                    for (s, &x) in sum.iter_mut().zip(row) {
                        *s += weight(i) * x;
                    }
                }
                sum
            };
            let n = rows.len() as f32;
            let pooled = match mode {
                PoolingMode::Cls => rows[0].clone(),
                PoolingMode::LastToken => rows[rows.len() - 1].clone(),
                PoolingMode::Max => (0..hidden)
                    .map(|j| rows.iter().map(|r| r[j]).fold(f32::NEG_INFINITY, f32::max))
                    .collect(),
                PoolingMode::Mean => scaled(weighted_sum(&|_| 1.0), 1.0 / n),
                PoolingMode::MeanSqrtLen => scaled(weighted_sum(&|_| 1.0), 1.0 / n.sqrt()),
                PoolingMode::WeightedMean => {
                    let total = n * (n + 1.0) / 2.0;
                    scaled(weighted_sum(&|i| (i + 1) as f32), 1.0 / total)
                }
            };
            out.extend(pooled);
        }
        if self.normalize {
            // torch.nn.functional.normalize: x / max(‖x‖, 1e-12).
            let norm = out.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            out.iter_mut().for_each(|x| *x /= norm);
        }
        out
    }
}

fn scaled(mut v: Vec<f32>, factor: f32) -> Vec<f32> {
    v.iter_mut().for_each(|x| *x *= factor);
    v
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn sentence_transformers_files_set_modes_normalization_and_length() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "modules.json",
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
                {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        );
        write(
            dir.path(),
            "1_Pooling/config.json",
            r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
        );
        write(
            dir.path(),
            "sentence_bert_config.json",
            r#"{"max_seq_length": 256}"#,
        );
        let pooling = Pooling::from_dir(Some(dir.path()), Pooling::default_for_encoders).unwrap();
        assert_eq!(pooling.modes, [PoolingMode::Cls, PoolingMode::Mean]);
        assert!(pooling.normalize);
        assert_eq!(pooling.max_seq_length, Some(256));
        let pooled = pooling.pool(&[vec![3.0, 0.0], vec![1.0, 4.0]]);
        // [cls 3, 0, mean 2, 2] normalized by √17.
        let norm = 17f32.sqrt();
        let expected = [3.0 / norm, 0.0, 2.0 / norm, 2.0 / norm];
        for (got, want) in pooled.iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{pooled:?}");
        }
    }

    #[test]
    fn every_mode_pools_as_defined() {
        let rows = [vec![1.0, -2.0], vec![3.0, 6.0], vec![-1.0, 2.0]];
        let pool = |mode| {
            Pooling {
                modes: vec![mode],
                normalize: false,
                max_seq_length: None,
                source: "test",
            }
            .pool(&rows)
        };
        let close = |mode, expected: [f32; 2]| {
            let got = pool(mode);
            assert!(
                got.iter().zip(expected).all(|(g, e)| (g - e).abs() < 1e-6),
                "{mode:?}: {got:?}, expected {expected:?}"
            );
        };
        close(PoolingMode::Cls, [1.0, -2.0]);
        close(PoolingMode::LastToken, [-1.0, 2.0]);
        close(PoolingMode::Max, [3.0, 6.0]);
        close(PoolingMode::Mean, [1.0, 2.0]);
        let sqrt3 = 3f32.sqrt();
        close(PoolingMode::MeanSqrtLen, [3.0 / sqrt3, 6.0 / sqrt3]);
        // (1·1 + 2·3 + 3·-1) / 6, (1·-2 + 2·6 + 3·2) / 6
        close(PoolingMode::WeightedMean, [4.0 / 6.0, 16.0 / 6.0]);
    }

    #[test]
    fn unsupported_modules_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "modules.json",
            r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                {"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
        );
        let error = Pooling::from_dir(Some(dir.path()), Pooling::default_for_encoders).unwrap_err();
        assert!(
            error.contains("sentence_transformers.models.Dense"),
            "{error}"
        );
        assert_eq!(
            Pooling::from_dir(None, Pooling::default_for_encoders).unwrap(),
            Pooling::default_for_encoders()
        );
    }
}
