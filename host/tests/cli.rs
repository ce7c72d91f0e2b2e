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
