//! What the operator's views read of each bridge: the page's `/metrics` its
//! counts ([`read`]: parked approvals and the oldest one's age, dead letters,
//! uncertain deliveries, heartbeats), and both it and `cowboy status` the
//! streams a bridge reads with the group that reads each ([`read_streams`],
//! [`group`]).
//!
//! Invariants:
//! - Read only: nothing here writes, so the page's read-only user can serve it.
//! - Every bridge's counts come back in one pipeline (one round trip, however
//!   many bridges); each stream's group is one `XINFO GROUPS` more.

use std::collections::HashMap;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// One bridge's counts, as read together.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// Approvals parked and not yet settled.
    pub parked: u64,
    /// When the oldest of them was parked (unix seconds).
    pub oldest_parked_at: Option<f64>,
    /// Entries of the dead-letter stream.
    pub dead: u64,
    /// Uncertain deliveries waiting to be reconciled.
    pub uncertain: u64,
    /// Each service's last heartbeat (unix seconds, as text).
    pub beats: HashMap<String, String>,
}

/// The counts of each of `bridges`, in the same order.
pub async fn read(store: &mut Store, bridges: &[&str]) -> Result<Vec<Gauges>> {
    let mut pipe = redis::pipe();
    for b in bridges {
        pipe.zcard(keys::pending(b));
        pipe.cmd("ZRANGE")
            .arg(keys::pending(b))
            .arg(0)
            .arg(0)
            .arg("WITHSCORES");
        pipe.xlen(keys::dead(b));
        pipe.hlen(keys::uncertain(b));
        pipe.hgetall(keys::heartbeat(b));
    }
    let flat: Vec<redis::Value> = pipe
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis("the bridges' counts", e))?;
    Ok(flat
        .chunks(5)
        .map(|chunk| {
            let v = |i: usize| chunk.get(i).cloned().unwrap_or(redis::Value::Nil);
            let first: Vec<(String, f64)> = redis::from_redis_value(v(1)).unwrap_or_default();
            Gauges {
                parked: redis::from_redis_value(v(0)).unwrap_or(0),
                oldest_parked_at: first.first().map(|(_, at)| *at),
                dead: redis::from_redis_value(v(2)).unwrap_or(0),
                uncertain: redis::from_redis_value(v(3)).unwrap_or(0),
                beats: redis::from_redis_value(v(4)).unwrap_or_default(),
            }
        })
        .collect())
}

/// The streams bridge `name` reads, each with the group that reads it: its
/// outboxes (the flat one, then each agent's) by the outbox group, its inboxes
/// by ping's.
pub fn read_streams(config: &Config, name: &str) -> Vec<(String, String)> {
    let mut streams = vec![
        (keys::outbox(name), keys::outbox_group(name)),
        (keys::inbox(name), keys::ping_group(name)),
    ];
    for agent in config.agent_names() {
        streams.push((keys::agent_outbox(agent, name), keys::outbox_group(name)));
        streams.push((keys::agent_inbox(agent, name), keys::ping_group(name)));
    }
    streams
}

/// Group `group` of `stream`, when both exist.
pub async fn group(
    store: &mut Store,
    stream: &str,
    group: &str,
) -> Result<Option<crate::store::Group>> {
    Ok(store
        .groups(stream)
        .await?
        .into_iter()
        .find(|g| g.name == group))
}
