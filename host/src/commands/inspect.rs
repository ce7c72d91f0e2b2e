//! `host inspect MODEL`: the checkpoint's tensors and metadata, the module
//! state dict the architecture expects, and the weight adapter's mapping
//! between them (MAX's two print loops in one command).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln_plugin_api::{ConfigRequest, GraphRequest};
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::gguf::GgufValue;
use crate::checkpoint::TensorBytes;
use crate::cli::InspectArgs;
use crate::model::{self, resolve};
use crate::plugins::ArchitectureRegistry;

#[derive(Serialize)]
struct TensorRow {
    name: String,
    shape: Vec<u64>,
    storage: String,
    bytes: usize,
}

#[derive(Serialize)]
struct ExpectedRow {
    name: String,
    shape: Vec<u64>,
    dtype: String,
    encoding: String,
}

#[derive(Serialize)]
struct MappedRow {
    name: String,
    source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<(u64, u64)>,
    encoding: String,
}

#[derive(Serialize, Default)]
struct Adaptation {
    mapped: Vec<MappedRow>,
    /// Expected by the module, not provided.
    missing: Vec<String>,
    /// Provided, not expected by the module.
    unexpected: Vec<String>,
    /// Provided with another shape than expected.
    mismatched: Vec<String>,
    /// Checkpoint tensors the adapter did not use.
    unused: Vec<String>,
}

#[derive(Serialize)]
struct Report {
    model: String,
    format: String,
    files: Vec<String>,
    architecture: Option<String>,
    architecture_error: Option<String>,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorRow>,
    expected: Vec<ExpectedRow>,
    adaptation: Option<Adaptation>,
}

/// Prints the report as text or JSON.
pub fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let registry = ArchitectureRegistry::load(&args.plugins.custom_architectures)?;
    let resolved = resolve(
        &args.model,
        args.location.revision.as_deref(),
        args.location.weight_path.as_deref(),
    )?;
    let (checkpoint, hf_config) = model::open_checkpoint(&resolved, TensorBytes::Mapped)?;
    let mut report = Report {
        model: resolved.name.clone(),
        format: checkpoint.format.to_string(),
        files: checkpoint
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect(),
        architecture: None,
        architecture_error: None,
        metadata: checkpoint
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), abbreviate(v)))
            .collect(),
        tensors: checkpoint
            .tensors
            .values()
            .map(|t| TensorRow {
                name: t.info.name.clone(),
                shape: t.info.shape.clone(),
                storage: t.info.storage.clone(),
                bytes: t.byte_len(),
            })
            .collect(),
        expected: Vec::new(),
        adaptation: None,
    };
    match model::find_architecture(&registry, &hf_config, &checkpoint) {
        Err(e) => report.architecture_error = Some(e.to_string()),
        Ok(arch) => {
            report.architecture = Some(format!(
                "{} (plugin `{}`, {})",
                arch.info.name, arch.plugin.name, arch.plugin.source
            ));
            let config = arch.config(&ConfigRequest {
                hf_config: hf_config.clone(),
                max_length: None,
            })?;
            let expected = arch
                .build_graph(&GraphRequest {
                    config,
                    weights_format: Some(checkpoint.format),
                    state_dict: None,
                    task: None,
                })?
                .weights;
            report.expected = expected
                .iter()
                .map(|w| ExpectedRow {
                    name: w.name.clone(),
                    shape: w.shape.clone(),
                    dtype: w.dtype.to_string(),
                    encoding: w.encoding.to_string(),
                })
                .collect();
            let bound = model::bind_weights(arch, &checkpoint, &hf_config)?;
            let adaptation = arch.adapt_weights(&checkpoint.adapt_request(&hf_config))?;
            let expected: BTreeMap<&str, &kiln_plugin_api::graph::WeightSpec> =
                expected.iter().map(|w| (w.name.as_str(), w)).collect();
            let mut result = Adaptation {
                unused: bound.unused,
                ..Adaptation::default()
            };
            for adapted in &adaptation.weights {
                let spec = &bound.state_dict[&adapted.name];
                match expected.get(adapted.name.as_str()) {
                    None => result.unexpected.push(adapted.name.clone()),
                    Some(want) if want.shape != spec.shape => result.mismatched.push(format!(
                        "{}: expected {:?}, found {:?}",
                        adapted.name, want.shape, spec.shape
                    )),
                    Some(_) => {}
                }
                result.mapped.push(MappedRow {
                    name: adapted.name.clone(),
                    source: adapted.source.clone(),
                    rows: adapted.rows,
                    encoding: spec.encoding.to_string(),
                });
            }
            result.missing = expected
                .keys()
                .filter(|n| !bound.state_dict.contains_key(**n))
                .map(|n| n.to_string())
                .collect();
            report.adaptation = Some(result);
        }
    }
    let text = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        render(&report)
    };
    super::write_stdout(&text)
}

/// Long arrays (token lists) are summarized.
fn abbreviate(value: &GgufValue) -> Value {
    match value {
        GgufValue::Array(items) if items.len() > 16 => {
            Value::String(format!("[{} values]", items.len()))
        }
        GgufValue::String(s) if s.len() > 200 => Value::String(format!(
            "{}… ({} chars)",
            &s[..s.char_indices().nth(120).map_or(s.len(), |(i, _)| i)],
            s.len()
        )),
        other => other.to_json(),
    }
}

fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "model: {}\nformat: {}", r.model, r.format);
    for file in &r.files {
        let _ = writeln!(out, "file: {file}");
    }
    match (&r.architecture, &r.architecture_error) {
        (Some(arch), _) => {
            let _ = writeln!(out, "architecture: {arch}");
        }
        (None, Some(e)) => {
            let _ = writeln!(out, "architecture: none ({e})");
        }
        _ => {}
    }
    if !r.metadata.is_empty() {
        let _ = writeln!(out, "\nmetadata ({}):", r.metadata.len());
        for (k, v) in &r.metadata {
            let _ = writeln!(out, "  {k} = {v}");
        }
    }
    let total: usize = r.tensors.iter().map(|t| t.bytes).sum();
    let _ = writeln!(
        out,
        "\ncheckpoint tensors ({}, {:.1} MiB):",
        r.tensors.len(),
        total as f64 / (1 << 20) as f64
    );
    for t in &r.tensors {
        let _ = writeln!(
            out,
            "  {:<56} {:<16} {:<6} {:>12}",
            t.name,
            format!("{:?}", t.shape),
            t.storage,
            t.bytes
        );
    }
    if !r.expected.is_empty() {
        let _ = writeln!(out, "\nmodule state dict ({} weights):", r.expected.len());
        for e in &r.expected {
            let _ = writeln!(
                out,
                "  {:<56} {:<16} {}",
                e.name,
                format!("{:?}", e.shape),
                e.dtype
            );
        }
    }
    if let Some(a) = &r.adaptation {
        let _ = writeln!(
            out,
            "\nadaptation: {} mapped, {} missing, {} unexpected, {} mismatched, {} unused",
            a.mapped.len(),
            a.missing.len(),
            a.unexpected.len(),
            a.mismatched.len(),
            a.unused.len()
        );
        for m in &a.mapped {
            let rows = m
                .rows
                .map(|(s, e)| format!(" rows {s}..{e}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<56} <- {}{rows} ({})",
                m.name, m.source, m.encoding
            );
        }
        for (label, list) in [
            ("missing", &a.missing),
            ("unexpected", &a.unexpected),
            ("mismatched", &a.mismatched),
            ("unused", &a.unused),
        ] {
            for item in list {
                let _ = writeln!(out, "  {label}: {item}");
            }
        }
    }
    out
}
