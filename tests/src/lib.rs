//! Helpers for Kiln's end-to-end tests: building fixture plugins the way a
//! third party would (separate crates, `cargo build`), and running the `host`
//! binary.

pub mod engine;
pub mod models;
pub mod reference;
pub mod serve;
pub mod tiny;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The workspace root: where these tests were built, or `KILN_WORKSPACE`
/// (the GPU suite runs prebuilt test binaries in a copy of the repository).
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("KILN_WORKSPACE").filter(|p| !p.is_empty()) {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

/// Where fixture plugins are built (separate from the workspace's own target
/// directory, which the running `cargo test` holds).
pub fn fixture_target_dir() -> PathBuf {
    workspace_root().join("target").join("fixtures")
}

/// The `host` binary of the build these tests belong to, or the one that
/// `KILN_HOST_BIN` names (e.g. a release build, for the real-model suite).
pub fn host_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("KILN_HOST_BIN").filter(|p| !p.is_empty()) {
        let host = PathBuf::from(path);
        assert!(
            host.exists(),
            "KILN_HOST_BIN names {}, which does not exist",
            host.display()
        );
        return host;
    }
    let exe = std::env::current_exe().expect("the test binary has a path");
    // target/<profile>/deps/<test binary> → target/<profile>/host
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps");
    let host = profile_dir.join(format!("host{}", std::env::consts::EXE_SUFFIX));
    assert!(
        host.exists(),
        "{} is missing: run the tests with `cargo test --workspace`, which builds it",
        host.display()
    );
    host
}

/// Runs `host` with the given arguments and environment additions.
pub fn run_host<I, S>(args: I, env: &[(&str, &str)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut command = Command::new(host_binary());
    command
        .args(args)
        .env_remove("KILN_LOG")
        .env_remove("RUST_BACKTRACE");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("host runs")
}

/// Runs `host verify --model MODEL --reference REFERENCE` plus `extra`
/// arguments; returns whether it succeeded, its stdout and its stderr.
pub fn run_verify(model: &Path, reference: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "verify".to_owned(),
        "--model".to_owned(),
        model.display().to_string(),
        "--reference".to_owned(),
        reference.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let output = run_host(&args, &[]);
    let (stdout, stderr) = text(&output);
    (output.status.success(), stdout, stderr)
}

/// `host generate <args> --output json`: its JSON report, or its standard
/// error when it failed.
pub fn generate_json(args: &[&str]) -> Result<serde_json::Value, String> {
    let output = run_host(
        ["generate"].iter().chain(args).chain(&["--output", "json"]),
        &[],
    );
    let (stdout, stderr) = text(&output);
    if !output.status.success() {
        return Err(stderr);
    }
    Ok(serde_json::from_str(stdout.trim()).expect("generate --output json prints JSON"))
}

/// The file name of a `cdylib` crate's library on this platform.
fn library_file_name(crate_name: &str) -> String {
    format!(
        "{}{}.{}",
        std::env::consts::DLL_PREFIX,
        crate_name.replace('-', "_"),
        std::env::consts::DLL_EXTENSION
    )
}

/// The library of `cdylib` crate `crate_name` in the fixtures' debug build,
/// which must exist.
pub fn built_library(crate_name: &str) -> PathBuf {
    let path = fixture_target_dir()
        .join("debug")
        .join(library_file_name(crate_name));
    assert!(path.exists(), "the build produced no {}", path.display());
    path
}

/// Builds the fixture plugin workspace (`tests/fixtures`) once per test
/// process and returns the path of the named fixture's library.
pub fn fixture_plugin(crate_name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(&workspace_root().join("tests/fixtures/Cargo.toml"), &[]);
    });
    built_library(crate_name)
}

/// Builds the plugin of `tests/fixtures/compat` (built against a frozen copy
/// of the previous kiln-plugin-api release) once per test process and returns
/// its library.
pub fn compat_plugin() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        cargo_build(
            &workspace_root().join("tests/fixtures/compat/Cargo.toml"),
            &[],
        );
    });
    built_library("compat-llama-plugin")
}

/// The built-in families that are also shared libraries (`plugins/<family>/cdylib`).
pub const BUILTIN_FAMILIES: [&str; 5] = ["llama", "qwen", "gemma", "phi3", "gpt2"];

