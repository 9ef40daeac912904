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
//!   the record if absent; write the notification unless the record says it was
//!   written (after a crash in between, the notify outbox is searched for it
//!   first); remember the notification id in the record. No step spans two keys,
//!   so the protocol works unchanged on Redis Cluster.
//! - Settling marks the record `settled_at` (with a Redis TTL as a safety net)
//!   before acking, then deletes it: a crash in between neither repeats the
//!   outcome nor leaves a record behind forever.
//! - An approved entry is re-read from its stream and its sha256 compared with the
//!   record's before it is sent; a mismatch is refused.
//! - A send that started before a crash is retried only with `retry = true`, so
//!   the sender can deduplicate by `delivery_key` or report the delivery uncertain.
//! - Idle cost does not grow with the number of parked entries: the service
//!   blocks on one read, woken by new entries, by decisions, or by the next
//!   deadline kept in memory; a slow sweep (one pipelined round trip) catches a
//!   decision whose wake-up was lost.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::approval::{self, Record, State};
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
    /// `approved`, `rejected`, `expired` or `failed`.
    pub outcome: &'a str,
    /// The notification's id on the platform.
    pub external_id: &'a str,
    /// Where the notification was sent.
    pub channel_id: &'a str,
    /// The approval as it was (id, source, agent, channel_id, sha256, ...), and
    /// `approver` / `reason` when decided.
    pub record: &'a Record,
}

