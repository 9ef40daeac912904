//! The operator commands behind the `cowboy` binary. Each returns the text to
//! print, so the binary stays a thin argument parser.
//!
//! The CLI is an approval surface like any other: its decisions go through
//! [`approval::decide`] with the approver `cli:{operator}`, which must be on the
//! requesting bridge's `approval.approvers`. With `[operators]` declared, the
//! operator's Redis user can write no record: its decisions and edits are
//! requests the requesting bridge's outbox applies ([`crate::request`]).

//!
//! # Layout (one command per file)
//!
//! - [`approvals`]: list, show, approve, reject, edit.
//! - [`delegate`]: delegations while an approver is away.
//! - [`review`]: answering approvals one at a time at the terminal.
//! - [`trail`]: the audit trail, filtered.
//! - [`uncertain`]: uncertain deliveries and their reconciliation.
//! - [`send`]: writing an entry as an agent would.
//! - [`status`]: the deployment at a glance.
//! - [`args`]: the command line, typed; [`run`]: carrying it out; [`editor`]: `$EDITOR`.
//! - here: the connections the commands decide and read over.

mod approvals;
mod args;
mod delegate;
mod editor;
mod review;
mod run;
mod send;
mod status;
mod trail;
mod uncertain;

pub use approvals::*;
pub use args::*;
pub use delegate::{delegate, delegations, DelegateArgs};
pub use editor::in_editor;
pub use review::*;
pub use run::{exec_web, run};
pub use send::*;
pub use status::*;
pub use trail::*;
pub use uncertain::*;

use crate::config::Config;
use crate::error::{ConfigError, Error, Result};
use crate::store::Store;

/// The connection a CLI decision is made on. Without `[operators]`, `cli:NAME`
/// is a label and the CLI connects as `[redis]`. With operators declared, NAME
/// must be one of them, and everything is done over a connection as Redis user
/// NAME with its password (confirmed with `ACL WHOAMI`); the administrator's
/// password is never read.
pub async fn decision_store(config: &Config, operator: &str) -> Result<Store> {
    if config.operators.is_empty() {
        return Store::connect(&config.redis).await;
    }
    let op = config.operators.get(operator).ok_or_else(|| {
        Error::usage(format!(
            "`{operator}` is not declared in [operators]; pass --as NAME (COWBOY_OPERATOR) with your operator name"
        ))
    })?;
    let redis = crate::config::RedisConfig {
        username: Some(operator.to_string()),
        password_file: Some(op.password_file.clone()),
        ..config.redis.clone()
    };
    let mut store = Store::connect(&redis).await?;
    let whoami: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis("ACL WHOAMI", e))?;
    if whoami != operator {
        return Err(Error::Config(ConfigError::invalid(
            "operators",
            format!(
                "connected as Redis user `{whoami}`, not `{operator}`: is the Redis ACL loaded?"
            ),
        )));
    }
    Ok(store)
}

/// The connection `approvals list` and `show` read over: as the operator when
/// NAME is a declared one, else as `[redis]`.
pub async fn reading_store(config: &Config, operator: &str) -> Result<Store> {
    if config.operators.contains_key(operator) {
        decision_store(config, operator).await
    } else {
        Store::connect(&config.redis).await
    }
}
