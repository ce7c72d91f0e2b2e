//! `host new-plugin`: writes a plugin crate that starts from a built-in
//! family and replaces one block, ready to build, test and load.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::cli::{NewPluginArgs, PluginTemplate};

/// The Kiln checkout this host was built from: the default for the new
/// crate's path dependencies.
const KILN_CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A template's files: path in the new crate, contents.
const LLAMA: [(&str, &str); 3] = [
    (
        "Cargo.toml",
        include_str!("../../templates/llama/Cargo.toml"),
    ),
    ("src/lib.rs", include_str!("../../templates/llama/lib.rs")),
    (
        "fixtures/make_tiny_model.py",
        include_str!("../../templates/llama/make_tiny_model.py"),
    ),
];

/// Writes the crate and says what to run next.
pub fn new_plugin(args: &NewPluginArgs) -> anyhow::Result<()> {
    let crate_name = &args.name;
    anyhow::ensure!(
        !crate_name.is_empty()
            && crate_name.starts_with(|c: char| c.is_ascii_lowercase())
            && crate_name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'),
        "the plugin name `{crate_name}` must be a crate name: lowercase letters, digits, `-` or `_`, starting with a letter"
    );
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate_name));
    anyhow::ensure!(
        !dir.exists(),
        "{} already exists; choose another name or --dir",
        dir.display()
    );
    let kiln = match &args.kiln {
        Some(path) => path.clone(),
        None => PathBuf::from(KILN_CHECKOUT),
    };
    let kiln = kiln
        .canonicalize()
        .with_context(|| format!("the Kiln checkout {} (--kiln)", kiln.display()))?;
    anyhow::ensure!(
        kiln.join("plugin-api/Cargo.toml").is_file(),
        "{} is not a Kiln checkout (no plugin-api/Cargo.toml); pass --kiln PATH",
        kiln.display()
    );
    let arch = format!("{}ForCausalLM", camel_case(crate_name));
    let lib = crate_name.replace('-', "_");
    let files = match args.from {
        PluginTemplate::Llama => &LLAMA,
    };
    for (path, template) in files {
        let text = template
            .replace("{{crate}}", crate_name)
            .replace("{{lib}}", &lib)
            .replace("{{arch}}", &arch)
            .replace("{{kiln}}", &kiln.display().to_string());
        write(&dir.join(path), &text)?;
    }
    // Kiln's lock file pins the dependencies to the versions Kiln is tested
    // with (cargo drops what the crate does not use).
    if let Ok(lock) = std::fs::read(kiln.join("Cargo.lock")) {
        std::fs::write(dir.join("Cargo.lock"), lock)
            .with_context(|| format!("writing {}", dir.join("Cargo.lock").display()))?;
    }
    println!(
        "wrote {dir}: `{arch}`, a Llama variant whose MLP activation follows `hidden_act`\n\
         next:\n  cd {dir} && cargo test && cargo build\n  \
         host list-architectures --custom-architectures {dir}/target/debug/lib{lib}.so\n  \
         python fixtures/make_tiny_model.py   # a tiny checkpoint for `host verify` (needs torch)",
        dir = dir.display()
    );
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `my-arch` → `MyArch`.
fn camel_case(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_names_are_camel_case() {
        assert_eq!(camel_case("my-arch"), "MyArch");
        assert_eq!(camel_case("gelu_llama2"), "GeluLlama2");
    }
}
