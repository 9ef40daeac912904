//! `cowboy status`: groups, pending entries and heartbeats at a glance.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::approval::Approvals;
use crate::config::Config;
use crate::error::Result;
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
        let mut streams: Vec<(String, Option<String>)> = crate::gauges::read_streams(config, name)
            .into_iter()
            .map(|(stream, group)| (stream, Some(group)))
            .collect();
        streams.push((keys::dead(name), None));
        for (stream, group) in streams {
            let len = store.len(&stream).await?;
            let pending = match group {
                // A group that cannot be read is left off its stream's line.
                Some(g) => crate::gauges::group(store, &stream, &g)
                    .await
                    .ok()
                    .flatten(),
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
                    .map(|g| format!(
                        "  group {}: pending {}, lag {}",
                        g.name,
                        g.pending,
                        g.lag.map_or("?".to_string(), |l| l.to_string())
                    ))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "  parked approvals: {}",
            parked.get(name).copied().unwrap_or(0)
        );
        let beats = store.heartbeats(name).await?;
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
