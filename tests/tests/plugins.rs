//! End to end: third-party plugins built with cargo, loaded by the `host`
//! binary and in-process, and every way loading can fail.

use std::path::Path;

use kiln_host::plugins::{load_plugin_file, ArchitectureRegistry};
use kiln_plugin_api::abi::{PluginErrorKind, INTERFACE_VERSION};
use kiln_plugin_api::{ConfigRequest, ServingRequest};
use kiln_tests::{
    builtin_plugin_library, example_plugin_against_interface, fixture_plugin, run_host, text,
};
use serde_json::{json, Value};

fn list_json(plugins: &[&Path]) -> Vec<Value> {
    let mut args = vec!["list-architectures".to_owned(), "--json".to_owned()];
    for plugin in plugins {
        args.push("--custom-architectures".to_owned());
        args.push(plugin.display().to_string());
    }
    let output = run_host(&args, &[]);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "host failed: {stderr}");
    serde_json::from_str::<Value>(&stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn entry<'a>(listing: &'a [Value], name: &str) -> &'a Value {
    listing
        .iter()
        .find(|arch| arch["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed in {listing:?}"))
}

/// Runs `host list-architectures` with logging off and expects a failure
/// reported in at most two lines, without a panic or a backtrace.
fn expect_load_failure(plugins: &[&Path], env: &[(&str, &str)]) -> String {
    let mut args = vec!["list-architectures".to_owned()];
    for plugin in plugins {
        args.push("--custom-architectures".to_owned());
        args.push(plugin.display().to_string());
    }
    let mut env = env.to_vec();
    env.push(("KILN_LOG", "off"));
    let output = run_host(&args, &env);
    let (stdout, stderr) = text(&output);
    assert_eq!(
        output.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.is_empty(), "nothing is listed on failure: {stdout}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.lines().count() <= 2, "the error is short:\n{stderr}");
    for noise in [
        "panicked at",
        "stack backtrace",
        "RUST_BACKTRACE",
        "Attempted to panic",
    ] {
        assert!(!stderr.contains(noise), "{noise:?} in:\n{stderr}");
    }
    stderr
}

#[test]
fn builtin_architectures_are_listed_without_flags() {
    let listing = list_json(&[]);
    let llama = entry(&listing, "LlamaForCausalLM");
    assert_eq!(llama["source"], "built-in");
    assert_eq!(llama["aliases"], json!(["llama"]));
    assert_eq!(llama["task"], "text-generation");
    assert_eq!(llama["default_encoding"], "bfloat16");
    assert!(llama["encodings"]
        .as_array()
        .unwrap()
        .contains(&json!("q4_k")));
    assert_eq!(entry(&listing, "MistralForCausalLM")["source"], "built-in");
}

#[test]
fn example_plugin_is_listed_with_its_source() {
    let plugin = fixture_plugin("example-plugin");
    let listing = list_json(&[&plugin]);
    let example = entry(&listing, "ExampleForCausalLM");
    assert_eq!(example["source"], plugin.display().to_string());
    assert_eq!(example["plugin"], "example");
    assert_eq!(example["plugin_version"], "0.3.0");
    assert_eq!(example["aliases"], json!(["example"]));
    assert_eq!(example["task"], "text-generation");
    assert_eq!(example["encodings"], json!(["float32", "bfloat16"]));
    assert_eq!(
        example["example_repo_ids"],
        json!(["example-org/example-tiny"])
    );
    // The built-ins are still there.
    assert_eq!(entry(&listing, "LlamaForCausalLM")["source"], "built-in");

    let output = run_host(
        [
            "list-architectures",
            "--custom-architectures",
            plugin.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = text(&output);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("ExampleForCausalLM"))
        .unwrap();
    assert!(
        row.contains("float32*,bfloat16") && row.ends_with(plugin.to_str().unwrap()),
        "{row}"
    );
    // The plugin's log line reaches the host's logger, named after the plugin.
    assert!(
        stderr.contains("[example] registering the example architecture"),
        "{stderr}"
    );
}

#[test]
fn a_directory_loads_every_plugin_in_it_once() {
    let plugin = fixture_plugin("example-plugin");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(plugin.file_name().unwrap());
    std::fs::copy(&plugin, &copy).unwrap();
    std::fs::write(dir.path().join("README.txt"), "not a plugin").unwrap();
    // The same file through the directory and directly is loaded once.
    let listing = list_json(&[dir.path(), &copy]);
    let names: Vec<_> = listing
        .iter()
        .filter(|a| a["name"] == "ExampleForCausalLM")
        .collect();
    assert_eq!(names.len(), 1);
    assert_eq!(names[0]["source"], copy.display().to_string());
}

#[test]
fn a_custom_architecture_overrides_a_builtin_with_a_warning() {
    let plugin = fixture_plugin("llama-override-plugin");
    let output = run_host(
        [
            "list-architectures",
            "--json",
            "--custom-architectures",
            plugin.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("WARN")
            && stderr.contains("custom architecture `LlamaForCausalLM`")
            && stderr.contains("overrides the built-in `LlamaForCausalLM` of plugin `llama`"),
        "{stderr}"
    );
    let listing: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    let llamas: Vec<_> = listing
        .iter()
        .filter(|a| a["name"] == "LlamaForCausalLM")
        .collect();
    assert_eq!(
        llamas.len(),
        1,
        "the built-in is replaced, not listed twice"
    );
    assert_eq!(llamas[0]["source"], plugin.display().to_string());
    assert_eq!(llamas[0]["encodings"], json!(["q4_0"]));
    assert_eq!(entry(&listing, "MistralForCausalLM")["source"], "built-in");
}

#[test]
fn a_missing_path_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libmissing.so");
    let stderr = expect_load_failure(&[&missing], &[]);
    assert_eq!(
        stderr.trim(),
        format!("error: plugin path {} does not exist", missing.display())
    );
}

#[test]
fn a_crate_built_as_a_rust_library_is_told_to_be_a_cdylib() {
    // `crate-type = ["lib"]`: cargo writes libmine.rlib and no libmine.so.
    let dir = tempfile::tempdir().unwrap();
    let rlib = dir.path().join("libmine.rlib");
    std::fs::write(&rlib, b"!<arch>\n").unwrap();
    for path in [dir.path().join("libmine.so"), rlib] {
        let stderr = expect_load_failure(&[&path], &[]);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("built as a Rust library (libmine.rlib)")
                && stderr.contains("crate-type = [\"cdylib\"]"),
            "{stderr}"
        );
    }
}

#[test]
fn a_file_that_is_not_a_shared_library_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libfake.so");
    std::fs::write(&fake, "#!/bin/sh\necho I am not a library\n").unwrap();
    let stderr = expect_load_failure(&[&fake], &[]);
    assert_eq!(
        stderr.trim(),
        format!("error: {} is not a shared library", fake.display())
    );
}

