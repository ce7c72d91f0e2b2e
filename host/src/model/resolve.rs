//! Resolving `--model`: a local directory, a `.gguf` file, or a Hugging Face
//! repository id found in the local Hugging Face cache (no network).

use std::path::{Path, PathBuf};

use kiln_plugin_api::WeightsFormat;

/// Why `--model` could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Nothing usable at the path or id.
    #[error("{0}")]
    NotFound(String),
    /// A file was found but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `config.json` is not valid JSON.
    #[error("{} is not valid JSON: {message}", path.display())]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

/// Where a model's pieces are.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedModel {
    /// What the user asked for, for messages and `/v1/models`.
    pub name: String,
    /// The directory with `config.json` and tokenizer files, if any.
    pub dir: Option<PathBuf>,
    /// The weights: a `.safetensors` file, a shard index, or a `.gguf` file.
    pub weights: PathBuf,
    /// The weights' format.
    pub format: WeightsFormat,
}

/// Resolves `model` (a directory, a `.gguf` file, or `org/name` in the local
/// Hugging Face cache at `revision`); `weight_path` replaces the weights found
/// there (e.g. a GGUF next to a Hugging Face config).
pub fn resolve(
    model: &str,
    revision: Option<&str>,
    weight_path: Option<&Path>,
) -> Result<ResolvedModel, ResolveError> {
    let path = Path::new(model);
    let (dir, found) = if path.is_file() {
        (None, Some(path.to_owned()))
    } else if path.is_dir() {
        (Some(path.to_owned()), find_weights(path)?)
    } else if looks_like_repo_id(model) {
        let snapshot = hf_snapshot(model, revision.unwrap_or("main"))?;
        let weights = find_weights(&snapshot)?;
        (Some(snapshot), weights)
    } else {
        return Err(ResolveError::NotFound(format!(
            "--model {model}: no such file or directory, and not a Hugging Face id (org/name)"
        )));
    };
    let weights = match weight_path {
        Some(explicit) if explicit.exists() => explicit.to_owned(),
        Some(explicit) => return Err(ResolveError::NotFound(format!("--weight-path {} does not exist", explicit.display()))),
        None => found.ok_or_else(|| {
            ResolveError::NotFound(format!(
                "{model}: no weights found (looked for *.safetensors, model.safetensors.index.json and *.gguf); pass --weight-path"
            ))
        })?,
    };
    let format = if weights.extension().and_then(|e| e.to_str()) == Some("gguf") {
        WeightsFormat::Gguf
    } else {
        WeightsFormat::Safetensors
    };
    if dir.is_none() && format != WeightsFormat::Gguf {
        return Err(ResolveError::NotFound(format!(
            "{}: a safetensors file needs its directory (with config.json); pass the directory as --model",
            weights.display()
        )));
    }
    Ok(ResolvedModel {
        name: model.to_owned(),
        dir,
        weights,
        format,
    })
}

/// The weights in a model directory: a shard index, else the single
/// `.safetensors` file, else a single `.gguf` file.
fn find_weights(dir: &Path) -> Result<Option<PathBuf>, ResolveError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return Ok(Some(index));
    }
    let by_extension = |ext: &str| -> Result<Vec<PathBuf>, ResolveError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ResolveError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some(ext) && p.is_file())
            .collect();
        found.sort();
        Ok(found)
    };
    for ext in ["safetensors", "gguf"] {
        let found = by_extension(ext)?;
        match found.len() {
            0 => continue,
            1 => return Ok(found.into_iter().next()),
            _ => {
                let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
                return Err(ResolveError::NotFound(format!(
                    "{}: several .{ext} files and no index; choose one with --weight-path ({})",
                    dir.display(),
                    names.join(", ")
                )));
            }
        }
    }
    Ok(None)
}

fn looks_like_repo_id(model: &str) -> bool {
    let mut parts = model.split('/');
    let ok = |s: Option<&str>| {
        s.is_some_and(|s| {
            !s.is_empty()
                && !s.starts_with('.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    std::env::var_os("HOME").map(|home| {
        PathBuf::from(home)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// The snapshot directory of `repo` at `revision` (a branch or tag through
/// `refs/`, or a commit hash).
fn hf_snapshot(repo: &str, revision: &str) -> Result<PathBuf, ResolveError> {
    let cache = hf_cache_dir().ok_or_else(|| {
        ResolveError::NotFound(
            "cannot locate the Hugging Face cache (no HOME, HF_HOME or HF_HUB_CACHE)".to_owned(),
        )
    })?;
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    if !repo_dir.is_dir() {
        return Err(ResolveError::NotFound(format!(
            "{repo} is not in the Hugging Face cache ({} does not exist); this host works offline: download the model elsewhere, or pass a local directory",
            repo_dir.display()
        )));
    }
    let reference = repo_dir.join("refs").join(revision);
    let commit = if reference.is_file() {
        std::fs::read_to_string(&reference)
            .map_err(|source| ResolveError::Io {
                path: reference.clone(),
                source,
            })?
            .trim()
            .to_owned()
    } else {
        revision.to_owned()
    };
    let snapshot = repo_dir.join("snapshots").join(&commit);
    if snapshot.is_dir() && !commit.contains('/') && !commit.starts_with('.') {
        Ok(snapshot)
    } else {
        Err(ResolveError::NotFound(format!(
            "{repo}: revision `{revision}` is not in the cache (no {} and no snapshot {})",
            reference.display(),
            snapshot.display()
        )))
    }
}

/// Reads `config.json` from a model directory.
pub fn read_config(dir: &Path) -> Result<serde_json::Value, ResolveError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| ResolveError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ResolveError::BadConfig {
        path,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_recognized() {
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!looks_like_repo_id("./model"));
        assert!(!looks_like_repo_id("a/b/c"));
        assert!(!looks_like_repo_id("../x"));
    }
}
