//! The ping service: the inbox side of a bridge.
//!
//! It reads the bridge's inbox streams (`{bridge}:inbox` and each configured
//! agent's `{agent}:{bridge}:inbox`) through its own group `{bridge}-ping`, so it
//! never takes entries from the agent's own consumers, and runs the configured
//! wake command once per burst and stream.
//!
//! Invariants: entries are acked only after the command exited with success; on
//! failure the same entries are retried with backoff (they stay pending, so a
//! restart retries them too); a burst (entries arriving within `debounce_ms`)
//! runs the command once. The newest entry's fields reach the command as
//! `COWBOY_FIELD_<NAME>` environment variables.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::config::{Config, PingConfig};
use crate::error::Result;
use crate::keys;
use crate::retry::backoff;
use crate::shutdown::Shutdown;
use crate::store::{Entry, Store, StreamBatch};
use crate::timing::HEARTBEAT_EVERY;

/// A platform liveness check (e.g. SMTP NOOP, Discord `users/@me`), run with each
/// heartbeat; its outcome is published as the heartbeat's `platform` field.
pub type Probe = Box<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// Longest a liveness probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a wake command may run before it counts as failed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The ping service of one bridge.
pub struct PingService {
    name: String,
    ping: PingConfig,
    store: Store,
    shutdown: Shutdown,
    streams: Vec<(String, Option<String>)>,
    probe: Option<Probe>,
}

impl PingService {
    pub fn new(config: Arc<Config>, name: &str, store: Store, shutdown: Shutdown) -> Result<Self> {
        let ping = config.bridge(name)?.ping.clone();
        let mut streams = vec![(keys::inbox(name), None)];
        for agent in config.agent_names() {
            streams.push((keys::agent_inbox(agent, name), Some(agent.to_string())));
        }
        Ok(PingService {
            name: name.to_string(),
            ping,
            store,
            shutdown,
            streams,
            probe: None,
        })
    }

    /// Adds the bridge's platform liveness check to every heartbeat.
    pub fn with_probe(mut self, probe: Probe) -> Self {
        self.probe = Some(probe);
        self
    }

    async fn beat(&mut self) -> Result<()> {
        self.store
            .heartbeat(
                &self.name,
                "ping",
                HEARTBEAT_EVERY * 3,
                &crate::Clock::system(),
            )
            .await?;
        if let Some(probe) = &self.probe {
            let state = match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
                Ok(Ok(())) => "ok".to_string(),
                Ok(Err(e)) => format!("error: {e}"),
                Err(_) => "error: no answer within 5 s".to_string(),
            };
            if state != "ok" {
                tracing::warn!(platform = %state, "platform liveness check failed");
            }
            let key = keys::heartbeat(&self.name);
            let _: () = redis::AsyncCommands::hset(&mut self.store.conn, &key, "platform", state)
                .await
                .map_err(|e| crate::Error::from_redis(&format!("HSET {key}"), e))?;
        }
        Ok(())
    }

    /// Creates the groups (readiness point).
    pub async fn prepare(&mut self) -> Result<()> {
        let group = keys::ping_group(&self.name);
        for (stream, agent) in &self.streams {
            self.store.ensure_group(stream, &group).await?;
            if let Some(agent) = agent {
                self.store
                    .ensure_group(stream, &keys::agent_group(agent))
                    .await?;
            }
        }
        Ok(())
    }

    pub async fn run(mut self) -> Result<()> {
        self.prepare().await?;
        let group = keys::ping_group(&self.name);
        let consumer = keys::ping_consumer(&self.name);
        let keys: Vec<String> = self.streams.iter().map(|(k, _)| k.clone()).collect();
        let mut blocking = self.store.blocking().await?;
        // What an earlier run read but never pinged for comes first.
        let mut pending: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        let zeros = vec!["0"; keys.len()];
        merge(
            &mut pending,
            blocking
                .read_group(&group, &consumer, &keys, &zeros, 10_000, None)
                .await?,
        );
        let news = vec![">"; keys.len()];
        let mut last_beat: Option<Instant> = None;
        let mut watchdog = crate::systemd::Watchdog::from_env();
        let block = watchdog
            .interval()
            .unwrap_or(Duration::from_secs(5))
            .min(Duration::from_secs(5));
        crate::systemd::ready();
        loop {
            watchdog.tick();
            if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
                self.beat().await?;
                last_beat = Some(Instant::now());
            }
            if pending.is_empty() {
                let read = tokio::select! {
                    _ = self.shutdown.wait() => break,
                    r = blocking.read_group(&group, &consumer, &keys, &news, 1000, Some(block)) => r?,
                };
                merge(&mut pending, read);
                if pending.is_empty() {
                    continue;
                }
                // Gather the rest of the burst before waking anyone.
                if !self
                    .shutdown
                    .sleep(Duration::from_millis(self.ping.debounce_ms))
                    .await
                {
                    break;
                }
                merge(
                    &mut pending,
                    blocking
                        .read_group(&group, &consumer, &keys, &news, 10_000, None)
                        .await?,
                );
            }
            let streams: Vec<String> = pending.keys().cloned().collect();
            for stream in streams {
                let entries = &pending[&stream];
                let agent = self
                    .streams
                    .iter()
                    .find(|(k, _)| *k == stream)
                    .and_then(|(_, a)| a.clone());
                if !self.wake(&stream, agent.as_deref(), entries).await {
                    return Ok(()); // shutdown during a retry wait; entries stay pending
                }
                let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
                self.store.ack(&stream, &group, &ids).await?;
                pending.remove(&stream);
            }
        }
        Ok(())
    }

    /// Runs the command until it succeeds; false if shutdown came first.
    async fn wake(&self, stream: &str, agent: Option<&str>, entries: &[Entry]) -> bool {
        let Some((program, args)) = self.ping.command.split_first() else {
            return true;
        };
        let Some(newest) = entries.last() else {
            return true;
        };
        let mut attempt = 0;
        loop {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .kill_on_drop(true)
                .stdin(std::process::Stdio::null())
                .env("COWBOY_BRIDGE", &self.name)
                .env("COWBOY_AGENT", agent.unwrap_or(""))
                .env("COWBOY_STREAM", stream)
                .env("COWBOY_COUNT", entries.len().to_string())
                .env("COWBOY_ENTRY_ID", &newest.id);
            for (name, value) in &newest.fields {
                let var: String = name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() {
                            c.to_ascii_uppercase()
                        } else {
                            '_'
                        }
                    })
                    .collect();
                let value: Vec<u8> = value.iter().copied().filter(|b| *b != 0).collect();
                cmd.env(format!("COWBOY_FIELD_{var}"), OsString::from_vec(value));
            }
            let result = tokio::time::timeout(COMMAND_TIMEOUT, cmd.status()).await;
            match result {
                Ok(Ok(status)) if status.success() => {
                    tracing::info!(stream, count = entries.len(), "agent pinged");
                    return true;
                }
                Ok(Ok(status)) => tracing::warn!(stream, %status, "ping command failed"),
                Ok(Err(e)) => tracing::warn!(stream, error = %e, "ping command could not start"),
                Err(_) => tracing::warn!(stream, "ping command timed out"),
            }
            attempt += 1;
            if !self.shutdown.sleep(backoff(attempt)).await {
                return false;
            }
        }
    }
}

fn merge(pending: &mut BTreeMap<String, Vec<Entry>>, batch: StreamBatch) {
    for (stream, entries) in batch {
        for (id, fields) in entries {
            let fields = fields.unwrap_or_default();
            pending
                .entry(stream.clone())
                .or_default()
                .push(Entry { id, fields });
        }
    }
}
