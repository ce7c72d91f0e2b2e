//! `host embed`: texts in, one JSON line per text out
//! (`{"index", "tokens", "embedding"}`).

use std::io::Read;

use anyhow::Context;
use kiln_plugin_api::Task;

use crate::cli::EmbedArgs;
use crate::embedding::{Embedder, DEFAULT_BATCH_TOKENS};

/// Loads the embedding model and embeds the texts.
pub fn embed(args: &EmbedArgs) -> anyhow::Result<()> {
    let texts = match &args.input {
        None => args.text.clone(),
        Some(path) => {
            let mut text = String::new();
            if path.as_os_str() == "-" {
                std::io::stdin().read_to_string(&mut text)?;
            } else {
                text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --input {}", path.display()))?;
            }
            text.lines().map(str::to_owned).collect()
        }
    };
    // `host embed` runs a decoder as an embedding model unasked.
    let model = super::load_model_as(&args.load, args.load.runtime.runner.pooling_unless_chosen())?;
    let tokenizer = model
        .tokenizer
        .clone()
        .context("the model has no tokenizer (tokenizer.json)")?;
    let info = &model.architecture.info;
    match model.task {
        Task::Embeddings => {}
        Task::SequenceClassification => anyhow::bail!(
            "`{}` is a sequence classification model, not an embedding model: serve it for /v1/score, /v1/rerank and /v1/classify",
            info.name
        ),
        Task::TextGeneration => anyhow::bail!(
            "`{}` is a text-generation model, not an embedding model",
            info.name
        ),
    }
    let embedder = Embedder::new(model, DEFAULT_BATCH_TOKENS).map_err(anyhow::Error::msg)?;
    tracing::info!("{}", embedder.head());
    let ids = texts
        .iter()
        .map(|text| tokenizer.encode(text, true))
        .collect::<Result<Vec<_>, _>>()?;
    let started = std::time::Instant::now();
    let embeddings = embedder.embed(&ids)?;
    let seconds = started.elapsed().as_secs_f64();
    let tokens: usize = ids.iter().map(Vec::len).sum();
    tracing::info!(
        "embedded {} texts ({tokens} tokens) in {:.1} ms: {:.1} texts/s, {:.0} tokens/s",
        ids.len(),
        seconds * 1e3,
        ids.len() as f64 / seconds.max(1e-9),
        tokens as f64 / seconds.max(1e-9),
    );
    let mut out = String::new();
    for (index, (embedding, ids)) in embeddings.iter().zip(&ids).enumerate() {
        let line = serde_json::json!({"index": index, "tokens": ids.len(), "embedding": embedding});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    super::write_stdout(&out)
}
