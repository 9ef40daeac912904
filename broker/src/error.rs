//! Typed errors of the broker, each classified so callers know whether to
//! retry, and each mapped to one exit code ([`Error::exit_code`]) that every
//! binary uses: the services, `cowboy` and `cowboy web`.
//!
//! | class | exit | restart helps |
//! | --- | --- | --- |
//! | [`Error::Config`], [`Error::Permission`] | 78 ([`EXIT_CONFIG`]) | no: the units do not restart it |
//! | retriable: [`Error::Redis`] (connection), [`Error::Io`], [`Error::Platform`] | 69 ([`EXIT_UNAVAILABLE`]) | yes |
//! | [`Error::Internal`], any other Redis error | 70 ([`EXIT_SOFTWARE`]) | perhaps |
//! | [`Operator::Usage`] | 2 (as clap's own usage errors) | (the CLI) |
//! | [`Operator::Refused`] | 1 | (the CLI) |
//! | [`Operator::Busy`] | 75 ([`EXIT_TEMPFAIL`]) | (the CLI: try again) |

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

/// Bad configuration or permissions: restarting will not help.
pub const EXIT_CONFIG: u8 = 78;
/// Redis or the platform stayed unreachable.
pub const EXIT_UNAVAILABLE: u8 = 69;
/// An invariant broke.
pub const EXIT_SOFTWARE: u8 = 70;
/// Too many answers at once on one approval: try again.
pub const EXIT_TEMPFAIL: u8 = 75;
/// A bad argument (clap's own code for usage errors).
pub const EXIT_USAGE: u8 = 2;
/// What an operator asked cannot be done in this state.
pub const EXIT_REFUSED: u8 = 1;

/// Why an operator's request was not met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// The request itself is malformed (an unparsable `--since`, a missing flag).
    Usage,
    /// Well formed, but not possible in this state (no such approval, not an
    /// approver, too late).
    Refused,
    /// Others are answering the same approval right now: try again.
    Busy,
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
    /// An operator's request that cannot be met as asked or in this state.
    #[error("{message}")]
    Operator { kind: Operator, message: String },
    /// A platform (Discord, a mail server, a helper program) failed;
    /// `retriable` when waiting and trying again may help.
    #[error("{message}")]
    Platform { retriable: bool, message: String },
    /// An invariant of this program broke: a bug, or data no broker writes.
    #[error("internal error: {0}")]
    Internal(String),
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
                        Some(
                            "LOADING"
                                | "TRYAGAIN"
                                | "BUSY"
                                | "MASTERDOWN"
                                | "READONLY"
                                | "NOREPLICAS"
                                // A cluster moving a slot, or failing over:
                                // the client learns the new map on the error
                                // and the caller's retry goes there.
                                | "MOVED"
                                | "ASK"
                                | "CLUSTERDOWN"
                                // A node whose script cache is empty (a
                                // promoted replica): the cluster connection
                                // loads the scripts again before the retry.
                                | "NOSCRIPT"
                        )
                    )
            }
            Error::Io(_) => true,
            Error::Platform { retriable, .. } => *retriable,
            _ => false,
        }
    }

    /// The exit code of a process that stops with this error (see the module doc).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Permission { .. } => EXIT_CONFIG,
            Error::Operator { kind, .. } => match kind {
                Operator::Usage => EXIT_USAGE,
                Operator::Refused => EXIT_REFUSED,
                Operator::Busy => EXIT_TEMPFAIL,
            },
            Error::Platform { .. } => EXIT_UNAVAILABLE,
            e if e.is_retriable() => EXIT_UNAVAILABLE,
            _ => EXIT_SOFTWARE,
        }
    }

    /// A malformed operator request.
    pub fn usage(message: impl Into<String>) -> Self {
        Error::Operator {
            kind: Operator::Usage,
            message: message.into(),
        }
    }

    /// An operator request this state refuses.
    pub fn refused(message: impl Into<String>) -> Self {
        Error::Operator {
            kind: Operator::Refused,
            message: message.into(),
        }
    }

    /// A platform failure; `retriable` when waiting may help.
    pub fn platform(retriable: bool, message: impl Into<String>) -> Self {
        Error::Platform {
            retriable,
            message: message.into(),
        }
    }

    /// A broken invariant.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
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
