//! Typed errors of the broker, each classified so callers know whether to retry.

use std::path::PathBuf;

/// A configuration that cannot run. Always names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema.
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value is present but not acceptable; `key` is its dotted path.
    #[error("invalid config: `{key}`: {message}")]
    Invalid { key: String, message: String },
}

impl ConfigError {
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Errors of the broker's services and operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Redis refused a command for lack of permission: a deployment error, never retried.
    #[error("redis refused `{command}`: {message}")]
    Permission { command: String, message: String },
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An operator request that cannot be met (unknown id, ambiguous prefix, ...).
    #[error("{0}")]
    Request(String),
}

impl Error {
    /// Whether waiting and trying again may help (lost connection, busy server).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()
                    || matches!(
                        e.code(),
                        Some("LOADING" | "TRYAGAIN" | "BUSY" | "MASTERDOWN")
                    )
            }
            Error::Io(_) => true,
            _ => false,
        }
    }

    /// Turns a NOPERM reply into [`Error::Permission`] naming the command.
    pub fn from_redis(command: &str, e: redis::RedisError) -> Self {
        if e.code() == Some("NOPERM") {
            Error::Permission {
                command: command.to_string(),
                message: e.to_string(),
            }
        } else {
            Error::Redis(e)
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
