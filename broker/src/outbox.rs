//! The outbox service: reads a bridge's outbox streams, gates entries behind
//! approvals, delivers through a [`Sender`], and settles parked entries.
//!
//! Streams read, all through group `{bridge}-outbox` / consumer `{bridge}-worker`
//! in one blocking `XREADGROUP`: the flat `{bridge}:outbox`, each configured
//! agent's `{agent}:{bridge}:outbox`, and `{bridge}:decisions` (wake-ups written
//! by `resolve_approval`).
//!
//! Invariants:
//! - An entry is acked only once its outcome is recorded: sent, dead-lettered with
//!   a notice, or settled. A parked entry stays pending, so a restart finds it in
//!   the pending list ("resume or start") with the same derived approval id.
//! - Parking is three idempotent steps, each safe to repeat after a crash: create
//!   the record if absent (it holds the digest of the one notification it will
//!   write); write that notification unless the record says it was written (after
//!   a crash in between, the notify outbox is searched for it by digest first);
//!   remember the notification id in the record. No step spans two keys, so the
//!   protocol works unchanged on Redis Cluster.
//! - Only the requesting service can ask. On the notify side an entry carrying
//!   `approval_id` is shown only when its digest is the record's `notify_sha256`
//!   and it is the first such entry (the record's `notify_entry` claim); its
//!   destination is the record's `notify_channel`, which must also pass this
//!   bridge's `destinations`. Anything else is dead-lettered.
//! - Only real outcomes change a card. An outcome entry names an approval and an
//!   outcome; it is acted on only when the record exists, is settled with that
//!   outcome and names this bridge, and the card's text is built from the record.
//!   The requester keeps such a record (with a TTL) for the notify side, which
//!   deletes it once the card is updated.
//! - A parked entry that vanished from its stream (trimmed or deleted) is settled
//!   as failed, at start-up and in the sweep: notice, record closed, card updated.
//! - Settling marks the record `settled_at` (with a Redis TTL as a safety net)
//!   before acking, then deletes it: a crash in between neither repeats the
//!   outcome nor leaves a record behind forever.
//! - An approved entry is re-read from its stream and its sha256 compared with the
//!   record's before it is sent; a mismatch is refused.
//! - A send that may have happened before a crash is retried only with `retry =
//!   true`, so the sender can deduplicate by `delivery_key` or report the delivery
//!   uncertain. For senders that cannot deduplicate ([`Sender::DEDUPLICATES`]),
//!   each delivery is marked in `{bridge}:in-flight` first, so `retry` is set
//!   exactly when an attempt may have reached the platform.
//! - Idle cost does not grow with the number of parked entries: the service
//!   blocks on one read, woken by new entries, by decisions, or by the next
//!   deadline kept in memory; a slow sweep (one pipelined round trip) catches a
//!   decision whose wake-up was lost.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::approval::{self, IdKey, Record, State};
use crate::config::{BridgeConfig, Config};
use crate::entry::{Message, Notice};
use crate::error::{Error, Result};
use crate::keys;
use crate::shutdown::Shutdown;
use crate::store::{read_group, Entry, Store};
use crate::systemd::{self, Watchdog};

/// How often parked records are re-read in case a wake-up was lost.
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// How often the service refreshes its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// Longest single block on the read, so shutdown and heartbeats stay timely.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// Consecutive Redis failures (with growing pauses, about five minutes in all)
/// before the service gives up and exits for its supervisor to restart it.
const MAX_FAILURES: u32 = 15;
/// Fields of a refused entry copied into its dead letter (the rest are counted).
const DEAD_FIELDS_KEPT: usize = 64;
/// Redis TTL put on a settled record in case the final delete never happens.
const SETTLED_TTL_SECS: i64 = 24 * 3600;

/// One message to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub message: &'a Message,
    /// Stable per stream entry: the same on every retry, unique across entries.
    pub delivery_key: &'a str,
    /// A previous attempt may have delivered it already (crash or lost reply).
    pub retry: bool,
    /// On an approval notification: the record it asks about.
    pub approval: Option<&'a Record>,
}

/// Why a send did not happen, classified for the retry policy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// Worth retrying after a pause (rate limit, lost connection, 4xx SMTP).
    #[error("transient: {0}")]
    Transient(String),
    /// Will never work (unknown channel, refused recipient): dead letter.
    #[error("{0}")]
    Permanent(String),
    /// May or may not have been delivered; never retried blindly.
    #[error("uncertain: {0}")]
    Uncertain(String),
}

/// The outcome of an approval, for the notify bridge to show on its notification.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    /// `approved`, `rejected`, `expired` or `failed`, as the record says.
    pub outcome: &'a str,
    /// The notification's id on the platform.
    pub external_id: &'a str,
    /// Where the notification was sent.
    pub channel_id: &'a str,
    /// The settled record, as the requesting service left it (verified: only
    /// the broker writes records).
    pub record: &'a Record,
}