/// Builds the built-in plugins' shared libraries once per test process and
/// returns `family`'s. They are built into the fixture target directory with
/// the fixtures' unoptimized profile, so they reuse its compiled dependencies.
pub fn builtin_plugin_library(family: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut args = vec![
            "--config",
            "profile.dev.opt-level=0",
            "--config",
            "profile.dev.package.\"*\".opt-level=0",
            "--config",
            "profile.dev.package.kiln-kernels.opt-level=0",
        ];
        let packages: Vec<String> = BUILTIN_FAMILIES
            .iter()
            .map(|family| format!("kiln-plugin-{family}"))
            .collect();
        for package in &packages {
            args.extend(["-p", package]);
        }
        cargo_build(&workspace_root().join("Cargo.toml"), &args);
    });
    built_library(&format!("kiln_{family}"))
}

/// Builds the example plugin against a copy of `kiln-plugin-api` whose version
/// is `version` and whose `abi.rs` has each `(from, to)` replacement applied,
/// as if it were built against another release of the interface. Returns the
/// plugin library; `label` keeps copies apart.
pub fn example_plugin_against_interface(
    label: &str,
    version: &str,
    abi_edits: &[(&str, &str)],
) -> PathBuf {
    // Builds share one target directory; serialize them.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());

    let root = workspace_root();
    let dir = fixture_target_dir().join("interfaces").join(label);
    let api = dir.join("kiln-plugin-api");
    let plugin = dir.join("plugin");
    copy_tree(&root.join("plugin-api"), &api, &|relative, contents| {
        let text = || String::from_utf8(contents.clone()).expect("UTF-8 source");
        if relative == Path::new("Cargo.toml") {
            let current = format!("version = \"{}\"", kiln_plugin_api::abi::INTERFACE_VERSION);
            assert!(
                text().contains(&current),
                "plugin-api/Cargo.toml has no {current}"
            );
            text()
                .replacen(&current, &format!("version = \"{version}\""), 1)
                .into_bytes()
        } else if relative == Path::new("src/abi.rs") {
            let mut abi = text();
            for (from, to) in abi_edits {
                assert!(abi.contains(from), "abi.rs no longer contains {from:?}");
                abi = abi.replacen(from, to, 1);
            }
            abi.into_bytes()
        } else {
            contents
        }
    });
    copy_tree(
        &root.join("tests/fixtures/example-plugin/src"),
        &plugin.join("src"),
        &|_, contents| contents,
    );

    let crate_name = format!("example-plugin-{label}");
    std::fs::write(
        plugin.join("Cargo.toml"),
        format!(
            "[package]\nname = \"{crate_name}\"\nversion = \"0.3.0\"\nedition = \"2021\"\n\n\
             [lib]\ncrate-type = [\"cdylib\"]\n\n\
             [dependencies]\nkiln-plugin-api = {{ path = \"../kiln-plugin-api\" }}\n\n[workspace]\n"
        ),
    )
    .unwrap();
    // Reuse the fixtures' lock file so that the dependencies resolve (and
    // compile) exactly as for the other fixtures.
    std::fs::copy(
        root.join("tests/fixtures/Cargo.lock"),
        plugin.join("Cargo.lock"),
    )
    .unwrap();
    cargo_build(&plugin.join("Cargo.toml"), &[]);
    built_library(&crate_name)
}

fn cargo_build(manifest: &Path, extra_args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(fixture_target_dir())
        .args(extra_args)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building {} failed:\n{}",
        manifest.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Copies a directory tree, passing each file (by its path relative to
/// `from`) through `transform`. Files whose contents would not change are not
/// rewritten, so cargo does not rebuild them.
fn copy_tree(from: &Path, to: &Path, transform: &dyn Fn(&Path, Vec<u8>) -> Vec<u8>) {
    fn walk(root: &Path, dir: &Path, to: &Path, transform: &dyn Fn(&Path, Vec<u8>) -> Vec<u8>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(root).unwrap();
            let target = to.join(relative);
            if path.is_dir() {
                std::fs::create_dir_all(&target).unwrap();
                walk(root, &path, to, transform);
            } else {
                let contents = transform(relative, std::fs::read(&path).unwrap());
                if std::fs::read(&target).ok().as_deref() != Some(contents.as_slice()) {
                    std::fs::write(&target, contents).unwrap();
                }
            }
        }
    }
    std::fs::create_dir_all(to).unwrap();
    walk(from, from, to, transform);
}

/// stdout and stderr of a finished command, as text.
pub fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