/// What a platform does for the outbox: deliver and name the result, and
/// optionally show an approval's outcome on its notification.
pub trait Sender: Send + Sync + 'static {
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
                Err(Error::Redis(e)) if e.code() == Some("NOGROUP") => {
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
            // Deleted from the stream while pending: nothing left to deliver.
            tracing::warn!(stream = %source.key, id, "pending entry no longer exists; acked");
            return self.ack(&source.key, &id).await;
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
        let approval_id = approval::id_for(&source.key, &entry.id);
        if retry && self.parked.contains_key(&approval_id) {
            return Ok(());
        }
        let message = match Message::from_entry(&entry, &self.bridge, false) {
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
        self.park(idx, &entry, &message, approval_id, retry).await
    }

    /// An entry carrying `approval_id` on the flat outbox: a notification only when
    /// that approval exists, is pending and names this bridge as `notify`.
    async fn handle_notification(&mut self, idx: usize, entry: &Entry, retry: bool) -> Result<()> {
        let id = entry.text("approval_id").unwrap_or_default().to_string();
        let record = if id.is_empty() {
            None
        } else {
            approval::load(&mut self.store, &id).await?
        };
        let refusal = match &record {
            None => Some(format!("approval `{id}` does not exist")),
            Some(r) if self.config.notify_bridge(r.source()) != self.name => Some(format!(
                "approval `{id}` does not notify through bridge `{}`",
                self.name
            )),
            Some(r) => match r.state(crate::now_secs_f64()) {
                State::Pending => None,
                other => Some(format!("approval `{id}` is {}", other.as_str())),
            },
        };
        let message = match refusal {
            None => Message::from_entry(entry, &self.bridge, true),
            Some(reason) => Err(reason),
        };
        let (record, message) = match (record, message) {
            (Some(r), Ok(m)) => (r, m),
            (_, Err(reason)) => {
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    approval_id: Some(&id),
                    ..Notice::default()
                };
                return self.dead_letter(idx, entry, n).await;
            }
            (None, Ok(_)) => unreachable!("a missing record is refused above"),
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
                set_if_exists(
                    &mut self.store,
                    &id,
                    &[("notify_external_id", &external_id)],
                )
                .await?;
                tracing::info!(approval = %id, external_id, "approval notification delivered");
                self.ack(&self.sources[idx].key.clone(), &entry.id).await
            }
            Delivery::Failed(n) => self.dead_letter(idx, entry, n.with_approval(&id)).await,
            Delivery::Interrupted => Ok(()),
        }
    }

    /// An outcome entry written by a requesting service when it settled an
    /// approval this bridge notified: show it on the notification, then ack.
    async fn handle_outcome(&mut self, idx: usize, entry: &Entry) -> Result<()> {
        let text = |k: &str| entry.text(k).unwrap_or("").to_string();
        let extra = [
            ("approver", "approval_approver"),
            ("reason", "approval_reason"),
        ];
        let fields: HashMap<String, String> = approval::SUMMARY_FIELDS
            .iter()
            .map(|(entry, field)| (*field, *entry))
            .chain(extra)
            .map(|(field, entry)| (field.to_string(), text(entry)))
            .collect();
        let record = Record {
            id: text("approval_id"),
            fields,
        };
        let (outcome, external_id, channel_id) = (
            text("approval_outcome"),
            text("approval_external_id"),
            text("channel_id"),
        );
        let update = Outcome {
            outcome: &outcome,
            external_id: &external_id,
            channel_id: &channel_id,
            record: &record,
        };
        if let Err(e) = self.sender.update(update).await {
            tracing::warn!(approval = %record.id, error = %e, "could not show the outcome on the notification");
        }
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
        if !record.fields.contains_key("notified") {
            self.notify(&record, message, resumed).await?;
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
        put("content_bytes", message.content.len().to_string());
        put("request_id", message.request_id.clone().unwrap_or_default());
        // Unguessable and single-use: notify bridges build reply tokens from it
        // (an email's Message-ID), so knowing the approval id is not enough to answer.
        put("nonce", uuid::Uuid::new_v4().simple().to_string());
        Record {
            id: id.to_string(),
            fields,
        }
    }

    /// Writes the notification for `record` once. When a previous attempt may have
    /// written it (`resumed`), the notify outbox is searched first.
    async fn notify(&mut self, record: &Record, message: &Message, resumed: bool) -> Result<()> {
        let stream = keys::outbox(self.config.notify_bridge(&self.name));
        if resumed {
            if let Some(found) = self.find_notification(&stream, record).await? {
                return set_if_exists(&mut self.store, &record.id, &[("notified", &found)]).await;
            }
        }
        let content =
            approval::render_notification(record, &message.content, approval::REACT_HINT, None);
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("approval_id", record.id.as_bytes()),
            ("channel_id", record.get("notify_channel").as_bytes()),
            ("content", content.as_bytes()),
            ("approval_content", message.content.as_bytes()),
        ];
        fields.extend(approval::summary(record));
        let notification = self.store.xadd(&stream, &fields).await?;
        set_if_exists(&mut self.store, &record.id, &[("notified", &notification)]).await
    }

    async fn find_notification(&mut self, stream: &str, record: &Record) -> Result<Option<String>> {
        // Stream ids are millisecond timestamps: start a minute before the record
        // was created to allow for clock skew between this host and Redis.
        let created: u64 = record.get("created_at").parse().unwrap_or(0);
        let mut start = format!("{}", created.saturating_sub(60) * 1000);
        loop {
            let page = self.store.range(stream, &start, "+", 500).await?;
            for entry in &page {
                if entry.text("approval_id") == Some(record.id.as_str()) {
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
    /// decided ones: the fallback for a decision whose wake-up was lost.
    async fn sweep(&mut self) -> Result<()> {
        if self.parked.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = self.parked.keys().cloned().collect();
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.hget(keys::approval(id), "status");
        }
        let statuses: Vec<Option<String>> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("HGET approval (sweep)", e))?;
        for (id, status) in ids.into_iter().zip(statuses) {
            if status.as_deref() != Some("pending") {
                self.settle(id).await?;
            }
        }
        Ok(())
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
        let checked = Message::from_entry(&entry, &self.bridge, false).and_then(|m| {
            let sha = approval::sha256_hex(m.content.as_bytes());
            if sha == record.get("content_sha256") {
                Ok(m)
            } else {
                Err(format!(
                    "content sha256 {sha} differs from the approved {}; not sent",
                    record.get("content_sha256")
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

    /// Marks the record settled, acks the entry, deletes the record and its map entry.
    async fn finish(
        &mut self,
        idx: usize,
        entry_id: &str,
        record: &Record,
        outcome: Option<&str>,
    ) -> Result<()> {
        let key = keys::approval(&record.id);
        let external = record.get("notify_external_id");
        if let (Some(outcome), false) = (outcome, external.is_empty()) {
            let mut fields: Vec<(&str, &[u8])> = vec![
                ("approval_id", record.id.as_bytes()),
                ("approval_outcome", outcome.as_bytes()),
                ("approval_external_id", external.as_bytes()),
                ("channel_id", record.get("notify_channel").as_bytes()),
                ("approval_approver", record.get("approver").as_bytes()),
                ("approval_reason", record.get("reason").as_bytes()),
            ];
            fields.extend(approval::summary(record));
            self.store
                .xadd(&keys::outbox(record.get("notify")), &fields)
                .await?;
        }
        if !record.id.is_empty() {
            let _: () = redis::pipe()
                .atomic()
                .hset(&key, "settled_at", crate::now_secs())
                .ignore()
                .expire(&key, SETTLED_TTL_SECS)
                .ignore()
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        }
        self.ack(&self.sources[idx].key.clone(), entry_id).await?;
        if !record.id.is_empty() {
            let mut pipe = redis::pipe();
            pipe.del(&key).ignore();
            let external = record.get("notify_external_id");
            if !external.is_empty() {
                pipe.hdel(keys::approval_map(record.get("notify")), external)
                    .ignore();
            }
            let _: () = pipe
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        }
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
        let key = delivery_key(&self.sources[idx].key, &entry.id);
        let out = Outgoing {
            message,
            delivery_key: &key,
            retry,
            approval: None,
        };
        match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                tracing::debug!(entry = %entry.id, external_id, "delivered");
                self.ack(&self.sources[idx].key.clone(), &entry.id).await
            }
            Delivery::Failed(n) => self.dead_letter(idx, entry, n).await,
            Delivery::Interrupted => Ok(()),
        }
    }

    /// Sends, waiting out transient failures with backoff until shutdown.
    async fn deliver(&mut self, mut out: Outgoing<'_>) -> Result<Delivery> {
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
                    // The failed attempt may have reached the platform.
                    out.retry = true;
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
        // Original fields are kept under a prefix so they cannot shadow ours.
        let prefixed: Vec<(String, &[u8])> = entry
            .fields
            .iter()
            .map(|(k, v)| (format!("field:{k}"), v.as_slice()))
            .collect();
        fields.extend(prefixed.iter().map(|(k, v)| (k.as_str(), *v)));
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

/// The stable identity of one stream entry, for senders that deduplicate.
pub fn delivery_key(stream: &str, entry_id: &str) -> String {
    format!("{stream}/{entry_id}")
}

async fn set_if_exists(store: &mut Store, id: &str, fields: &[(&str, &str)]) -> Result<()> {
    let key = keys::approval(id);
    let _: i64 = redis::Script::new(approval::SET_IF_EXISTS)
        .key(&key)
        .arg(fields)
        .invoke_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("EVALSHA set {key}"), e))?;
    Ok(())
}

/// Exponential backoff from 200 ms, capped at 30 s.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64 << attempt.min(8));
    Duration::from_millis(ms.min(30_000))
}
