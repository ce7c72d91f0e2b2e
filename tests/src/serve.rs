//! `host serve` driven from tests: a server on a free port over SmolLM2
//! (GGUF), curl, and the `/metrics` reader.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{host_binary, workspace_root};

/// SmolLM2-135M's GGUF, if present.
pub fn smollm2() -> Option<PathBuf> {
    crate::models::smollm2_gguf()
}

/// The Python with `openai` installed, if present.
pub fn python() -> Option<PathBuf> {
    let path = std::env::var_os("KILN_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/ci-venv/bin/python"));
    path.is_file().then_some(path)
}

/// Requires what the test needs; CI always has it (`.ci/setup`).
pub fn requirements() -> (PathBuf, PathBuf) {
    let missing = |what: &str| {
        format!("{what} is missing: run .ci/setup (or set KILN_SMOLLM2_GGUF / KILN_TEST_PYTHON)")
    };
    (
        smollm2().unwrap_or_else(|| panic!("{}", missing("SmolLM2"))),
        python().unwrap_or_else(|| panic!("{}", missing("the Python venv with `openai`"))),
    )
}

/// The options tests serve with unless `extra` sets them (in any spelling).
fn defaults(extra: &[&str]) -> Vec<&'static str> {
    let defaults: [(&[&'static str], &'static str); 3] = [
        (&["--max-batch-size", "--max-num-seqs"], "16"),
        (&["--kv-cache-memory"], "256MiB"),
        (&["--served-model-name"], "smollm2"),
    ];
    defaults
        .into_iter()
        .filter(|(names, _)| !names.iter().any(|n| extra.contains(n)))
        .flat_map(|(names, value)| [names[0], value])
        .collect()
}

/// A `host serve` process, killed when dropped.
pub struct Server {
    /// The server process.
    pub child: Child,
    /// Its port.
    pub port: u16,
    /// The model's name in requests (`--served-model-name`, else `smollm2`).
    pub model_name: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts serving `model` (as `smollm2` unless `extra` names it) with `extra` options (and
    /// [`defaults`] for what they leave out) and waits until `/health`
    /// answers.
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let mut command = Command::new(host_binary());
        command
            .args([
                "serve",
                "--model",
                model.to_str().unwrap(),
                "--port",
                &port.to_string(),
            ])
            .args(extra)
            .args(defaults(extra))
            .env("KILN_CACHE_DIR", dir.path().join("cache"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let model_name = extra
            .iter()
            .position(|&a| a == "--served-model-name")
            .and_then(|i| extra.get(i + 1))
            .unwrap_or(&"smollm2")
            .to_string();
        let mut server = Self {
            child: command.spawn().unwrap(),
            port,
            model_name,
            log,
            _dir: dir,
        };
        // Starting on the kernel emulator compiles its kernels first: on a
        // 2-core CI machine running the other servers' tests beside it, that
        // has taken more than two minutes.
        let start_limit = Duration::from_secs(if extra.contains(&"cuda-emulated") {
            360
        } else {
            120
        });
        let started = Instant::now();
        while curl(
            &server,
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &server.url("/health"),
            ],
        ) != "200"
        {
            let exited = server.child.try_wait().unwrap();
            assert!(
                exited.is_none() && started.elapsed() < start_limit,
                "the server did not start ({exited:?}):\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The checks `tests/serve/structured_output.py` reports.
pub const STRUCTURED_OUTPUT_CHECKS: [&str; 7] = [
    "parse",
    "parse_n",
    "stream",
    "json_object",
    "structured_outputs",
    "completions",
    "refusals",
];

impl Server {
    /// POSTs `body` as JSON to `path` with curl; the reply, parsed.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let out = curl(
            self,
            &[
                "-s",
                "-H",
                "content-type: application/json",
                "-d",
                &body.to_string(),
                &self.url(path),
            ],
        );
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
    }
}

/// curl's standard output.
pub fn curl(_server: &Server, args: &[&str]) -> String {
    let output = Command::new("curl").args(args).output().expect("curl runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A metric's value from `/metrics` (its first sample, whatever its labels).
pub fn metric(server: &Server, name: &str) -> f64 {
    let text = curl(server, &["-s", &server.url("/metrics")]);
    text.lines()
        .find(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{')))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// Runs `tests/serve/<script>` with `python` against `server`'s `/v1` and
/// the model name `smollm2` (then `extra` arguments); asserts it succeeded
/// and printed each of `checks` (`{"check": "<name>", ...}` lines).
/// Returns its standard output.
pub fn run_client_script(
    server: &Server,
    python: &Path,
    script: &str,
    extra: &[&str],
    checks: &[&str],
) -> String {
    let output = Command::new(python)
        .arg(crate::workspace_root().join("tests/serve").join(script))
        .args([server.url("/v1").as_str(), server.model_name.as_str()])
        .args(extra)
        .output()
        .unwrap();
    let (stdout, stderr) = crate::text(&output);
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log()
    );
    for check in checks {
        assert!(
            stdout.contains(&format!("\"check\": \"{check}\"")),
            "{check} did not run:\n{stdout}"
        );
    }
    stdout
}
