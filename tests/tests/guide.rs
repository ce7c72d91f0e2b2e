//! `docs/writing-a-plugin.md` runs end to end: every ```` ```sh guide ````
//! block, extracted from the document in order (not copied here), runs in
//! one bash script in an empty directory with `host` on the `PATH`, `$KILN`
//! set to this checkout and cargo offline. Step 3 needs torch and
//! transformers; where `python3` lacks them, its committed outputs
//! (`tests/fixtures/guide/`) are copied in its place, and the test says so.

use std::process::Command;

use kiln_tests::{host_binary, text, workspace_root};

/// The guide's runnable blocks, in order.
fn guide_blocks() -> Vec<String> {
    let guide = std::fs::read_to_string(workspace_root().join("docs/writing-a-plugin.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in guide.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh guide") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), line) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```sh guide block");
    blocks
}

fn python_has_torch() -> bool {
    Command::new("python3")
        .args(["-c", "import torch, transformers, tokenizers"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_plugin_guide_runs_end_to_end() {
    let blocks = guide_blocks();
    assert!(blocks.len() >= 6, "the guide lost its steps: {blocks:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let torch = python_has_torch();
    let mut script = String::from("set -euo pipefail\n");
    for block in &blocks {
        if block.contains("make_tiny_model.py") && !torch {
            println!(
                "python3 has no torch/transformers: step 3's committed outputs stand in for it"
            );
            script.push_str(
                "mkdir -p fixtures && cp -r \"$KILN/tests/fixtures/guide/tiny\" fixtures/\n",
            );
        } else {
            script.push_str(&block.replace("8000", &port));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let host_dir = host_binary().parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        host_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("KILN", workspace_root())
        .env("CARGO_NET_OFFLINE", "true")
        .env("KILN_LOG", "warn")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "the guide failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // What each step shows the reader.
    assert!(
        stdout.contains("MyArchForCausalLM") && stdout.contains("libmy_arch.so"),
        "{stdout}"
    );
    assert!(stdout.contains("identical (16 tokens)"), "verify: {stdout}");
    assert!(
        stdout.contains("\"object\":\"text_completion\""),
        "{stdout}"
    );
}
