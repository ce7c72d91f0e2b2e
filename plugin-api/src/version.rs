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

    /// How a plugin's interface version relates to this host's: the versioning
    /// policy. A plugin loads when both have the same major version and the
    /// plugin's minor is the host's or older; patch levels never matter.
    /// (Before 1.0, every minor was a major: the same minor was required.)
    pub fn compare(&self, plugin: &Self) -> Compatibility {
        if self.major == 0 || plugin.major == 0 {
            return match (plugin.major, plugin.minor) {
                (0, minor) if self.major == 0 && minor == self.minor => Compatibility::Loads,
                (0, minor) if self.major == 0 && minor > self.minor => Compatibility::PluginNewer,
                _ => Compatibility::OtherMajor,
            };
        }
        if plugin.major != self.major {
            Compatibility::OtherMajor
        } else if plugin.minor > self.minor {
            Compatibility::PluginNewer
        } else {
            Compatibility::Loads
        }
    }

    /// The range of plugin interface versions this host loads, for messages.
    pub fn compatible_range(&self) -> String {
        match (self.major, self.minor) {
            (0, minor) => format!("0.{minor}.x"),
            (major, 0) => format!("{major}.0.x"),
            (major, minor) => format!("{major}.0 to {major}.{minor}"),
        }
    }
}

/// How a plugin's interface version relates to the host's ([`InterfaceVersion::compare`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compatibility {
    /// The host loads it: same major, the plugin's minor is the host's or older.
    Loads,
    /// Same major, but the plugin was built against a newer minor.
    PluginNewer,
    /// Another major version: a deliberate break on one side.
    OtherMajor,
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
        assert_eq!(host.compare(&v("0.1.0")), Compatibility::Loads);
        assert_eq!(host.compare(&v("0.1.9")), Compatibility::Loads);
        assert_eq!(host.compare(&v("0.2.0")), Compatibility::PluginNewer);
        assert_eq!(host.compare(&v("0.0.9")), Compatibility::OtherMajor);
        assert_eq!(host.compare(&v("1.1.3")), Compatibility::OtherMajor);
        assert_eq!(host.compatible_range(), "0.1.x");
    }

    #[test]
    fn one_x_loads_older_minors_and_refuses_newer_ones() {
        let host = v("1.2.0");
        assert_eq!(host.compare(&v("1.0.0")), Compatibility::Loads);
        assert_eq!(host.compare(&v("1.2.7")), Compatibility::Loads);
        assert_eq!(host.compare(&v("1.3.0")), Compatibility::PluginNewer);
        assert_eq!(host.compare(&v("2.0.0")), Compatibility::OtherMajor);
        assert_eq!(host.compare(&v("0.2.0")), Compatibility::OtherMajor);
        assert_eq!(host.compatible_range(), "1.0 to 1.2");
        assert_eq!(v("1.0.4").compatible_range(), "1.0.x");
    }
}
