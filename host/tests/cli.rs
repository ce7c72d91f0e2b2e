//! The `host` command line as a user meets it. (Being an integration test of
//! this package also makes `cargo test --workspace` build the `host` binary,
//! which the end-to-end tests in `tests/` run.)

use std::process::Command;

fn host(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .env("KILN_LOG", "off")
        .output()
        .expect("host runs")
}

#[test]
fn version_and_help_name_the_commands() {
    let output = host(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("host {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&host(&["--help"]).stdout).into_owned();
    assert!(help.contains("list-architectures"), "{help}");
}

#[test]
fn usage_errors_exit_with_code_2() {
    let output = host(&["list-architectures", "--no-such-flag"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--no-such-flag"));
    assert_eq!(host(&["no-such-command"]).status.code(), Some(2));
}

#[test]
fn json_listing_has_the_documented_fields() {
    let output = host(&["list-architectures", "--json"]);
    assert!(output.status.success());
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let first = &listing.as_array().unwrap()[0];
    for field in ["name", "aliases", "source", "task", "encodings"] {
        assert!(first.get(field).is_some(), "missing {field} in {first}");
    }
}

fn host_with_cache(args: &[&str], cache: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .env("KILN_LOG", "off")
        .env("KILN_CACHE_DIR", cache)
        .output()
        .expect("host runs")
}

#[test]
fn inspect_graph_prints_the_graph_and_the_compiled_program() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "vocab_size": 100, "rope_theta": 10000}"#,
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let cache = dir.path().join("cache");
    let args = [
        "inspect-graph",
        "--architecture",
        "llama",
        "--config",
        config,
        "--compiled",
    ];

    let first = host_with_cache(&args, &cache);
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(text.starts_with("graph decoder (ir v1) {"), "{text}");
    assert!(
        text.contains("weight \"layers.1.self_attn.o_proj.weight\""),
        "{text}"
    );
    assert!(text.contains("paged_attention("), "{text}");
    assert!(text.contains("program (compiled in"), "{text}");
    assert!(text.contains("linear[lm_head.weight float32]"), "{text}");

    let second = host_with_cache(&args, &cache);
    assert!(String::from_utf8_lossy(&second.stdout)
        .contains("program (loaded from the compile cache in"));

    // Errors: an unknown architecture, and a config the plugin rejects.
    let unknown = host(&[
        "inspect-graph",
        "--architecture",
        "Nope",
        "--config",
        config,
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains(
            "unknown architecture `Nope` (registered: LlamaForCausalLM, MistralForCausalLM"
        ),
        "{stderr}"
    );
    std::fs::write(dir.path().join("bad.json"), r#"{"hidden_size": 64}"#).unwrap();
    let bad = host(&[
        "inspect-graph",
        "--architecture",
        "llama",
        "--config",
        dir.path().join("bad.json").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("LlamaForCausalLM (llama): config: config.json has no `num_hidden_layers`"),
        "{stderr}"
    );
}
