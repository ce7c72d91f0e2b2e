//! The `host` binary: see `kiln_host::cli`.

fn main() -> std::process::ExitCode {
    kiln_host::cli::run()
}
