//! `host inspect` on safetensors checkpoints: local directories and the
//! offline Hugging Face cache, the adapter's mapping, and resolution errors.

use kiln_tests::models::{tiny_model, write_model_dir};
use kiln_tests::{run_host, text};
use serde_json::Value;

fn inspect_json(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut all = vec!["inspect", "--json"];
    all.extend_from_slice(args);
    let output = run_host(&all, env);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn inspect_maps_a_hugging_face_checkpoint_onto_the_module() {
    let (config, weights) = tiny_model("tiny_llama.json");
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, dir.path(), false);
    let report = inspect_json(&[dir.path().to_str().unwrap()], &[]);
    assert_eq!(report["format"], "safetensors");
    assert!(report["architecture"]
        .as_str()
        .unwrap()
        .starts_with("LlamaForCausalLM (plugin `llama`, built-in)"));
    assert_eq!(report["tensors"].as_array().unwrap().len(), weights.len());
    let adaptation = &report["adaptation"];
    assert_eq!(
        adaptation["mapped"].as_array().unwrap().len(),
        weights.len()
    );
    for list in ["missing", "unexpected", "mismatched", "unused"] {
        assert_eq!(adaptation[list], serde_json::json!([]), "{list}");
    }
    let q = adaptation["mapped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q["source"], "model.layers.0.self_attn.q_proj.weight");
    let expected = report["expected"].as_array().unwrap();
    assert_eq!(expected.len(), weights.len());

    // The text form has both lists and the summary line.
    let output = run_host(["inspect", dir.path().to_str().unwrap()], &[]);
    let (stdout, _) = text(&output);
    assert!(
        stdout.contains("module state dict (") && stdout.contains("adaptation: "),
        "{stdout}"
    );
}

#[test]
fn inspect_reports_missing_unexpected_and_mismatched_weights() {
    let (config, mut weights) = tiny_model("tiny_llama.json");
    weights.remove("model.layers.1.mlp.up_proj.weight");
    let mut extra = weights["model.norm.weight"].clone();
    extra.shape = vec![extra.data.len()];
    weights.insert("model.layers.0.extra.weight".into(), extra);
    let mut wrong = weights["model.layers.0.mlp.gate_proj.weight"].clone();
    wrong.shape = vec![wrong.shape[1], wrong.shape[0]];
    weights.insert("model.layers.0.mlp.gate_proj.weight".into(), wrong);
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, dir.path(), false);
    let adaptation = inspect_json(&[dir.path().to_str().unwrap()], &[])["adaptation"].clone();
    assert_eq!(
        adaptation["missing"],
        serde_json::json!(["layers.1.mlp.up_proj.weight"])
    );
    assert_eq!(
        adaptation["unexpected"],
        serde_json::json!(["layers.0.extra.weight"])
    );
    assert_eq!(
        adaptation["mismatched"],
        serde_json::json!(["layers.0.mlp.gate_proj.weight: expected [64, 32], found [32, 64]"])
    );
}

#[test]
fn hugging_face_ids_resolve_offline_from_the_cache() {
    let (config, weights) = tiny_model("tiny_llama.json");
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--test-org--tiny-llama");
    let snapshot = repo.join("snapshots").join("0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123abcd\n").unwrap();
    write_model_dir(&config, &weights, &snapshot, true);
    let env = [("HF_HUB_CACHE", cache.path().to_str().unwrap())];

    let report = inspect_json(&["test-org/tiny-llama"], &env);
    assert_eq!(report["model"], "test-org/tiny-llama");
    assert_eq!(report["files"].as_array().unwrap().len(), 2, "two shards");
    // A commit hash works as a revision too.
    inspect_json(&["test-org/tiny-llama", "--revision", "0123abcd"], &env);

    let output = run_host(["inspect", "test-org/tiny-llama", "--revision", "v2"], &env);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("revision `v2` is not in the cache"),
        "{stderr}"
    );
    let output = run_host(["inspect", "test-org/other-model"], &env);
    let (_, stderr) = text(&output);
    assert!(
        stderr.contains("test-org/other-model is not in the Hugging Face cache")
            && stderr.contains("works offline"),
        "{stderr}"
    );
}

#[test]
fn unknown_architectures_and_broken_checkpoints_are_clear_errors() {
    let (mut config, weights) = tiny_model("tiny_llama.json");
    config["architectures"] = serde_json::json!(["MysteryForCausalLM"]);
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, dir.path(), false);
    let report = inspect_json(&[dir.path().to_str().unwrap()], &[]);
    let error = report["architecture_error"].as_str().unwrap();
    assert!(
        error.contains(
            "architecture `MysteryForCausalLM` is not registered (registered: LlamaForCausalLM"
        ),
        "{error}"
    );
    assert!(error.contains("docs/writing-a-plugin.md"), "{error}");

    // A truncated safetensors file.
    let file = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let output = run_host(["inspect", dir.path().to_str().unwrap()], &[]);
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("model.safetensors: not a safetensors file"),
        "{stderr}"
    );
    // A config that is not JSON.
    std::fs::write(&file, &bytes).unwrap();
    std::fs::write(dir.path().join("config.json"), "{ nope").unwrap();
    let (_, stderr) = text(&run_host(["inspect", dir.path().to_str().unwrap()], &[]));
    assert!(stderr.contains("config.json is not valid JSON"), "{stderr}");
}
