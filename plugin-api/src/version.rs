//! The interface version and the policy of which versions load together
//! (described in [`crate::abi`]).

/// The `kiln-plugin-api` version this crate was built as: the interface version.
pub const INTERFACE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A parsed `major.minor.patch` interface version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterfaceVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl InterfaceVersion {
    /// The version of the interface this crate implements.
    pub fn current() -> Self {
        Self::parse(INTERFACE_VERSION).expect("the crate version is valid semver")
    }

    /// Parses `major.minor.patch` (a pre-release or build suffix is ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let version = Self {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }

    /// The versioning policy: a host built against `self` loads a plugin built
    /// against `plugin` when both have the same major version and, for 0.x, the
    /// same minor version (1.x and later: the same major).
    pub fn loads(&self, plugin: &Self) -> bool {
        if self.major == 0 {
            plugin.major == 0 && plugin.minor == self.minor
        } else {
            plugin.major == self.major
        }
    }

    /// The range of plugin interface versions this host loads, for messages.
    pub fn compatible_range(&self) -> String {
        if self.major == 0 {
            format!("0.{}.x", self.minor)
        } else {
            format!("{}.x.y", self.major)
        }
    }
}

impl std::fmt::Display for InterfaceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> InterfaceVersion {
        InterfaceVersion::parse(text).unwrap()
    }

    #[test]
    fn parses_versions() {
        assert_eq!(
            v("0.1.2"),
            InterfaceVersion {
                major: 0,
                minor: 1,
                patch: 2
            }
        );
        assert_eq!(
            v("1.4.0-rc.1"),
            InterfaceVersion {
                major: 1,
                minor: 4,
                patch: 0
            }
        );
        assert!(InterfaceVersion::parse("1.2").is_none());
        assert!(InterfaceVersion::parse("1.2.3.4").is_none());
        assert!(InterfaceVersion::parse("a.b.c").is_none());
    }

    #[test]
    fn zero_x_needs_the_same_minor_any_patch() {
        let host = v("0.1.3");
        assert!(host.loads(&v("0.1.0")));
        assert!(host.loads(&v("0.1.9")));
        assert!(!host.loads(&v("0.2.0")));
        assert!(!host.loads(&v("0.0.9")));
        assert!(!host.loads(&v("1.1.3")));
        assert_eq!(host.compatible_range(), "0.1.x");
    }

    #[test]
    fn one_x_needs_the_same_major() {
        let host = v("1.2.0");
        assert!(host.loads(&v("1.0.0")));
        assert!(host.loads(&v("1.7.1")));
        assert!(!host.loads(&v("2.0.0")));
        assert!(!host.loads(&v("0.2.0")));
    }
}
