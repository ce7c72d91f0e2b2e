//! Enforces the versioning policy: the boundary types (everything in
//! `src/abi.rs`) are frozen for a major version. What a minor release adds
//! goes through `EntryPoints::named` and `HostServices::service`.
//!
//! `abi-fingerprint.txt` records, for every version, a hash of `src/abi.rs`
//! with comments and whitespace removed; all versions of one major must have
//! the same. Whether a plugin of the previous release really loads is tested
//! end to end (`tests/fixtures/compat`).

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
fn the_abi_is_frozen_within_a_major_version() {
    let version = env!("CARGO_PKG_VERSION");
    let major = version.split('.').next().unwrap();
    let fingerprint = format!("{:016x}", fnv1a(&normalized_abi_source()));
    let recorded: Vec<(&str, &str)> = FINGERPRINTS
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(' '))
        .map(|(v, hash)| (v, hash.trim()))
        .collect();
    for (other, hash) in &recorded {
        if other.split('.').next() == Some(major) && *hash != fingerprint {
            panic!(
                "src/abi.rs changed (fingerprint {fingerprint}; {other} recorded {hash}).\n\
                 The boundary types are frozen for major version {major}: reach new entry \
                 points through EntryPoints::named and new host services through \
                 HostServices::service, or make a deliberate major release."
            );
        }
    }
    assert!(
        recorded.contains(&(version, fingerprint.as_str())),
        "no ABI fingerprint recorded for version {version}: add the line \
         `{version} {fingerprint}` to plugin-api/abi-fingerprint.txt"
    );
}
