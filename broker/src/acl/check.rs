//! Running the probes against a live Redis: `cowboy acl check`.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::{Config, Service};
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

use super::*;

/// The result of one probe.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub probe: Probe,
    /// `ok`, `NOPERM ...`, or the other error.
    pub got: String,
    pub allowed: bool,
    pub as_expected: bool,
}

/// Whether a reply means "the ACL refused it".
pub fn is_refusal(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("NOPERM")
}

/// Runs one probe as its user over `conn`. Destructive probes go through
/// `ACL DRYRUN` on `admin` unless `real` is set.
pub async fn run_probe(
    probe: &Probe,
    conn: &mut redis::aio::MultiplexedConnection,
    admin: &mut Store,
    real: bool,
) -> Verdict {
    let result: redis::RedisResult<redis::Value> = if probe.destructive && !real {
        redis::cmd("ACL")
            .arg("DRYRUN")
            .arg(&probe.user)
            .arg(&probe.args)
            .query_async(&mut admin.conn)
            .await
            .and_then(|v| match v {
                redis::Value::Okay => Ok(v),
                redis::Value::SimpleString(ref s) if s == "OK" => Ok(v),
                other => Err(redis::RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                    "NOPERM",
                    format!("{other:?}"),
                ))),
            })
    } else {
        let mut cmd = redis::cmd(&probe.args[0]);
        cmd.arg(&probe.args[1..]);
        cmd.query_async(conn).await
    };
    let (allowed, got) = match result {
        Ok(_) => (true, "ok".to_string()),
        Err(e) if is_refusal(&e) => (false, "NOPERM".to_string()),
        // Another error (no such group, wrong type...) means the ACL let it through.
        Err(e) => (true, format!("passed the ACL, then: {e}")),
    };
    let as_expected = allowed == (probe.expect == Expect::Allowed);
    Verdict {
        probe: probe.clone(),
        got,
        allowed,
        as_expected,
    }
}

/// Connects as `user` with the password in `file`.
pub async fn connect_as(
    config: &Config,
    user: &str,
    file: &Path,
) -> Result<redis::aio::MultiplexedConnection> {
    let mut redis = config.redis.clone();
    redis.username = Some(user.to_string());
    redis.password_file = Some(file.to_path_buf());
    let client = crate::topology::master_client(&redis).await?;
    let conn = client
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(std::time::Duration::from_secs(5))),
        )
        .await
        .map_err(|e| Error::Permission {
            command: format!("AUTH as {user}"),
            message: e.to_string(),
        })?;
    Ok(conn)
}

/// `cowboy acl check`: connects as every configured user and runs its probes.
/// Returns the table and whether everything was as expected.
pub async fn check(config: &Config, admin: &mut Store, real: bool) -> Result<(String, bool)> {
    // The probe inbox gives the agents something real to read and ack.
    for agent in config.agent_names() {
        let inbox = probe_inbox(agent);
        admin
            .ensure_group(&inbox, &keys::agent_group(agent))
            .await?;
        admin.xadd(&inbox, &[("acl_check", b"1")]).await?;
    }
    let mut table = format!(
        "{:<28} {:<8} {:<10} {:<8} {}\n",
        "user", "expect", "got", "result", "command"
    );
    let mut all_ok = true;
    let mut current: Option<(String, redis::aio::MultiplexedConnection)> = None;
    for probe in all_probes(config) {
        if current.as_ref().map(|(u, _)| u) != Some(&probe.user) {
            let file = password_file_of(config, &probe.user)
                .ok_or_else(|| Error::usage(format!("no password file for {}", probe.user)))?;
            current = Some((
                probe.user.clone(),
                connect_as(config, &probe.user, &file).await?,
            ));
        }
        let Some((_, conn)) = current.as_mut() else {
            continue;
        };
        let v = run_probe(&probe, conn, admin, real).await;
        all_ok &= v.as_expected;
        let _ = writeln!(
            table,
            "{:<28} {:<8} {:<10} {:<8} {}",
            v.probe.user,
            match v.probe.expect {
                Expect::Allowed => "allowed",
                Expect::Refused => "refused",
            },
            if v.allowed { "allowed" } else { "refused" },
            if v.as_expected { "ok" } else { "SURPRISE" },
            v.probe.args.join(" ")
                + if v.probe.destructive && !real {
                    "  (dry run)"
                } else {
                    ""
                },
        );
    }
    for agent in config.agent_names() {
        let _: () = redis::cmd("DEL")
            .arg(probe_inbox(agent))
            .arg(probe_outbox(agent))
            .query_async(&mut admin.conn)
            .await
            .map_err(|e| Error::from_redis("DEL probe streams", e))?;
    }
    Ok((table, all_ok))
}

/// The password file configured for a user name.
pub fn password_file_of(config: &Config, user: &str) -> Option<std::path::PathBuf> {
    if let Some(a) = config.agents.get(user) {
        return a.password_file.clone();
    }
    if user == keys::WEB_USER {
        return config.web.as_ref()?.redis_password_file.clone();
    }
    if user == keys::EXPORTER_USER {
        return config.web.as_ref()?.exporter_password_file.clone();
    }
    if let Some(op) = config.operators.get(user) {
        return Some(op.password_file.clone());
    }
    for (name, bridge) in &config.bridges {
        for service in Service::ALL {
            if keys::service_user(name, service.as_str()) == user {
                return bridge.redis_password_files.of(service).cloned();
            }
        }
    }
    None
}
