//! The error type of plugin code.

use crate::abi;

/// A failure inside a plugin, reported to the host with its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input (a config, a checkpoint, a request) is malformed or unsupported.
    Invalid,
    /// The plugin does not implement the requested entry point.
    Unsupported,
    /// Anything else that went wrong inside the plugin.
    Internal,
}

/// `Result` with the plugin [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with the given kind and message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The input is malformed or unsupported.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// The entry point is not implemented.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// Any other failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Prefixes the message with context, keeping the kind.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        Self {
            kind: self.kind,
            message: format!("{context}: {}", self.message),
        }
    }
}

impl From<Error> for abi::PluginError {
    fn from(error: Error) -> Self {
        let kind = match error.kind {
            ErrorKind::Invalid => abi::PluginErrorKind::Invalid,
            ErrorKind::Unsupported => abi::PluginErrorKind::Unsupported,
            ErrorKind::Internal => abi::PluginErrorKind::Internal,
        };
        abi::PluginError {
            kind,
            message: error.message.into(),
        }
    }
}
