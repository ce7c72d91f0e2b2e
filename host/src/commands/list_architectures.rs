//! `host list-architectures`: what this host can run, and where it comes from.

use serde::Serialize;

use crate::cli::ListArchitecturesArgs;
use crate::plugins::{Architecture, ArchitectureRegistry};

/// One row of the listing; the JSON output is an array of these.
#[derive(Debug, Serialize)]
struct Listing<'a> {
    name: &'a str,
    aliases: &'a [String],
    source: String,
    plugin: &'a str,
    plugin_version: &'a str,
    task: &'a str,
    encodings: Vec<&'a str>,
    default_encoding: &'a str,
    default_weights_format: &'a str,
    example_repo_ids: &'a [String],
}

impl<'a> Listing<'a> {
    fn new(arch: &'a Architecture) -> Self {
        let info = &arch.info;
        Self {
            name: &info.name,
            aliases: &info.aliases,
            source: arch.plugin.source.to_string(),
            plugin: &arch.plugin.name,
            plugin_version: &arch.plugin.version,
            task: info.task.as_str(),
            encodings: info
                .supported_encodings
                .iter()
                .map(|e| e.as_str())
                .collect(),
            default_encoding: info.default_encoding.as_str(),
            default_weights_format: info.default_weights_format.as_str(),
            example_repo_ids: &info.example_repo_ids,
        }
    }
}

/// Prints every registered architecture as a table or as JSON.
pub fn list_architectures(args: &ListArchitecturesArgs) -> anyhow::Result<()> {
    let registry = ArchitectureRegistry::load(&args.plugins.custom_architectures)?;
    let rows: Vec<Listing<'_>> = registry.architectures().iter().map(Listing::new).collect();
    let text = if args.json {
        serde_json::to_string_pretty(&rows)? + "\n"
    } else {
        table(&rows)
    };
    super::write_stdout(&text)
}

fn table(rows: &[Listing<'_>]) -> String {
    let header = ["NAME", "ALIASES", "TASK", "ENCODINGS (* default)", "SOURCE"];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|row| {
            let encodings = row
                .encodings
                .iter()
                .map(|e| {
                    if *e == row.default_encoding {
                        format!("{e}*")
                    } else {
                        (*e).to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            let source = if row.source == "built-in" {
                format!("built-in ({})", row.plugin)
            } else {
                row.source.clone()
            };
            [
                row.name.to_owned(),
                row.aliases.join(","),
                row.task.to_owned(),
                encodings,
                source,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 5]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(header);
    for row in &cells {
        line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
    out
}
