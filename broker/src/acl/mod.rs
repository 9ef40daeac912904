//! Redis ACL rules for a deployment, and the probes that prove them.
//!
//! Rendered from the config: `user default off`; the administrator (`[redis]
//! username`) with full access, which renders and loads these rules and is never
//! an approver; each `[operators.NAME]` user and the page (`cowboy-web`) reading
//! approvals and asking for decisions on request streams of their own, never
//! writing one; the exporter (`cowboy-exporter`) reading only; one user per
//! agent, allowed only `XADD` to its own outbox streams and reading/acking its
//! own inbox streams; one user per bridge service (`cowboy-{bridge}-{service}`)
//! with only the keys and commands its job uses.
//!
//! Invariants:
//! - Commands and keys are paired with selectors (`(...)`), never in one flat rule
//!   set: a flat set would let a user run any of its commands on any of its keys
//!   (e.g. an agent `XACK`ing the broker's group on its own outbox).
//! - Every key pattern starts with a name (`ann:`, `mail:`, `approval:`): a bare `*`
//!   pattern would match the literal key `STREAMS` that Redis before 7.2.16 checks
//!   for a consumer named `STREAMS`.
//! - Passwords never appear: rules carry `#<sha256>` of the password read from
//!   its file, so the users file can be world-readable. No `#` comment lines are
//!   written (Redis refuses to start with one in an aclfile).
//!
//! # Layout
//!
//! - [`rules`]: each user's rules, rendered from the config.
//! - [`probes`]: what each user must be able to do, and what it must never do.
//! - [`check`]: running the probes against a live Redis (`cowboy acl check`).

mod check;
mod probes;
mod rules;

pub use check::*;
pub use probes::*;
pub use rules::*;

use std::fmt::Write as _;

use crate::config::{Config, Service};
use crate::error::{ConfigError, Result};
use crate::keys;

/// One Redis user and its rules (without the `user NAME` head).
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub name: String,
    pub rules: String,
}

/// Output formats of `cowboy acl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An `aclfile` users file.
    Aclfile,
    /// `ACL SETUSER` commands for `redis-cli`.
    Commands,
}

/// Every user of the deployment. Fails naming the key of a missing password file.
pub fn users(config: &Config) -> Result<Vec<User>, ConfigError> {
    let mut users = vec![User {
        name: "default".into(),
        rules: "off resetkeys resetchannels -@all".into(),
    }];
    let operator = config.redis.username.as_ref().ok_or_else(|| {
        ConfigError::invalid(
            "redis.username",
            "the operator's user is needed: the rendered rules turn `default` off",
        )
    })?;
    let file = config.redis.password_file.as_ref().ok_or_else(|| {
        ConfigError::invalid(
            "redis.password_file",
            "the operator's password file is needed",
        )
    })?;
    let hash = password_hash("redis.password_file", file)?;
    users.push(User {
        name: operator.clone(),
        rules: format!("on #{hash} ~* &* +@all"),
    });
    for (name, op) in &config.operators {
        if Some(name) == config.redis.username.as_ref() {
            continue;
        }
        let key = format!("operators.{name}.password_file");
        users.push(User {
            name: name.clone(),
            rules: operator_rules(config, name, &password_hash(&key, &op.password_file)?),
        });
    }
    if let Some(web) = &config.web {
        let file = web.redis_password_file.as_ref().ok_or_else(|| {
            ConfigError::invalid(
                "web.redis_password_file",
                "the page needs its own Redis user's password file",
            )
        })?;
        users.push(User {
            name: keys::WEB_USER.into(),
            rules: web_rules(config, &password_hash("web.redis_password_file", file)?),
        });
        if let Some(file) = &web.exporter_password_file {
            users.push(User {
                name: keys::EXPORTER_USER.into(),
                rules: exporter_rules(config, &password_hash("web.exporter_password_file", file)?),
            });
        }
    }
    for (agent, a) in &config.agents {
        let key = format!("agents.{agent}.password_file");
        let file = a
            .password_file
            .as_ref()
            .ok_or_else(|| ConfigError::invalid(&key, "every agent needs a password file"))?;
        users.push(User {
            name: agent.clone(),
            rules: agent_rules(agent, &password_hash(&key, file)?),
        });
    }
    for (name, bridge) in &config.bridges {
        for service in Service::ALL {
            let key = format!("bridges.{name}.redis_password_files.{}", service.as_str());
            let file = bridge
                .redis_password_files
                .of(service)
                .ok_or_else(|| ConfigError::invalid(&key, "every service needs a password file"))?;
            users.push(User {
                name: keys::service_user(name, service.as_str()),
                rules: service_rules(config, name, service, &password_hash(&key, file)?),
            });
        }
    }
    Ok(users)
}

/// Renders the users in the chosen format.
pub fn render(config: &Config, format: Format) -> Result<String, ConfigError> {
    let mut out = String::new();
    for u in users(config)? {
        let _ = match format {
            Format::Aclfile => writeln!(out, "user {} {}", u.name, u.rules),
            Format::Commands => writeln!(out, "ACL SETUSER {} reset {}", u.name, u.rules),
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rights on approvals follow the approval flow: only a bridge that some
    /// bridge asks through may decide (ingest) or show cards (outbox), and only
    /// a bridge that parks reads its id key.
    #[test]
    fn approval_rights_only_where_approvals_happen() {
        let config = Config::parse(
            r#"
[bridges.asks]
type = "console"
approval = { required = true, notify = "shows", notify_channel = "ops", approvers = ["cli:op"] }
[bridges.shows]
type = "console"
destinations = ["ops"]
[bridges.plain]
type = "console"
"#,
        )
        .unwrap();
        let rules = |b: &str, s: Service| service_rules(&config, b, s, "00");
        // Records by the asking bridge's tag, never the whole prefix.
        let asks = format!("~approval:*{}", keys::approval_tag("asks"));
        assert!(rules("shows", Service::Ingest).contains(&asks));
        assert!(!rules("shows", Service::Ingest).contains("~approval:* "));
        assert!(!rules("plain", Service::Ingest).contains("approval:"));
        assert!(!rules("asks", Service::Ingest).contains("approval:"));
        assert!(rules("asks", Service::Outbox).contains("~asks:id-key"));
        assert!(rules("asks", Service::Outbox).contains(&asks));
        assert!(!rules("shows", Service::Outbox).contains("id-key"));
        assert!(rules("shows", Service::Outbox).contains(&asks));
        assert!(rules("shows", Service::Outbox).contains("~approval:shows_map"));
        assert!(!rules("plain", Service::Outbox).contains("approval:"));
    }
}
