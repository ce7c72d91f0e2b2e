//! Enforces the versioning policy: the boundary types (everything in
//! `src/abi.rs`) may only change together with a version bump (a minor one
//! for a field appended to a growable table, a major one for anything else;
//! the compatibility itself is tested end to end with a plugin built against
//! the previous release, `tests/fixtures/compat`).
//!
//! `abi-fingerprint.txt` records, for the current version, a hash of
//! `src/abi.rs` with comments and whitespace removed. Change the ABI and this
//! test fails until the version in `Cargo.toml` is bumped and the new line is
//! recorded; the message says what to write.

const FINGERPRINTS: &str = include_str!("../abi-fingerprint.txt");

/// `src/abi.rs` without comments and whitespace, so that documentation edits
/// do not count as ABI changes.
fn normalized_abi_source() -> String {
    include_str!("../src/abi.rs")
        .lines()
        .map(|line| match line.find("//") {
            Some(comment) => &line[..comment],
            None => line,
        })
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

/// 64-bit FNV-1a: small, stable across platforms and toolchains.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn abi_changes_come_with_a_version_bump() {
    let version = env!("CARGO_PKG_VERSION");
    let fingerprint = format!("{:016x}", fnv1a(&normalized_abi_source()));
    let recorded = FINGERPRINTS
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(v, _)| *v == version)
        .map(|(_, hash)| hash.trim());
    match recorded {
        Some(hash) if hash == fingerprint => {}
        Some(hash) => panic!(
            "src/abi.rs changed (fingerprint {fingerprint}, recorded {hash} for {version}).\n\
             An ABI change needs a new version: the minor for a field appended at the end of \
             PluginRoot, HostServices or EntryPoints, the major for anything else. Bump it in \
             plugin-api/Cargo.toml, then add the line \
             `<new version> {fingerprint}` to plugin-api/abi-fingerprint.txt."
        ),
        None => panic!(
            "no ABI fingerprint recorded for version {version}: add the line \
             `{version} {fingerprint}` to plugin-api/abi-fingerprint.txt"
        ),
    }
}
