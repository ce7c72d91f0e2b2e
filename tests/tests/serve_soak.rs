//! A short soak of `host serve` (`tests/serve/soak.py`): rounds of streaming
//! clients through the official `openai` package, a quarter hanging up
//! mid-stream. Every request finishes without error, the KV cache drains
//! after each round and the server's RSS stays flat from round to round.

use std::process::Command;

use kiln_tests::serve::requirements;
use kiln_tests::{host_binary, text, workspace_root};

#[test]
fn a_short_soak_has_no_errors_drains_the_cache_and_keeps_rss_flat() {
    let (model, python) = requirements();
    let output = Command::new(python)
        .arg(workspace_root().join("tests/serve/soak.py"))
        .args(["--host", host_binary().to_str().unwrap()])
        .args(["--model", model.to_str().unwrap()])
        .args(["--rounds", "3", "--clients", "12", "--seconds", "6"])
        .args(["--kv-cache-memory", "64MiB"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}