/// What a platform does for the outbox: deliver and name the result, and
/// optionally show an approval's outcome on its notification.
pub trait Sender: Send + Sync + 'static {
    /// Whether sending one delivery key twice is harmless because the sender or
    /// its platform drops the duplicate (a nonce, a search before writing). When
    /// false, the outbox marks each delivery in flight, and `retry` is set only
    /// when such a mark shows an earlier attempt may have reached the platform.
    const DEDUPLICATES: bool = true;

    /// Delivers one message and returns its id on the platform (the external id).
    fn send(
        &self,
        out: Outgoing<'_>,
    ) -> impl Future<Output = std::result::Result<String, SendError>> + Send;

    /// Shows the outcome on the notification (e.g. edits the Discord card), so
    /// nobody answers a dead request. Cosmetic: failures are logged, not retried.
    fn update(
        &self,
        outcome: Outcome<'_>,
    ) -> impl Future<Output = std::result::Result<(), SendError>> + Send {
        let _ = outcome;
        async { Ok(()) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Flat,
    Agent,
    Decisions,
}

#[derive(Debug, Clone)]
struct Source {
    key: String,
    agent: Option<String>,
    kind: Kind,
}

#[derive(Debug, Clone)]
struct Parked {
    source: usize,
    entry_id: String,
    expires_at: u64,
}

/// The outbox service of one bridge.
pub struct OutboxService<S> {
    config: Arc<Config>,
    name: String,
    bridge: BridgeConfig,
    sender: S,
    store: Store,
    group: String,
    consumer: String,
    sources: Vec<Source>,
    parked: HashMap<String, Parked>,
    deadlines: BTreeSet<(u64, String)>,
    /// The secret approval ids are derived with; loaded by [`Self::prepare`]
    /// when this bridge parks.
    id_key: Option<IdKey>,
    shutdown: Shutdown,
    watchdog: Watchdog,
}

impl<S: Sender> OutboxService<S> {
    /// Prepares the service of bridge `name`; nothing is read until [`Self::run`].
    pub fn new(
        config: Arc<Config>,
        name: &str,
        sender: S,
        store: Store,
        shutdown: Shutdown,
    ) -> Result<Self> {
        let bridge = config.bridge(name)?.clone();
        let mut sources = vec![Source {
            key: keys::outbox(name),
            agent: None,
            kind: Kind::Flat,
        }];
        for agent in config.agent_names() {
            sources.push(Source {
                key: keys::agent_outbox(agent, name),
                agent: Some(agent.to_string()),
                kind: Kind::Agent,
            });
        }
        sources.push(Source {
            key: keys::decisions(name),
            agent: None,
            kind: Kind::Decisions,
        });
        Ok(OutboxService {
            config,
            name: name.to_string(),
            bridge,
            sender,
            store,
            group: keys::outbox_group(name),
            consumer: keys::outbox_consumer(name),
            sources,
            parked: HashMap::new(),
            deadlines: BTreeSet::new(),
            id_key: None,
            shutdown,
            watchdog: Watchdog::from_env(),
        })
    }

    /// Creates the consumer groups. Called by [`Self::run`]; public so a caller can
    /// report readiness once they exist.
    pub async fn prepare(&mut self) -> Result<()> {
        for source in &self.sources {
            self.store.ensure_group(&source.key, &self.group).await?;
        }
        if self.bridge.approval.required && self.id_key.is_none() {
            self.id_key = Some(IdKey::load(&mut self.store, &self.name).await?);
        }
        Ok(())
    }

    /// Runs until shutdown. Returns an error only for what a restart cannot fix
    /// by waiting (permissions, config) or after Redis stayed away.
    pub async fn run(mut self) -> Result<()> {
        self.prepare().await?;
        let mut blocking = Some(self.store.blocking().await?);
        if let Some(conn) = blocking.as_mut() {
            self.recover(conn).await?;
        }
        systemd::ready();
        tracing::info!(bridge = %self.name, parked = self.parked.len(), "outbox service running");
        let mut loop_state = LoopState {
            last_sweep: Instant::now(),
            last_beat: None,
        };
        let mut failures = 0u32;
        while !self.shutdown.is_set() {
            self.watchdog.tick();
            let step = match blocking.as_mut() {
                Some(conn) => self.step(conn, &mut loop_state).await,
                None => self.reconnect().await.map(|conn| {
                    blocking = Some(conn);
                    true
                }),
            };
            match step {
                Ok(true) => failures = 0,
                Ok(false) => break,
                // Redis lost its data (restarted without persistence): groups come back empty.
                // Or its stream was deleted under a blocked read (UNBLOCKED).
                Err(Error::Redis(e)) if matches!(e.code(), Some("NOGROUP" | "UNBLOCKED")) => {
                    tracing::warn!("consumer group missing; creating it again");
                    self.prepare().await?;
                }
                Err(e) if e.is_retriable() && failures < MAX_FAILURES => {
                    failures += 1;
                    tracing::warn!(error = %e, failures, "Redis unavailable; retrying");
                    blocking = None;
                    if !self.shutdown.sleep(backoff(failures)).await {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        tracing::info!(bridge = %self.name, "outbox service stopped");
        Ok(())
    }

    /// A fresh blocking connection, and whatever a lost reply left pending.
    async fn reconnect(&mut self) -> Result<redis::aio::MultiplexedConnection> {
        let mut conn = self.store.blocking().await?;
        self.recover(&mut conn).await?;
        tracing::info!(bridge = %self.name, "reconnected to Redis");
        Ok(conn)
    }

    /// One turn of the loop: heartbeat, one blocking read, handling, deadlines,
    /// sweep. Returns false when shutdown came during the read.
    async fn step(
        &mut self,
        blocking: &mut redis::aio::MultiplexedConnection,
        st: &mut LoopState,
    ) -> Result<bool> {
        if st.last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
            self.store
                .heartbeat(&self.name, "outbox", HEARTBEAT_EVERY * 3)
                .await?;
            st.last_beat = Some(Instant::now());
        }
        let keys: Vec<String> = self.sources.iter().map(|s| s.key.clone()).collect();
        let new_ids = vec![">"; keys.len()];
        let block = self.block_for(st.last_sweep);
        let batch = tokio::select! {
            _ = self.shutdown.wait() => return Ok(false),
            r = read_group(blocking, &self.group, &self.consumer, &keys, &new_ids, self.bridge.batch, Some(block)) => r?,
        };
        for (key, entries) in batch {
            let Some(idx) = self.sources.iter().position(|s| s.key == key) else {
                continue;
            };
            for (id, fields) in entries {
                self.handle(idx, id, fields, false).await?;
            }
        }
        self.settle_due().await?;
        if st.last_sweep.elapsed() >= SWEEP_EVERY {
            self.sweep().await?;
            st.last_sweep = Instant::now();
        }
        Ok(true)
    }

    fn block_for(&self, last_sweep: Instant) -> Duration {
        let mut block = MAX_BLOCK.min(SWEEP_EVERY.saturating_sub(last_sweep.elapsed()));
        if let Some(w) = self.watchdog.interval() {
            block = block.min(w);
        }
        if let Some((deadline, _)) = self.deadlines.first() {
            let until = *deadline as f64 - crate::now_secs_f64();
            block = block.min(Duration::from_secs_f64(until.max(0.0)));
        }
        block.max(Duration::from_millis(1))
    }

    /// Handles this consumer's pending entries: parked ones are tracked again,
    /// unfinished ones handled as retries. Decisions come last, so every parked
    /// entry is known when they are applied.
    async fn recover(&mut self, blocking: &mut redis::aio::MultiplexedConnection) -> Result<()> {
        for idx in 0..self.sources.len() {
            let key = self.sources[idx].key.clone();
            let mut after = "0".to_string();
            loop {
                let batch = read_group(
                    blocking,
                    &self.group,
                    &self.consumer,
                    std::slice::from_ref(&key),
                    &[after.as_str()],
                    self.bridge.batch,
                    None,
                )
                .await?;
                let entries: Vec<_> = batch.into_iter().flat_map(|(_, e)| e).collect();
                let Some((last, _)) = entries.last() else {
                    break;
                };
                after = last.clone();
                for (id, fields) in entries {
                    self.handle(idx, id, fields, true).await?;
                }
            }
        }
        self.settle_due().await
    }

    async fn handle(
        &mut self,
        idx: usize,
        id: String,
        fields: Option<Vec<(String, Vec<u8>)>>,
        retry: bool,
    ) -> Result<()> {
        let source = self.sources[idx].clone();
        let Some(fields) = fields else {
            return self.vanished(idx, &id).await;
        };
        let entry = Entry { id, fields };
        if source.kind == Kind::Decisions {
            if let Some(approval_id) = entry.text("approval_id") {
                if self.parked.contains_key(approval_id) {
                    self.settle(approval_id.to_string()).await?;
                }
            }
            return self.ack(&source.key, &entry.id).await;
        }
        if source.kind == Kind::Flat && entry.get("approval_outcome").is_some() {
            return self.handle_outcome(idx, &entry).await;
        }
        if source.kind == Kind::Flat && entry.get("approval_id").is_some() {
            return self.handle_notification(idx, &entry, retry).await;
        }
        let message = Message::from_entry(&entry, &self.bridge).and_then(|m| {
            if self.config.approval_channels(&self.name).any(|c| c == m.channel_id) {
                Err(format!(
                    "destination `{}` is where approval requests are shown; agents may not post there",
                    m.channel_id
                ))
            } else {
                Ok(m)
            }
        });
        let message = match message {
            Ok(m) => m,
            Err(reason) => {
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    ..Notice::default()
                };
                return self.dead_letter(idx, &entry, n).await;
            }
        };
        if !self.bridge.approval.required {
            return self.deliver_and_ack(idx, &entry, &message, retry).await;
        }
        let approval_id = self.approval_id(&source.key, &entry.id)?;
        if retry && self.parked.contains_key(&approval_id) {
            return Ok(());
        }
        self.park(idx, &entry, &message, approval_id, retry).await
    }

    fn approval_id(&self, stream: &str, entry_id: &str) -> Result<String> {
        let key = self.id_key.as_ref().ok_or_else(|| {
            Error::Request("the approval id key is not loaded (prepare was not called)".into())
        })?;
        Ok(key.id_for(stream, entry_id))
    }

    /// A pending entry whose body is gone from its stream (trimmed by its writer's
    /// `MAXLEN`, or deleted). If it was parked, its approval is settled as failed.
    async fn vanished(&mut self, idx: usize, entry_id: &str) -> Result<()> {
        let source = self.sources[idx].clone();
        if self.bridge.approval.required && source.kind != Kind::Decisions {
            let id = self.approval_id(&source.key, entry_id)?;
            if let Some(record) = approval::load(&mut self.store, &id).await? {
                tracing::warn!(approval = %id, stream = %source.key, entry = entry_id, "parked entry vanished from its stream; settled as failed");
                if record.fields.contains_key("settled_at") {
                    return self.finish(idx, entry_id, &record, None).await;
                }
                let n = Notice {
                    status: "failed",
                    reason: "the parked entry vanished from its stream (trimmed or deleted) before it could be sent; nothing was sent",
                    approval_id: Some(&id),
                    request_id: Some(record.get("request_id")),
                    ..Notice::default()
                };
                self.notice(idx, entry_id, None, n).await?;
                return self.finish(idx, entry_id, &record, Some("failed")).await;
            }
        }
        tracing::warn!(stream = %source.key, entry = entry_id, "pending entry no longer exists; acked");
        self.ack(&source.key, entry_id).await
    }

    /// An entry carrying `approval_id` on the flat outbox: shown only when it is the
    /// one notification the requesting service wrote for a pending approval.
    async fn handle_notification(&mut self, idx: usize, entry: &Entry, retry: bool) -> Result<()> {
        let id = entry.text("approval_id").unwrap_or_default().to_string();
        let (record, message) = match self.check_notification(entry, &id).await? {
            Ok(checked) => checked,
            Err(reason) => {
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    approval_id: Some(&id),
                    ..Notice::default()
                };
                return self.dead_letter(idx, entry, n).await;
            }
        };
        let key = delivery_key(&self.sources[idx].key, &entry.id);
        let out = Outgoing {
            message: &message,
            delivery_key: &key,
            retry,
            approval: Some(&record),
        };
        match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                let map = keys::approval_map(&self.name);
                let _: i64 = self
                    .store
                    .conn
                    .hset(&map, &external_id, &id)
                    .await
                    .map_err(|e| Error::from_redis(&format!("HSET {map}"), e))?;
                let kept = set_if_exists(
                    &mut self.store,
                    &id,
                    &[("notify_external_id", &external_id)],
                )
                .await?;
                if !kept {
                    // Settled and gone while the card was being posted: answers to it
                    // could only be late, so it is not kept as an answerable card.
                    let _: i64 = self
                        .store
                        .conn
                        .hdel(&map, &external_id)
                        .await
                        .map_err(|e| Error::from_redis(&format!("HDEL {map}"), e))?;
                }
                tracing::info!(approval = %id, external_id, "approval notification delivered");
                self.ack(&self.sources[idx].key.clone(), &entry.id).await
            }
            Delivery::Failed(n) => self.dead_letter(idx, entry, n.with_approval(&id)).await,
            Delivery::Interrupted => Ok(()),
        }
    }

    /// Verifies a notification entry against its record and claims the record for
    /// it. `Ok(Err(reason))` is a refusal; the entry then goes to the dead letter.
    async fn check_notification(
        &mut self,
        entry: &Entry,
        id: &str,
    ) -> Result<std::result::Result<(Record, Message), String>> {
        if !self.config.is_approval_surface(&self.name) {
            return Ok(Err(format!(
                "bridge `{}` carries no approval notifications (no bridge with approval.required names it as notify)",
                self.name
            )));
        }
        if !approval::is_id(id) {
            return Ok(Err(format!("approval `{id}` does not exist")));
        }
        let Some(record) = approval::load(&mut self.store, id).await? else {
            return Ok(Err(format!("approval `{id}` does not exist")));
        };
        if record.get("notify") != self.name
            || self.config.notify_bridge(record.source()) != self.name
        {
            return Ok(Err(format!(
                "approval `{id}` does not notify through bridge `{}`",
                self.name
            )));
        }
        match record.state(crate::now_secs_f64()) {
            State::Pending => {}
            other => return Ok(Err(format!("approval `{id}` is {}", other.as_str()))),
        }
        let channel = record.get("notify_channel").to_string();
        if !self.bridge.allows_destination(&channel) {
            return Ok(Err(format!(
                "notify_channel `{channel}` of approval `{id}` is not on this bridge's `destinations` allow-list"
            )));
        }
        let digest = approval::fields_sha256(
            entry
                .fields
                .iter()
                .map(|(k, v)| (k.as_str(), Some(v.as_slice()))),
        );
        let key = keys::approval(id);
        let claim: String = redis::Script::new(approval::CLAIM)
            .key(&key)
            .arg(&self.name)
            .arg(&entry.id)
            .arg(&digest)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA claim {key}"), e))?;
        let refusal = match claim.as_str() {
            "ok" => None,
            "digest" => Some(format!(
                "not the notification the requesting service wrote for approval `{id}` (its digest differs); not shown"
            )),
            "claimed" => Some(format!(
                "approval `{id}` was already notified by entry {}; a second notification is not shown",
                record.get("notify_entry")
            )),
            "missing" => Some(format!("approval `{id}` does not exist")),
            "settled" => Some(format!("approval `{id}` is settled")),
            other => Some(format!("approval `{id}` cannot be notified here ({other})")),
        };
        if let Some(reason) = refusal {
            tracing::warn!(approval = %id, entry = %entry.id, reason, "forged or repeated notification refused");
            return Ok(Err(reason));
        }
        let text = |name: &str| entry.text(name).map(str::to_string);
        let message = Message {
            channel_id: channel,
            content: text("content").unwrap_or_default(),
            approval_id: Some(id.to_string()),
            approval_content: text("approval_content"),
            ..Message::default()
        };
        Ok(Ok((record, message)))
    }

    /// An outcome entry written by a requesting service when it settled an
    /// approval this bridge notified: acted on only when the record confirms it,
    /// and shown from the record, never from the entry's text.
    async fn handle_outcome(&mut self, idx: usize, entry: &Entry) -> Result<()> {
        let id = entry.text("approval_id").unwrap_or("").to_string();
        let claimed = entry.text("approval_outcome").unwrap_or("");
        let record = if approval::is_id(&id) {
            approval::load(&mut self.store, &id).await?
        } else {
            None
        };
        let refusal = match &record {
            _ if entry.fields.len() != 2 => {
                Some("outcome entries carry `approval_id` and `approval_outcome` only".to_string())
            }
            None => Some(format!("no settled approval `{id}` to show an outcome for")),
            Some(r) if r.get("notify") != self.name => Some(format!(
                "approval `{id}` was not notified through this bridge"
            )),
            Some(r) if !r.fields.contains_key("settled_at") => {
                Some(format!("approval `{id}` is not settled"))
            }
            Some(r) if r.get("outcome") != claimed => Some(format!(
                "the outcome `{claimed}` is not the record's `{}`",
                r.get("outcome")
            )),
            Some(_) => None,
        };
        let record = match (refusal, record) {
            (None, Some(r)) => r,
            (reason, _) => {
                let reason = reason.unwrap_or_default();
                tracing::warn!(approval = %id, reason, "forged outcome refused");
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    ..Notice::default()
                };
                return self.dead_letter(idx, entry, n).await;
            }
        };
        let external = record.get("notify_external_id");
        if !external.is_empty() {
            let update = Outcome {
                outcome: record.get("outcome"),
                external_id: external,
                channel_id: record.get("notify_channel"),
                record: &record,
            };
            if let Err(e) = self.sender.update(update).await {
                tracing::warn!(approval = %record.id, error = %e, "could not show the outcome on the notification");
            }
        }
        let key = keys::approval(&record.id);
        let mut pipe = redis::pipe();
        pipe.del(&key).ignore();
        if !external.is_empty() {
            pipe.hdel(keys::approval_map(&self.name), external).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        self.ack(&self.sources[idx].key.clone(), &entry.id).await
    }

    async fn park(
        &mut self,
        idx: usize,
        entry: &Entry,
        message: &Message,
        id: String,
        retry: bool,
    ) -> Result<()> {
        let source = self.sources[idx].clone();
        let (record, resumed) = match approval::load(&mut self.store, &id).await? {
            Some(r) => (r, true),
            None => {
                let record = self.new_record(&id, &source, entry, message);
                let args: Vec<(&String, &String)> = record.fields.iter().collect();
                let created: i64 = redis::Script::new(approval::CREATE)
                    .key(keys::approval(&id))
                    .arg(args)
                    .invoke_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis("EVALSHA create approval", e))?;
                tracing::info!(approval = %id, stream = %source.key, entry = %entry.id, "entry parked for approval");
                (record, created == 0 || retry)
            }
        };
        if record.fields.contains_key("settled_at") {
            // Crashed between settling and acking: only the ack and delete remain.
            return self.finish(idx, &entry.id, &record, None).await;
        }
        let lost =
            record.fields.contains_key("notified") && self.notification_lost(&record).await?;
        if lost || !record.fields.contains_key("notified") {
            if let Err(why) = self.notify(&record, message, resumed && !lost).await? {
                let reason =
                    format!("the notify bridge's outbox refused the notification: {why}; not sent");
                let n = Notice {
                    status: "failed",
                    reason: &reason,
                    approval_id: Some(&id),
                    request_id: message.request_id.as_deref(),
                    ..Notice::default()
                };
                tracing::warn!(approval = %id, reason, "approval cannot be asked");
                self.notice(idx, &entry.id, Some(entry), n).await?;
                return self.finish(idx, &entry.id, &record, Some("failed")).await;
            }
        }
        self.track(id.clone(), idx, entry.id.clone(), record.expires_at());
        if record.state(crate::now_secs_f64()) != State::Pending {
            self.settle(id).await?;
        }
        Ok(())
    }

    fn new_record(&self, id: &str, source: &Source, entry: &Entry, message: &Message) -> Record {
        let now = crate::now_secs();
        let timeout = self.bridge.approval.timeout;
        let expires_at = if timeout == 0 { 0 } else { now + timeout };
        let mut fields = HashMap::new();
        let mut put = |k: &str, v: String| {
            fields.insert(k.to_string(), v);
        };
        put("status", "pending".into());
        put("source", self.name.clone());
        put("channel_id", message.channel_id.clone());
        put("subject", message.subject.clone().unwrap_or_default());
        put("reply_to", message.reply_to.clone().unwrap_or_default());
        put("content_preview", approval::preview(&message.content));
        put("created_at", now.to_string());
        put("expires_at", expires_at.to_string());
        put("stream", source.key.clone());
        put("entry_id", entry.id.clone());
        put("agent", source.agent.clone().unwrap_or_default());
        put("notify", self.config.notify_bridge(&self.name).to_string());
        put(
            "notify_channel",
            self.bridge.approval.notify_channel.clone(),
        );
        put(
            "content_sha256",
            approval::sha256_hex(message.content.as_bytes()),
        );
        put("message_sha256", message.sha256());
        put("content_bytes", message.content.len().to_string());
        put("request_id", message.request_id.clone().unwrap_or_default());
        // Unguessable and single-use: notify bridges build reply tokens from it
        // (an email's Message-ID), so knowing the approval id is not enough to answer.
        put("nonce", uuid::Uuid::new_v4().simple().to_string());
        let mut record = Record {
            id: id.to_string(),
            fields,
        };
        // Written with the record, before the notification exists: the notify side
        // shows only the entry with exactly this digest.
        let digest = notification_digest(&notification_fields(&record, &message.content));
        record.fields.insert("notify_sha256".into(), digest);
        record
    }

    /// Writes the notification for `record` once. When a previous attempt may have
    /// written it (`resumed`), the notify outbox is searched first. `Ok(Err(why))`:
    /// the notify stream refused the entry (a writer of that flat stream gave it an
    /// id no later entry can follow), so this approval cannot be asked.
    async fn notify(
        &mut self,
        record: &Record,
        message: &Message,
        resumed: bool,
    ) -> Result<std::result::Result<(), String>> {
        let stream = keys::outbox(record.get("notify"));
        let fields = notification_fields(record, &message.content);
        let digest = notification_digest(&fields);
        if digest != record.get("notify_sha256") {
            // A record parked by an older version: bind the notification now, before it exists.
            set_if_exists(&mut self.store, &record.id, &[("notify_sha256", &digest)]).await?;
        }
        if resumed {
            if let Some(found) = self.find_notification(&stream, record, &digest).await? {
                set_if_exists(&mut self.store, &record.id, &[("notified", &found)]).await?;
                return Ok(Ok(()));
            }
        }
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let notification = match self.store.xadd(&stream, &fields).await {
            Ok(id) => id,
            Err(Error::Redis(e)) if e.code() == Some("ERR") => return Ok(Err(e.to_string())),
            Err(e) => return Err(e),
        };
        set_if_exists(&mut self.store, &record.id, &[("notified", &notification)]).await?;
        Ok(Ok(()))
    }

    /// Whether the notification the record says was written is gone before the
    /// notify side took it (someone trimmed the flat notify outbox): then it must
    /// be written again, or nobody is ever asked.
    async fn notification_lost(&mut self, record: &Record) -> Result<bool> {
        if record.fields.contains_key("notify_entry")
            || record.fields.contains_key("notify_external_id")
        {
            return Ok(false);
        }
        let stream = keys::outbox(record.get("notify"));
        let found = self.store.entry(&stream, record.get("notified")).await?;
        if found.is_none() {
            tracing::warn!(approval = %record.id, stream, "the notification vanished before it was shown; writing it again");
        }
        Ok(found.is_none())
    }

    async fn find_notification(
        &mut self,
        stream: &str,
        record: &Record,
        digest: &str,
    ) -> Result<Option<String>> {
        // Stream ids are millisecond timestamps: start a minute before the record
        // was created to allow for clock skew between this host and Redis.
        let created: u64 = record.get("created_at").parse().unwrap_or(0);
        let mut start = format!("{}", created.saturating_sub(60) * 1000);
        loop {
            let page = self.store.range(stream, &start, "+", 500).await?;
            for entry in &page {
                let theirs = || {
                    approval::fields_sha256(
                        entry
                            .fields
                            .iter()
                            .map(|(k, v)| (k.as_str(), Some(v.as_slice()))),
                    )
                };
                if entry.text("approval_id") == Some(record.id.as_str()) && theirs() == digest {
                    return Ok(Some(entry.id.clone()));
                }
            }
            match page.last() {
                Some(last) if page.len() == 500 => start = format!("({}", last.id),
                _ => return Ok(None),
            }
        }
    }

    fn track(&mut self, id: String, source: usize, entry_id: String, expires_at: u64) {
        if expires_at != 0 {
            self.deadlines.insert((expires_at, id.clone()));
        }
        self.parked.insert(
            id,
            Parked {
                source,
                entry_id,
                expires_at,
            },
        );
    }

    fn untrack(&mut self, id: &str) {
        if let Some(p) = self.parked.remove(id) {
            self.deadlines.remove(&(p.expires_at, id.to_string()));
        }
    }

    /// Settles every parked entry whose deadline has passed.
    async fn settle_due(&mut self) -> Result<()> {
        let now = crate::now_secs_f64();
        let due: Vec<String> = self
            .deadlines
            .iter()
            .take_while(|(t, _)| (*t as f64) <= now)
            .map(|(_, id)| id.clone())
            .collect();
        for id in due {
            self.settle(id).await?;
        }
        Ok(())
    }

    /// Re-reads every parked record in one pipelined round trip and settles the
    /// decided ones: the fallback for a decision whose wake-up was lost. Then
    /// settles as failed every parked entry that vanished from its stream: one
    /// `XRANGE - + COUNT 1` per stream finds its oldest entry, and an agent can
    /// only drop entries from the head (`XADD MAXLEN`).
    async fn sweep(&mut self) -> Result<()> {
        if self.parked.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = self.parked.keys().cloned().collect();
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET")
                .arg(keys::approval(id))
                .arg(&["status", "notified", "notify_entry"]);
        }
        let states: Vec<(Option<String>, Option<String>, Option<String>)> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("HMGET approval (sweep)", e))?;
        let mut unclaimed = Vec::new();
        for (id, (status, notified, claimed)) in ids.into_iter().zip(states) {
            if status.as_deref() != Some("pending") {
                self.settle(id).await?;
            } else if notified.is_some() && claimed.is_none() {
                unclaimed.push(id);
            }
        }
        for id in unclaimed {
            self.renotify_if_lost(&id).await?;
        }
        let mut vanished = Vec::new();
        for idx in 0..self.sources.len() {
            let mine: Vec<&Parked> = self.parked.values().filter(|p| p.source == idx).collect();
            if mine.is_empty() {
                continue;
            }
            let first = self
                .store
                .range(&self.sources[idx].key, "-", "+", 1)
                .await?;
            let oldest = first.first().and_then(|e| stream_id(&e.id));
            for p in mine {
                let gone = match (stream_id(&p.entry_id), oldest) {
                    (Some(mine), Some(oldest)) => mine < oldest,
                    (_, None) => true,
                    (None, _) => false,
                };
                if gone {
                    vanished.push((idx, p.entry_id.clone()));
                }
            }
        }
        for (idx, entry_id) in vanished {
            self.vanished(idx, &entry_id).await?;
        }
        Ok(())
    }

    /// Writes a parked record's notification again if it vanished unshown.
    async fn renotify_if_lost(&mut self, id: &str) -> Result<()> {
        let Some(parked) = self.parked.get(id).cloned() else {
            return Ok(());
        };
        let Some(record) = approval::load(&mut self.store, id).await? else {
            return Ok(());
        };
        if !self.notification_lost(&record).await? {
            return Ok(());
        }
        let key = self.sources[parked.source].key.clone();
        let Some(entry) = self.store.entry(&key, &parked.entry_id).await? else {
            return Ok(()); // the vanished-entry check settles it
        };
        match Message::from_entry(&entry, &self.bridge) {
            Ok(message) => {
                if let Err(why) = self.notify(&record, &message, false).await? {
                    tracing::warn!(approval = %id, why, "the notification cannot be written again");
                }
                Ok(())
            }
            Err(_) => Ok(()), // settled as failed when it is approved
        }
    }

    /// Acts on a parked entry's record: deliver on approved, notice on rejected or
    /// expired, nothing while pending.
    async fn settle(&mut self, id: String) -> Result<()> {
        let Some(parked) = self.parked.get(&id).cloned() else {
            return Ok(());
        };
        let idx = parked.source;
        let Some(record) = approval::load(&mut self.store, &id).await? else {
            let n = Notice {
                status: "failed",
                reason: "the approval record disappeared; not sent",
                approval_id: Some(&id),
                ..Notice::default()
            };
            self.notice(idx, &parked.entry_id, None, n).await?;
            return self
                .finish(
                    idx,
                    &parked.entry_id,
                    &Record {
                        id,
                        ..Record::default()
                    },
                    None,
                )
                .await;
        };
        if record.fields.contains_key("settled_at") {
            return self.finish(idx, &parked.entry_id, &record, None).await;
        }
        let state = record.state(crate::now_secs_f64());
        match state {
            State::Pending => Ok(()),
            State::Approved => self.deliver_approved(idx, &parked.entry_id, record).await,
            State::Rejected | State::Expired => {
                let timeout_reason = format!(
                    "no decision within {} seconds",
                    self.bridge.approval.timeout
                );
                let reason = match state {
                    State::Expired => timeout_reason.as_str(),
                    _ => record.get("reason"),
                };
                let request_id = record.get("request_id").to_string();
                let n = Notice {
                    status: state.as_str(),
                    reason,
                    approval_id: Some(&id),
                    approver: (state == State::Rejected).then(|| record.get("approver")),
                    request_id: Some(&request_id),
                    ..Notice::default()
                };
                self.notice(idx, &parked.entry_id, None, n).await?;
                tracing::info!(approval = %id, state = state.as_str(), "parked entry dropped");
                self.finish(idx, &parked.entry_id, &record, Some(state.as_str()))
                    .await
            }
        }
    }

    async fn deliver_approved(&mut self, idx: usize, entry_id: &str, record: Record) -> Result<()> {
        let key = self.sources[idx].key.clone();
        let id = record.id.clone();
        let Some(entry) = self.store.entry(&key, entry_id).await? else {
            let n = Notice {
                status: "failed",
                reason: "the entry was deleted from its stream before delivery",
                approval_id: Some(&id),
                ..Notice::default()
            };
            self.notice(idx, entry_id, None, n).await?;
            return self.finish(idx, entry_id, &record, Some("failed")).await;
        };
        let checked = Message::from_entry(&entry, &self.bridge).and_then(|m| {
            let sha = m.sha256();
            if sha == record.get("message_sha256") {
                Ok(m)
            } else {
                Err(format!(
                    "message sha256 {sha} differs from the approved {}; not sent",
                    record.get("message_sha256")
                ))
            }
        });
        let message = match checked {
            Ok(m) => m,
            Err(reason) => {
                let n = Notice {
                    status: "failed",
                    reason: &reason,
                    approval_id: Some(&id),
                    ..Notice::default()
                };
                self.dead_letter_only(idx, &entry, &n).await?;
                self.notice(idx, entry_id, Some(&entry), n).await?;
                return self.finish(idx, entry_id, &record, Some("failed")).await;
            }
        };
        let retry = record.fields.contains_key("delivery_started");
        if !retry {
            set_if_exists(
                &mut self.store,
                &id,
                &[("delivery_started", &crate::now_secs().to_string())],
            )
            .await?;
        }
        let dkey = delivery_key(&key, entry_id);
        let out = Outgoing {
            message: &message,
            delivery_key: &dkey,
            retry,
            approval: None,
        };
        match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                tracing::info!(approval = %id, external_id, approver = record.get("approver"), "approved entry delivered");
                self.finish(idx, entry_id, &record, Some("approved")).await
            }
            Delivery::Failed(failed) => {
                let failed = failed.with_approval(&id);
                let n = failed.as_notice();
                self.dead_letter_only(idx, &entry, &n).await?;
                self.notice(idx, entry_id, Some(&entry), n).await?;
                self.finish(idx, entry_id, &record, Some("failed")).await
            }
            Delivery::Interrupted => Ok(()),
        }
    }

    /// Marks the record settled with its outcome, tells the notify bridge, acks the
    /// entry, and closes the record. Once a notification was written the notify
    /// side owns the rest: the record stays (with its TTL) until the outcome entry,
    /// which follows the notification in the same stream, has been shown and the
    /// notify side deletes it. Each step is recorded, so a crash repeats none.
    async fn finish(
        &mut self,
        idx: usize,
        entry_id: &str,
        record: &Record,
        outcome: Option<&str>,
    ) -> Result<()> {
        let key = keys::approval(&record.id);
        let exists = !record.fields.is_empty();
        let handed_over = record.fields.contains_key("notified");
        let outcome = outcome
            .or(Some(record.get("outcome")).filter(|o| !o.is_empty()))
            .unwrap_or("failed");
        if exists && !record.fields.contains_key("settled_at") {
            let _: () = redis::pipe()
                .atomic()
                .cmd("HSET")
                .arg(&key)
                .arg("settled_at")
                .arg(crate::now_secs())
                .arg("outcome")
                .arg(outcome)
                .ignore()
                .expire(&key, SETTLED_TTL_SECS)
                .ignore()
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        }
        if handed_over && !record.fields.contains_key("outcome_sent") {
            let fields: Vec<(&str, &[u8])> = vec![
                ("approval_id", record.id.as_bytes()),
                ("approval_outcome", outcome.as_bytes()),
            ];
            match self
                .store
                .xadd(&keys::outbox(record.get("notify")), &fields)
                .await
            {
                Ok(_) => {
                    set_if_exists(&mut self.store, &record.id, &[("outcome_sent", "1")]).await?;
                }
                // A refusing stream (see `notify`) only costs the card its closing edit.
                Err(Error::Redis(e)) if e.code() == Some("ERR") => {
                    tracing::warn!(approval = %record.id, error = %e, "outcome not written");
                }
                Err(e) => return Err(e),
            }
        }
        self.ack(&self.sources[idx].key.clone(), entry_id).await?;
        let external = record.get("notify_external_id");
        let mut pipe = redis::pipe();
        if !external.is_empty() {
            pipe.hdel(keys::approval_map(record.get("notify")), external)
                .ignore();
        }
        if !handed_over && !record.id.is_empty() {
            pipe.del(&key).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        self.untrack(&record.id);
        Ok(())
    }

    async fn deliver_and_ack(
        &mut self,
        idx: usize,
        entry: &Entry,
        message: &Message,
        retry: bool,
    ) -> Result<()> {
        let stream = self.sources[idx].key.clone();
        let key = delivery_key(&stream, &entry.id);
        let mut retry = retry;
        if !S::DEDUPLICATES {
            retry = retry && self.in_flight(&key).await?;
            self.mark_in_flight(&key).await?;
        }
        let out = Outgoing {
            message,
            delivery_key: &key,
            retry,
            approval: None,
        };
        let result = match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                tracing::debug!(entry = %entry.id, external_id, "delivered");
                self.ack(&stream, &entry.id).await
            }
            Delivery::Failed(n) => self.dead_letter(idx, entry, n).await,
            Delivery::Interrupted => return Ok(()),
        };
        if !S::DEDUPLICATES {
            self.clear_in_flight(&key).await?;
        }
        result
    }

    async fn in_flight(&mut self, delivery_key: &str) -> Result<bool> {
        let key = keys::in_flight(&self.name);
        self.store
            .conn
            .hexists(&key, delivery_key)
            .await
            .map_err(|e| Error::from_redis(&format!("HEXISTS {key}"), e))
    }

    async fn mark_in_flight(&mut self, delivery_key: &str) -> Result<()> {
        let key = keys::in_flight(&self.name);
        let _: i64 = self
            .store
            .conn
            .hset(&key, delivery_key, crate::now_secs())
            .await
            .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        Ok(())
    }

    async fn clear_in_flight(&mut self, delivery_key: &str) -> Result<()> {
        let key = keys::in_flight(&self.name);
        let _: i64 = self
            .store
            .conn
            .hdel(&key, delivery_key)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
        Ok(())
    }

    /// Sends, waiting out transient failures with backoff until shutdown.
    async fn deliver(&mut self, out: Outgoing<'_>) -> Result<Delivery> {
        let mut attempt = 0u32;
        loop {
            match self.sender.send(out).await {
                Ok(id) => return Ok(Delivery::Sent(id)),
                Err(SendError::Transient(why)) => {
                    self.watchdog.tick();
                    attempt += 1;
                    tracing::warn!(attempt, error = %why, "send failed; retrying");
                    if !self.shutdown.sleep(backoff(attempt)).await {
                        return Ok(Delivery::Interrupted);
                    }
                    // `Transient` means not delivered, so `retry` stays as it was.
                }
                Err(SendError::Permanent(why)) => {
                    return Ok(Delivery::Failed(FailedNotice::new("failed", why)))
                }
                Err(SendError::Uncertain(why)) => {
                    return Ok(Delivery::Failed(FailedNotice::new(
                        "uncertain",
                        format!("delivery uncertain, not retried: {why}"),
                    )))
                }
            }
        }
    }

    /// Copies the entry to the dead letter, tells the agent, acks.
    async fn dead_letter(&mut self, idx: usize, entry: &Entry, n: impl AsNotice) -> Result<()> {
        let n = n.as_notice();
        tracing::warn!(stream = %self.sources[idx].key, entry = %entry.id, reason = n.reason, "entry refused");
        self.dead_letter_only(idx, entry, &n).await?;
        self.notice(idx, &entry.id, Some(entry), n).await?;
        self.ack(&self.sources[idx].key.clone(), &entry.id).await
    }

    async fn dead_letter_only(&mut self, idx: usize, entry: &Entry, n: &Notice<'_>) -> Result<()> {
        let source = &self.sources[idx];
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("reason", n.reason.as_bytes()),
            ("status", n.status.as_bytes()),
            ("stream", source.key.as_bytes()),
            ("entry_id", entry.id.as_bytes()),
        ];
        // Original fields are kept under a prefix so they cannot shadow ours; a
        // huge entry is copied in part (it is still in its own stream), so a
        // writer cannot make the dead letter cost a multiple of what it wrote.
        let cap = self.bridge.max_content_bytes.max(64 * 1024);
        let mut prefixed: Vec<(String, Vec<u8>)> = Vec::new();
        for (k, v) in entry.fields.iter().take(DEAD_FIELDS_KEPT) {
            let name: String = k.chars().take(200).collect();
            if v.len() > cap {
                prefixed.push((
                    format!("truncated:{name}"),
                    v.len().to_string().into_bytes(),
                ));
            }
            prefixed.push((format!("field:{name}"), v[..v.len().min(cap)].to_vec()));
        }
        if entry.fields.len() > DEAD_FIELDS_KEPT {
            let dropped = (entry.fields.len() - DEAD_FIELDS_KEPT).to_string();
            prefixed.push(("fields_dropped".into(), dropped.into_bytes()));
        }
        fields.extend(prefixed.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        self.store.xadd(&keys::dead(&self.name), &fields).await?;
        Ok(())
    }

    /// Writes a notice on the inbox that answers the entry's stream.
    async fn notice(
        &mut self,
        idx: usize,
        entry_id: &str,
        entry: Option<&Entry>,
        mut n: Notice<'_>,
    ) -> Result<()> {
        let source = self.sources[idx].clone();
        n.stream = &source.key;
        n.entry_id = entry_id;
        if n.request_id.is_none() {
            n.request_id = entry.and_then(|e| e.text("request_id"));
        }
        let inbox = keys::inbox_for(source.agent.as_deref(), &self.name);
        self.store.xadd(&inbox, &n.fields()).await?;
        Ok(())
    }

    async fn ack(&mut self, stream: &str, id: &str) -> Result<()> {
        let group = self.group.clone();
        self.store.ack(stream, &group, &[id]).await
    }
}

