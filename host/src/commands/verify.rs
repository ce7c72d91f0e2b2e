//! `host verify`: the model's logits against a reference directory (e.g.
//! transformers fp32), per prompt: max |Δlogit|, top-1 agreement, mean KL,
//! and the greedy continuation; for an embedding model, each text's pooled
//! embedding against the reference's: max |Δ| and cosine.

use std::path::Path;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::VerifyArgs;
use crate::embedding::Embedder;
use crate::engine::npy::{write_f32, Matrix};
use crate::engine::sampling::argmax;
use crate::engine::Generator;
use crate::model::Model;
use crate::verify::{
    compare_embedding, compare_logits, read_reference, EmbeddingComparison, EmbeddingReference,
    LogitsComparison, Reference, Tolerance,
};
use kiln_plugin_api::Task;

/// Without `--atol`, an embedding passes at this cosine or above.
const MIN_COSINE: f64 = 0.9999;

#[derive(Serialize)]
struct GreedyCheck {
    reference: Vec<u32>,
    kiln: Vec<u32>,
    /// The first step where they differ; `None` when identical.
    first_difference: Option<usize>,
}

#[derive(Serialize)]
struct PromptReport {
    name: String,
    #[serde(flatten)]
    logits: LogitsComparison,
    greedy: Option<GreedyCheck>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    architecture: String,
    precision: &'static str,
    /// How the prompt's logits were computed: `prefill` or `decode`.
    logits_from: &'static str,
    tolerance: Option<Tolerance>,
    prompts: Vec<PromptReport>,
    failures: Vec<String>,
}

/// Runs every reference prompt through the model and compares.
pub fn verify(args: &VerifyArgs) -> anyhow::Result<()> {
    // Fail fast on the device before reading a possibly large reference.
    crate::device::probe(args.load.runtime.device.parse()?)?;
    let tolerance = args.atol.map(|atol| Tolerance {
        atol,
        rtol: args.rtol,
    });
    let prompts = match read_reference(&args.reference)? {
        Reference::Logits(prompts) => prompts,
        Reference::Embeddings(texts) => return verify_embeddings(args, tolerance, texts),
    };
    let model = super::load_model(&args.load)?;
    match model.task {
        Task::TextGeneration => {}
        Task::Embeddings => bail!(
            "{} is an embedding model: its reference holds `<text>.ids.json` and \
             `<text>.embedding.npy` (the pooled embedding), not logits",
            model.architecture.info.name
        ),
        Task::SequenceClassification => bail!(
            "{} is a sequence classification model: `host verify` checks generation logits and embeddings",
            model.architecture.info.name
        ),
    }
    let mut report = Report {
        model: model.resolved.name.clone(),
        architecture: model.architecture.info.name.clone(),
        precision: args.load.runtime.precision.name(),
        logits_from: if args.decode { "decode" } else { "prefill" },
        tolerance,
        prompts: Vec::new(),
        failures: Vec::new(),
    };
    for prompt in prompts {
        let new_tokens = prompt.greedy.as_ref().map_or(0, Vec::len);
        let (logits, generated) = run_prompt(&model, &prompt.ids, new_tokens, args.decode)?;
        if let Some(dir) = &args.save {
            save_prompt(dir, &prompt.name, &prompt.ids, &logits, &generated)?;
        }
        let comparison = compare_logits(&logits, &prompt.logits, tolerance)
            .map_err(|e| e.context(format!("prompt `{}`", prompt.name)))?;
        let greedy = prompt.greedy.map(|reference| GreedyCheck {
            first_difference: (generated != reference).then(|| {
                generated
                    .iter()
                    .zip(&reference)
                    .position(|(a, b)| a != b)
                    .unwrap_or(generated.len().min(reference.len()))
            }),
            reference,
            kiln: generated,
        });
        let entry = PromptReport {
            name: prompt.name,
            logits: comparison,
            greedy,
        };
        report.failures.extend(failures(args, &entry));
        report.prompts.push(entry);
    }
    conclude(args.json, &report, || table(&report), &report.failures)
}

