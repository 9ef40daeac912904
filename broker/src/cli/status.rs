//! `cowboy status`: groups, pending entries and heartbeats at a glance.

use std::collections::HashMap;
use std::fmt::Write as _;

use redis::AsyncCommands;

use crate::approval::Approvals;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// `cowboy status`: per bridge, its streams, pending and parked counts, dead
/// letters and the age of each service's heartbeat.
pub async fn status(store: &mut Store, config: &Config) -> Result<String> {
    let now = crate::now_secs();
    let mut parked: HashMap<String, usize> = HashMap::new();
    for name in config.bridges.keys() {
        let n = Approvals::on(store).pending_count(name).await?;
        parked.insert(name.clone(), n);
    }
    let mut out = store.conn.describe().await;
    out.push('\n');
    // On a cluster each stream's line says which master holds it (nothing
    // when the cluster will not say; the topology line says why).
    let owners = store.conn.owners().await.ok().flatten();
    for (name, bridge) in &config.bridges {
        let _ = writeln!(out, "bridge {name} ({})", bridge.kind);
        let mut streams = vec![(keys::outbox(name), Some(keys::outbox_group(name)))];
        streams.push((keys::inbox(name), Some(keys::ping_group(name))));
        for agent in config.agent_names() {
            streams.push((
                keys::agent_outbox(agent, name),
                Some(keys::outbox_group(name)),
            ));
            streams.push((keys::agent_inbox(agent, name), Some(keys::ping_group(name))));
        }
        streams.push((keys::dead(name), None));
        for (stream, group) in streams {
            let len: u64 = store
                .conn
                .xlen(&stream)
                .await
                .map_err(|e| Error::from_redis("XLEN", e))?;
            let pending = match group {
                Some(g) => group_pending(store, &stream, &g).await?,
                None => None,
            };
            let node = owners
                .as_ref()
                .map(|o| match o.of(&stream) {
                    (Some(master), slot) => format!("  on {master} (slot {slot})"),
                    (None, slot) => format!("  slot {slot} unserved"),
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {stream:<32} length {len:>6}{}{node}",
                pending
                    .map(|(g, p, lag)| format!("  group {g}: pending {p}, lag {lag}"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "  parked approvals: {}",
            parked.get(name).copied().unwrap_or(0)
        );
        let beats: HashMap<String, String> = store
            .conn
            .hgetall(keys::heartbeat(name))
            .await
            .map_err(|e| Error::from_redis("HGETALL heartbeat", e))?;
        for service in ["ingest", "outbox", "ping"] {
            let line = match beats.get(service).and_then(|t| t.parse::<u64>().ok()) {
                Some(t) => format!("alive ({}s ago)", now.saturating_sub(t)),
                None => "down (no heartbeat)".to_string(),
            };
            let _ = writeln!(out, "  {service:<7} {line}");
        }
        if let Some(platform) = beats.get("platform") {
            let _ = writeln!(out, "  platform {platform}");
        }
    }
    Ok(out)
}

/// (group, pending, lag) of a group on a stream, when both exist.
async fn group_pending(
    store: &mut Store,
    stream: &str,
    group: &str,
) -> Result<Option<(String, u64, String)>> {
    let reply: redis::RedisResult<Vec<HashMap<String, redis::Value>>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(&mut store.conn)
        .await;
    let Ok(groups) = reply else {
        return Ok(None); // no such stream yet
    };
    for g in groups {
        let name = g
            .get("name")
            .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
        if name.as_deref() == Some(group) {
            let pending = g
                .get("pending")
                .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok());
            let lag = g
                .get("lag")
                .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok())
                .map(|l| l.to_string())
                .unwrap_or_else(|| "?".into());
            return Ok(Some((group.to_string(), pending.unwrap_or(0), lag)));
        }
    }
    Ok(None)
}