/// Timers of the main loop.
struct LoopState {
    last_sweep: Instant,
    last_beat: Option<Instant>,
}

/// The outcome of a send after retries.
enum Delivery {
    Sent(String),
    Failed(FailedNotice),
    /// Shutdown came during a retry wait: leave the entry pending.
    Interrupted,
}

/// An owned notice for a failed delivery.
struct FailedNotice {
    status: &'static str,
    reason: String,
    approval_id: Option<String>,
}

impl FailedNotice {
    fn new(status: &'static str, reason: impl Into<String>) -> Self {
        FailedNotice {
            status,
            reason: reason.into(),
            approval_id: None,
        }
    }

    fn with_approval(mut self, id: &str) -> Self {
        self.approval_id = Some(id.to_string());
        self
    }
}

trait AsNotice {
    fn as_notice(&self) -> Notice<'_>;
}

impl AsNotice for Notice<'_> {
    fn as_notice(&self) -> Notice<'_> {
        self.clone()
    }
}

impl AsNotice for FailedNotice {
    fn as_notice(&self) -> Notice<'_> {
        Notice {
            status: self.status,
            reason: &self.reason,
            approval_id: self.approval_id.as_deref(),
            ..Notice::default()
        }
    }
}

/// The notification entry for a parked record, in the order it is written: the
/// approval id, the destination from the record, the plain-text frame (for
/// platforms that show text as is) and the exact content (for those that lay out
/// their own card). Deterministic, so a resumed park writes the same entry.
fn notification_fields(record: &Record, content: &str) -> Vec<(&'static str, Vec<u8>)> {
    let frame = approval::render_notification(record, content, approval::REACT_HINT, None);
    vec![
        ("approval_id", record.id.clone().into_bytes()),
        (
            "channel_id",
            record.get("notify_channel").as_bytes().to_vec(),
        ),
        ("content", frame.into_bytes()),
        ("approval_content", content.as_bytes().to_vec()),
    ]
}

fn notification_digest(fields: &[(&'static str, Vec<u8>)]) -> String {
    approval::fields_sha256(fields.iter().map(|(k, v)| (*k, Some(v.as_slice()))))
}

/// A stream entry id as (milliseconds, sequence), for ordering.
fn stream_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The stable identity of one stream entry, for senders that deduplicate.
pub fn delivery_key(stream: &str, entry_id: &str) -> String {
    format!("{stream}/{entry_id}")
}

/// Sets record fields unless the record is gone; returns whether it existed.
async fn set_if_exists(store: &mut Store, id: &str, fields: &[(&str, &str)]) -> Result<bool> {
    let key = keys::approval(id);
    let set: i64 = redis::Script::new(approval::SET_IF_EXISTS)
        .key(&key)
        .arg(fields)
        .invoke_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("EVALSHA set {key}"), e))?;
    Ok(set == 1)
}

/// Exponential backoff from 200 ms, capped at 30 s.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64 << attempt.min(8));
    Duration::from_millis(ms.min(30_000))
}