/// Prints the report (JSON or `table`), then fails if anything did.
fn conclude<R: Serialize>(
    json: bool,
    report: &R,
    table: impl FnOnce() -> String,
    failures: &[String],
) -> anyhow::Result<()> {
    let text = match json {
        true => serde_json::to_string_pretty(report)? + "\n",
        false => table(),
    };
    super::write_stdout(&text)?;
    if !failures.is_empty() {
        bail!("verification failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// Teacher-forced logits of `ids` (in one prefill, or one decode step per
/// token when `decode`), then `new_tokens` greedy tokens.
fn run_prompt(
    model: &Model,
    ids: &[u32],
    new_tokens: usize,
    decode: bool,
) -> anyhow::Result<(Matrix, Vec<u32>)> {
    let capacity = ids.len() + new_tokens;
    let limit = model.config.max_seq_len as usize;
    if capacity > limit {
        bail!(
            "a prompt of {} tokens plus {new_tokens} new ones exceeds the model's {limit}",
            ids.len()
        );
    }
    let mut generator = Generator::new(model, capacity.max(1))?;
    let rows = match decode {
        false => generator.feed(ids, true)?,
        true => ids
            .iter()
            .map(|&id| Ok(generator.feed(&[id], false)?.remove(0)))
            .collect::<anyhow::Result<Vec<_>>>()?,
    };
    let cols = rows[0].len();
    let mut next = rows.last().expect("one row per prompt token").clone();
    let logits = Matrix {
        rows: rows.len(),
        cols,
        data: rows.into_iter().flatten().collect(),
    };
    let mut generated = Vec::with_capacity(new_tokens);
    for step in 0..new_tokens {
        let token = argmax(&next);
        generated.push(token);
        if step + 1 < new_tokens {
            next = generator.feed(&[token], false)?.remove(0);
        }
    }
    Ok((logits, generated))
}

/// Writes one prompt's ids, logits and greedy tokens in the reference
/// directory format (`crate::verify`).
fn save_prompt(
    dir: &Path,
    name: &str,
    ids: &[u32],
    logits: &Matrix,
    generated: &[u32],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |file: String, bytes: Vec<u8>| {
        let path = dir.join(file);
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
    };
    write(
        format!("{name}.ids.json"),
        serde_json::to_vec(&serde_json::json!({ "ids": ids }))?,
    )?;
    if !generated.is_empty() {
        write(
            format!("{name}.greedy.json"),
            serde_json::to_vec(&serde_json::json!({ "new_ids": generated }))?,
        )?;
    }
    let path = dir.join(format!("{name}.logits.npy"));
    write_f32(&path, &[logits.rows, logits.cols], &logits.data)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The criteria the user asked for that this prompt misses.
fn failures(args: &VerifyArgs, prompt: &PromptReport) -> Vec<String> {
    let (name, logits) = (&prompt.name, &prompt.logits);
    let mut failures = Vec::new();
    if let (Some(atol), Some(ratio)) = (args.atol, logits.worst_band_ratio) {
        if ratio > 1.0 {
            let (pos, id) = logits.max_abs_diff_at;
            failures.push(format!(
                "{name}: |Δlogit| up to {:.3e} (position {pos}, token {id}) exceeds {atol} + {}·|reference|",
                logits.max_abs_diff, args.rtol
            ));
        }
        if !logits.clear_top1_misses.is_empty() {
            failures.push(format!(
                "{name}: the argmax differs at positions {:?}, where the reference's margin is clear",
                logits.clear_top1_misses
            ));
        }
    }
    if let Some(bound) = args.max_mean_kl {
        if logits.mean_kl > bound {
            failures.push(format!(
                "{name}: mean KL {:.5} exceeds {bound}",
                logits.mean_kl
            ));
        }
    }
    if let Some(bound) = args.min_top1 {
        if logits.top1_rate() < bound {
            failures.push(format!(
                "{name}: top-1 agreement {:.3} is below {bound}",
                logits.top1_rate()
            ));
        }
    }
    if args.greedy {
        if let Some(GreedyCheck {
            first_difference: Some(step),
            ..
        }) = &prompt.greedy
        {
            failures.push(format!(
                "{name}: the greedy continuation differs from step {step}"
            ));
        }
    }
    failures
}

fn table(report: &Report) -> String {
    let mut out = format!(
        "{} ({}), precision {}, logits from {}\n{:<16} {:>6} {:>12} {:>14} {:>10} {:>10}  greedy\n",
        report.model,
        report.architecture,
        report.precision,
        report.logits_from,
        "prompt",
        "tokens",
        "max|Δlogit|",
        "top-1",
        "mean KL",
        "max KL"
    );
    for p in &report.prompts {
        let l = &p.logits;
        let greedy = match &p.greedy {
            None => "-".to_owned(),
            Some(g) => match g.first_difference {
                None => format!("identical ({} tokens)", g.reference.len()),
                Some(step) => format!("differs from step {step}"),
            },
        };
        out.push_str(&format!(
            "{:<16} {:>6} {:>12.3e} {:>7}/{:<6} {:>10.2e} {:>10.2e}  {greedy}\n",
            p.name, l.positions, l.max_abs_diff, l.top1_agree, l.positions, l.mean_kl, l.max_kl
        ));
    }
    out
}

#[derive(Serialize)]
struct EmbeddingReport {
    model: String,
    architecture: String,
    tolerance: Option<Tolerance>,
    texts: Vec<TextReport>,
    failures: Vec<String>,
}

#[derive(Serialize)]
struct TextReport {
    name: String,
    tokens: usize,
    #[serde(flatten)]
    comparison: EmbeddingComparison,
}

/// Every reference text through the embedding model: each pooled embedding
/// within the tolerance (`--atol`/`--rtol`), or at a cosine of at least
/// [`MIN_COSINE`] without one.
fn verify_embeddings(
    args: &VerifyArgs,
    tolerance: Option<Tolerance>,
    texts: Vec<EmbeddingReference>,
) -> anyhow::Result<()> {
    let logits_only = [
        ("--greedy", args.greedy),
        ("--max-mean-kl", args.max_mean_kl.is_some()),
        ("--min-top1", args.min_top1.is_some()),
    ];
    if let Some((flag, _)) = logits_only.iter().find(|(_, given)| *given) {
        bail!("{flag} applies to logits references; this reference holds embeddings");
    }
    // A decoder's embeddings are checked as `host embed` makes them.
    let model = super::load_model_as(&args.load, args.load.runtime.runner.pooling_unless_chosen())?;
    let (name, architecture) = (
        model.resolved.name.clone(),
        model.architecture.info.name.clone(),
    );
    if model.task != Task::Embeddings {
        bail!("the reference holds embeddings, but {architecture} is not an embedding model");
    }
    let embedder =
        Embedder::new(model, crate::embedding::DEFAULT_BATCH_TOKENS).map_err(anyhow::Error::msg)?;
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| t.ids.clone()).collect();
    let embeddings = embedder.embed(&ids)?;
    let mut report = EmbeddingReport {
        model: name,
        architecture,
        tolerance,
        texts: Vec::new(),
        failures: Vec::new(),
    };
    for (text, embedding) in texts.into_iter().zip(embeddings) {
        let comparison = compare_embedding(&embedding, &text.embedding, tolerance)
            .map_err(|e| e.context(format!("text `{}`", text.name)))?;
        match (tolerance, comparison.worst_band_ratio) {
            (Some(t), Some(ratio)) if ratio > 1.0 => report.failures.push(format!(
                "{}: |Δ| up to {:.3e} exceeds {} + {}·|reference|",
                text.name, comparison.max_abs_diff, t.atol, t.rtol
            )),
            (None, _) if comparison.cosine < MIN_COSINE => report.failures.push(format!(
                "{}: cosine {:.6} is below {MIN_COSINE}",
                text.name, comparison.cosine
            )),
            _ => {}
        }
        report.texts.push(TextReport {
            name: text.name,
            tokens: text.ids.len(),
            comparison,
        });
    }
    conclude(
        args.json,
        &report,
        || embedding_table(&report),
        &report.failures,
    )
}

fn embedding_table(report: &EmbeddingReport) -> String {
    let mut out = format!(
        "{} ({})\n{:<16} {:>6} {:>12} {:>10}\n",
        report.model, report.architecture, "text", "tokens", "max|Δ|", "cosine"
    );
    for t in &report.texts {
        let c = &t.comparison;
        out.push_str(&format!(
            "{:<16} {:>6} {:>12.3e} {:>10.7}\n",
            t.name, t.tokens, c.max_abs_diff, c.cosine
        ));
    }
    out
}