#[test]
fn a_shared_library_that_is_not_a_plugin_is_reported() {
    let library = fixture_plugin("not-a-plugin");
    let stderr = expect_load_failure(&[&library], &[]);
    assert!(
        stderr.contains(&format!("{} is not a Kiln plugin", library.display()))
            && stderr.contains("export_plugin!"),
        "{stderr}"
    );
}

#[test]
fn a_plugin_built_against_another_major_version_is_rejected_naming_both() {
    let plugin = example_plugin_against_interface("v0-99-0", "0.99.0", &[]);
    let stderr = expect_load_failure(&[&plugin], &[]);
    assert!(
        stderr.contains("was built against kiln-plugin-api 0.99.0")
            && stderr.contains(&format!("this host uses {INTERFACE_VERSION}")),
        "{stderr}"
    );
}

#[test]
fn a_plugin_built_against_a_newer_minor_version_is_refused_in_one_line() {
    let host = kiln_plugin_api::abi::InterfaceVersion::current();
    let newer = format!("{}.{}.0", host.major, host.minor + 1);
    let plugin = example_plugin_against_interface("next-minor", &newer, &[]);
    let stderr = expect_load_failure(&[&plugin], &[]);
    let line = stderr
        .lines()
        .find(|l| l.contains("was built against"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains(&format!(
            "kiln-plugin-api {newer}, newer than this host's {INTERFACE_VERSION}"
        )) && line.contains("upgrade the host"),
        "{stderr}"
    );
}

#[test]
fn a_plugin_built_against_another_patch_version_loads() {
    let host = kiln_plugin_api::abi::InterfaceVersion::current();
    let patch = format!("{}.{}.{}", host.major, host.minor, host.patch + 7);
    let plugin = example_plugin_against_interface("next-patch", &patch, &[]);
    let listing = list_json(&[&plugin]);
    assert_eq!(
        entry(&listing, "ExampleForCausalLM")["source"],
        plugin.display().to_string()
    );
}

#[test]
fn a_plugin_built_against_the_previous_release_loads_and_generates() {
    // Built against the frozen copy of kiln-plugin-api 1.0.0 under
    // tests/fixtures/compat, as a plugin nobody rebuilt.
    let plugin = kiln_tests::compat_plugin();
    let listing = list_json(&[&plugin]);
    assert_eq!(
        entry(&listing, "CompatLlamaForCausalLM")["source"],
        plugin.display().to_string()
    );
    // The plugin really is 1.0's, and the 1.0 host service answers it.
    let output = run_host(
        [
            "-v",
            "list-architectures",
            "--custom-architectures",
            plugin.to_str().unwrap(),
        ],
        &[],
    );
    let (_, stderr) = text(&output);
    assert!(
        stderr.contains(&format!(
            "[compat-llama] built against kiln-plugin-api 1.0.0, loaded by a host with {INTERFACE_VERSION}"
        )),
        "{stderr}"
    );

    let path = kiln_tests::workspace_root().join("tests/fixtures/reference/tiny_llama.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (mut config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    config["architectures"] = json!(["CompatLlamaForCausalLM"]);
    let dir = tempfile::tempdir().unwrap();
    kiln_tests::models::write_model_dir(&config, &weights, dir.path(), false);
    let prompt: Vec<i64> = serde_json::from_value(fixture["prompts"][2].clone()).unwrap();
    let expected: Vec<i64> = serde_json::from_value(fixture["greedy"].clone()).unwrap();
    let ids = generate_ids(
        dir.path(),
        &prompt,
        expected.len(),
        &["--custom-architectures", plugin.to_str().unwrap()],
    )
    .unwrap();
    assert_eq!(
        ids, expected,
        "the 1.0 plugin generates transformers' tokens"
    );

    // 1.1's `serving_defaults` entry point: the 1.0 plugin answers that it
    // has none, and the host reads that as "no defaults".
    let loaded = load_plugin_file(&plugin).unwrap();
    let arch = &loaded.architectures[0];
    let config = arch
        .config(&ConfigRequest {
            hf_config: config,
            max_length: None,
        })
        .unwrap();
    let request = ServingRequest {
        config,
        chat_template: None,
    };
    assert_eq!(arch.serving_defaults(&request).unwrap(), None);
}

#[test]
fn architectures_name_their_tool_call_parser_through_the_abi() {
    let (mut config, _) = kiln_tests::models::tiny_model("tiny_qwen2.json");
    let parser = |arch: &kiln_host::plugins::Architecture, hf_config: &Value| {
        let config = arch
            .config(&ConfigRequest {
                hf_config: hf_config.clone(),
                max_length: None,
            })
            .unwrap();
        arch.serving_defaults(&ServingRequest {
            config,
            chat_template: None,
        })
        .unwrap()
        .and_then(|d| d.tool_call_parser)
    };
    // Across the boundary, from the Qwen plugin built as a shared library.
    let qwen = load_plugin_file(&builtin_plugin_library("qwen")).unwrap();
    let qwen2 = qwen
        .architectures
        .iter()
        .find(|a| a.info.name == "Qwen2ForCausalLM")
        .unwrap();
    assert_eq!(parser(qwen2, &config).as_deref(), Some("hermes"));

    // Llama names `llama3_json` for Llama 3's vocabulary only.
    let registry = ArchitectureRegistry::load(&[]).unwrap();
    let llama = registry.get("LlamaForCausalLM").unwrap();
    config["architectures"] = json!(["LlamaForCausalLM"]);
    assert_eq!(parser(llama, &config), None);
    config["vocab_size"] = json!(128_256);
    assert_eq!(parser(llama, &config).as_deref(), Some("llama3_json"));
    // Gemma names none.
    let gemma = registry.get("Gemma3ForCausalLM").unwrap();
    let (gemma_config, _) = kiln_tests::models::tiny_model("tiny_gemma3.json");
    assert_eq!(parser(gemma, &gemma_config), None);
}

#[test]
fn a_changed_layout_without_a_version_bump_is_rejected_briefly() {
    // The same version number, but a frozen boundary type changed: what
    // happens when someone edits the ABI against the policy.
    let plugin = example_plugin_against_interface(
        "changed-layout",
        INTERFACE_VERSION,
        &[(
            "    Internal = 3,\n",
            "    Internal = 3,\n    /// Added.\n    Extra = 4,\n",
        )],
    );
    let stderr = expect_load_failure(&[&plugin], &[]);
    assert!(
        stderr.contains("does not match this host's plugin interface"),
        "{stderr}"
    );

    // With -v the full report follows.
    let output = run_host(
        [
            "-v",
            "list-architectures",
            "--custom-architectures",
            plugin.to_str().unwrap(),
        ],
        &[("KILN_LOG", "off")],
    );
    let (_, stderr) = text(&output);
    assert!(
        stderr.contains("detail:") && stderr.lines().count() > 10,
        "{stderr}"
    );
}

#[test]
fn two_plugins_registering_the_same_name_are_rejected() {
    let plugin = fixture_plugin("example-plugin");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("libexample_again.so");
    std::fs::copy(&plugin, &copy).unwrap();
    let stderr = expect_load_failure(&[&plugin, &copy], &[]);
    assert!(
        stderr.contains("architecture name `ExampleForCausalLM` is registered twice")
            && stderr.contains(&plugin.display().to_string())
            && stderr.contains(&copy.display().to_string()),
        "{stderr}"
    );
}

#[test]
fn a_plugin_that_panics_while_loading_is_reported() {
    let plugin = fixture_plugin("panicking-plugin");
    let stderr = expect_load_failure(&[&plugin], &[("KILN_FIXTURE_PANIC_ON_LOAD", "1")]);
    assert!(
        stderr.contains("failed to load: `load` panicked: intentional panic while loading"),
        "{stderr}"
    );
}

#[test]
fn a_panicking_entry_point_is_reported_and_the_host_keeps_running() {
    let panicking = load_plugin_file(&fixture_plugin("panicking-plugin")).unwrap();
    let arch = &panicking.architectures[0];
    let request = ConfigRequest {
        hf_config: json!({}),
        max_length: None,
    };
    for _ in 0..2 {
        let error = arch.config(&request).unwrap_err();
        assert_eq!(error.kind, PluginErrorKind::Panicked);
        assert!(
            error
                .message
                .starts_with("`config` panicked: intentional panic in config (at "),
            "{}",
            error.message
        );
    }

    // Other plugins keep working in the same process.
    let example = load_plugin_file(&fixture_plugin("example-plugin")).unwrap();
    let request = ConfigRequest {
        hf_config: json!({
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 256, "max_position_embeddings": 1024
        }),
        max_length: Some(512),
    };
    let config = example.architectures[0].config(&request).unwrap();
    assert_eq!(config.max_seq_len, 512);
    assert_eq!(
        (
            config.kv.num_layers,
            config.kv.num_kv_heads,
            config.kv.head_dim
        ),
        (4, 2, 32)
    );

    // Plugin errors (not panics) keep their kind and message.
    let bad = ConfigRequest {
        hf_config: json!({"num_hidden_layers": -1, "max_position_embeddings": 64}),
        max_length: None,
    };
    let error = example.architectures[0].config(&bad).unwrap_err();
    assert_eq!(error.kind, PluginErrorKind::Invalid);
    assert!(
        error
            .to_string()
            .contains("`num_hidden_layers` must be a non-negative integer"),
        "{error}"
    );
}

#[test]
fn the_registry_resolves_names_and_aliases_across_plugins() {
    let registry = ArchitectureRegistry::load(&[fixture_plugin("example-plugin")]).unwrap();
    assert_eq!(registry.get("llama").unwrap().info.name, "LlamaForCausalLM");
    assert_eq!(
        registry.get("example").unwrap().info.name,
        "ExampleForCausalLM"
    );
    assert!(registry.get("Qwen9ForCausalLM").is_none());
    let llama = registry.get("LlamaForCausalLM").unwrap();
    let request = ConfigRequest {
        hf_config: json!({
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "hidden_size": 576, "max_position_embeddings": 8192, "vocab_size": 49152,
            "intermediate_size": 1536
        }),
        max_length: None,
    };
    assert_eq!(llama.config(&request).unwrap().kv.head_dim, 64);
}

/// `host generate --output json` greedy ids for `prompt` with `args` added.
fn generate_ids(
    model: &Path,
    prompt: &[i64],
    new: usize,
    extra: &[&str],
) -> Result<Vec<i64>, String> {
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    let (prompt, new) = (prompt.join(","), new.to_string());
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "--max-new-tokens",
        &new,
        "--temperature",
        "0",
    ];
    args.extend(extra);
    let json = kiln_tests::generate_json(&args)?;
    Ok(serde_json::from_value(json["generated_ids"].clone()).unwrap())
}

#[test]
fn builtin_plugins_built_as_shared_libraries_generate_like_the_linked_ones() {
    let fixtures = [
        ("llama", "tiny_llama.json", "LlamaForCausalLM"),
        ("qwen", "tiny_qwen3.json", "Qwen3ForCausalLM"),
        ("gemma", "tiny_gemma3.json", "Gemma3ForCausalLM"),
        ("phi3", "tiny_phi3.json", "Phi3ForCausalLM"),
        ("gpt2", "tiny_gpt2.json", "GPT2LMHeadModel"),
    ];
    for (family, fixture, architecture) in fixtures {
        let library = builtin_plugin_library(family);
        let path = kiln_tests::workspace_root()
            .join("tests/fixtures/reference")
            .join(fixture);
        let model: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (config, weights) = kiln_tests::models::tiny_model(fixture);
        let dir = tempfile::tempdir().unwrap();
        kiln_tests::models::write_model_dir(&config, &weights, dir.path(), false);
        let prompt: Vec<i64> = serde_json::from_value(model["prompts"][2].clone()).unwrap();
        let expected: Vec<i64> = serde_json::from_value(model["greedy"].clone()).unwrap();

        let listing = list_json(&[&library]);
        assert_eq!(
            entry(&listing, architecture)["source"],
            library.display().to_string(),
            "{family}: the shared library replaces the built-in"
        );
        let from_library = generate_ids(
            dir.path(),
            &prompt,
            expected.len(),
            &["--custom-architectures", library.to_str().unwrap()],
        )
        .unwrap();
        assert_eq!(
            from_library,
            expected,
            "{family} from {}",
            library.display()
        );
        let linked = generate_ids(dir.path(), &prompt, expected.len(), &[]).unwrap();
        assert_eq!(linked, expected, "{family} built in");
    }
}

#[test]
fn an_architecture_with_its_own_pipeline_model_drives_each_step() {
    let plugin = fixture_plugin("pipeline-plugin");
    let vocab = 16usize;
    // Row i of the table peaks at i + 1 (mod vocab): greedy decoding counts.
    let table: Vec<f64> = (0..vocab * vocab)
        .map(|k| {
            if k % vocab == (k / vocab + 1) % vocab {
                4.0
            } else {
                0.0
            }
        })
        .collect();
    let weights = [(
        "table".to_owned(),
        kiln_tests::reference::FixtureTensor::f32(vec![vocab, vocab], &table),
    )]
    .into_iter()
    .collect();
    let config = json!({
        "architectures": ["NextTokenLM"],
        "vocab_size": vocab,
        "max_position_embeddings": 64,
    });
    let dir = tempfile::tempdir().unwrap();
    kiln_tests::models::write_model_dir(&config, &weights, dir.path(), false);
    let with_plugin = ["--custom-architectures", plugin.to_str().unwrap()];

    let ids = generate_ids(dir.path(), &[3, 9], 4, &with_plugin).unwrap();
    assert_eq!(ids, [10, 11, 12, 13], "the plugin's pipeline fed the graph");

    // The pipeline refuses token 0 (generated at the second step, fed at the
    // third): the error names the plugin's entry point and ends the run cleanly.
    let error = generate_ids(dir.path(), &[14], 4, &with_plugin).unwrap_err();
    assert!(
        error.contains("NextTokenLM (next-token): pipeline: token 0 is reserved"),
        "{error}"
    );
    assert!(!error.contains("panicked"), "{error}");
}
