//! The outbox service: reads a bridge's outbox streams, gates entries behind
//! approvals, delivers through a [`Sender`], and settles parked entries.
//!
//! Streams read, all through group `{bridge}-outbox` / consumer
//! `{bridge}-{worker}` in one blocking `XREADGROUP`: the flat `{bridge}:outbox`,
//! each configured agent's `{agent}:{bridge}:outbox`, and this worker's wake-up
//! stream (`{bridge}:decisions`, or `{bridge}:decisions:{worker}` for a named
//! worker), written by `resolve_approval` for the worker its record names.
//!
//! # Layout (each module states its invariants)
//!
//! - [`reader`]: the loop, recovery, and the dispatch of each entry.
//! - [`recovery`]: recovery's pages, read one ahead of their handling.
//! - [`memory`]: everything a worker remembers between steps, forgotten as one.
//! - [`parked`]: the parked entries known, their deadlines and the sweep's round robin.
//! - [`parking`]: records, notifications, expiry and the sweep.
//! - [`settle`]: acting on decisions and expiries, closing records.
//! - [`deliver`]: sending, dead letters, notices.
//! - [`schedule`]: deferred, queued and waiting sends, and their attempts.
//! - [`fair`]: sends waiting for room take turns by requesting agent.
//! - [`inflight`]: the marks and the gate that fence a send to one worker.
//! - [`surface`]: the notify side: notifications and outcomes shown to humans.
//! - [`source`]: the streams read, and the typed handle of each.
//! - [`incoming`]: what each entry read is (agent entry, card, outcome, decision).
//! - [`claim`]: taking over the entries of a dead worker of the same bridge.
//! - [`retention`]: trimming handled history from the streams.

mod claim;
mod deliver;
mod digest;
mod escalate;
mod fair;
mod incoming;
mod inflight;
mod memory;
mod parked;
mod parking;
mod reader;
mod recovery;
mod remind;
mod retention;
mod schedule;
mod settle;
mod source;
mod surface;

pub use crate::keys::delivery_key;
pub use crate::retry::RetryPolicy;
pub use inflight::marks_by_delivery;
#[doc(hidden)]
pub use inflight::scripts as inflight_scripts;

use crate::bridge::{CardUpdate, Outgoing, Report, SendError, Sender, Sent};
use deliver::{Delivery, Flight, Job, Landed, Purpose};
use incoming::Class;
use inflight::{Marking, Unmarked};
use memory::Memory;
use parked::RECHECK;
use source::{Kind, Source, SourceId, Sources};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use redis::AsyncCommands;

use crate::approval::{self, Approvals, IdKey, Record, State, Status};
use crate::audit;
use crate::clock::Clock;
use crate::config::{BridgeConfig, Config};
use crate::entry::{Message, Notice, NoticeStatus};
use crate::error::{Error, Result};
use crate::keys;
use crate::shutdown::Shutdown;
use crate::store::{Entry, Store, StreamBatch};
use crate::systemd::{self, Watchdog};

/// Watched parked records re-read per sweep (see [`parked`]).
const SWEEP_SLICE: usize = 64;
/// Parked records re-read per sweep whether watched or not: what catches a
/// change no wake-up announced (a forged write), slowly, for two commands a
/// sweep whatever the number parked.
const BLIND_SLICE: usize = 2;
use crate::timing::Timing;
/// Longest single block on the read, so shutdown and heartbeats stay timely.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// Consecutive Redis failures (with growing pauses, about five minutes in all)
/// before the service gives up and exits for its supervisor to restart it.
const MAX_FAILURES: u32 = 15;
/// Fields of a refused entry copied into its dead letter (the rest are counted).
const DEAD_FIELDS_KEPT: usize = 64;
/// Longest a delivered entry waits for its ack while other sends are under way.
const ACK_DELAY: Duration = Duration::from_millis(20);

/// A fresh entry waiting to be parked with its batch.
struct NewPark {
    source: SourceId,
    entry: Entry,
    message: Message,
    id: String,
}

/// A finished send: the flight and what the platform said.
type FlightResult = (Flight, std::result::Result<Sent, SendError>);
/// A send task as it ends (it may have panicked).
type Joined = std::result::Result<Landed, tokio::task::JoinError>;

/// The outbox service of one bridge.
pub struct OutboxService<S> {
    config: Arc<Config>,
    name: String,
    bridge: BridgeConfig,
    sender: Arc<S>,
    store: Store,
    group: String,
    /// This process's worker name (`--worker`), and its consumer in `group`.
    worker: String,
    consumer: String,
    sources: Sources,
    /// What the worker remembers between steps ([`memory`]).
    mem: Memory,
    /// The secret approval ids are derived with; loaded by [`Self::prepare`]
    /// when this bridge parks.
    id_key: Option<IdKey>,
    policy: RetryPolicy,
    /// This worker's lease and when it was taken ([`claim`]); `None` before `run`.
    lease: Option<(claim::Lease, Instant)>,
    /// What time it is, for every decision about time.
    clock: Clock,
    /// How often the periodic work is done.
    timing: Timing,
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
        let policy = RetryPolicy {
            max_attempts: bridge.max_attempts,
            max_retry: Duration::from_secs(bridge.max_retry_seconds),
        };
        let sources = Sources::new(&config, name);
        Ok(OutboxService {
            config,
            name: name.to_string(),
            bridge,
            sender: Arc::new(sender),
            store,
            group: keys::outbox_group(name),
            worker: keys::DEFAULT_WORKER.to_string(),
            consumer: keys::outbox_consumer(name, keys::DEFAULT_WORKER),
            sources,
            mem: Memory::default(),
            id_key: None,
            policy,
            lease: None,
            clock: Clock::system(),
            timing: Timing::default(),
            shutdown,
            watchdog: Watchdog::from_env(),
        })
    }

    /// Makes this process worker `worker` of the bridge (`None`: the default
    /// worker): its own consumer in the groups and its own wake-up stream.
    pub fn with_worker(mut self, worker: Option<&str>) -> Result<Self> {
        let worker = worker.unwrap_or(keys::DEFAULT_WORKER);
        if !keys::valid_worker(worker) {
            return Err(crate::error::ConfigError::invalid(
                "--worker",
                "must be 1 to 64 letters, digits, `-` or `_`",
            )
            .into());
        }
        self.worker = worker.to_string();
        self.consumer = keys::outbox_consumer(&self.name, worker);
        self.sources.set_worker(&self.name, worker);
        Ok(self)
    }

    /// Reads time from `clock` instead of the wall clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Does its periodic work at these intervals.
    pub fn with_timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Creates the consumer groups. Called by [`Self::run`]; public so a caller can
    /// report readiness once they exist.
    pub async fn prepare(&mut self) -> Result<()> {
        for source in self.sources.iter() {
            self.store.ensure_group(&source.key, &self.group).await?;
        }
        self.move_legacy_marks().await?;
        if self.bridge.approval.required && self.id_key.is_none() {
            self.id_key = Some(IdKey::load(&mut self.store, &self.name).await?);
            let agents: Vec<&str> = self.config.agent_names().collect();
            let dropped = Approvals::on(&mut self.store)
                .drop_untagged(&self.name, &agents)
                .await?;
            if dropped > 0 {
                tracing::warn!(bridge = %self.name, dropped, "approvals parked before ids carried the bridge's tag dropped from the pending indexes (their entries are asked again)");
            }
        }
        Ok(())
    }

    /// The sender's reading of an entry of `stream` (see [`Sender::request`]),
    /// after the broker's own fields are taken off: a re-send put back by
    /// `cowboy deliveries reconcile` says so to approvers when its seal
    /// verifies with this bridge's key, and is refused when it does not (an
    /// agent cannot claim to be a re-send). Every reading of an entry, at
    /// parking, re-notifying and sending, goes through here, so all agree.
    async fn requested(&self, stream: &str, entry: &Entry) -> std::result::Result<Message, String> {
        let of = entry.text(approval::RESEND_OF);
        let seal = entry.text(approval::RESEND_SEAL);
        if of.is_none() && seal.is_none() {
            return self.sender.request(entry, &self.bridge).await;
        }
        let rest = Entry {
            id: entry.id.clone(),
            fields: entry
                .fields
                .iter()
                .filter(|(k, _)| k != approval::RESEND_OF && k != approval::RESEND_SEAL)
                .cloned()
                .collect(),
        };
        let expected = match (&self.id_key, of) {
            (Some(key), Some(of)) if approval::is_id_of(of, &self.name) => Some(key.seal_resend(
                of,
                stream,
                rest.fields.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
            )),
            _ => None,
        };
        let genuine =
            matches!((&expected, seal), (Some(e), Some(s)) if approval::same_secret(e, s));
        if !genuine {
            return Err(format!(
                "fields `{}` and `{}` are the broker's (written by `cowboy deliveries reconcile`), and these do not verify",
                approval::RESEND_OF,
                approval::RESEND_SEAL
            ));
        }
        let mut message = self.sender.request(&rest, &self.bridge).await?;
        let note = format!(
            "This is a re-send of approval {}: an approver reconciled its delivery as not delivered.",
            of.unwrap_or_default()
        );
        message.context = Some(match message.context.take() {
            Some(c) => format!("{note}\n{c}"),
            None => note,
        });
        Ok(message)
    }

    /// An event of approval `id` for this bridge's audit trail, now.
    fn event(&self, kind: audit::Kind, id: &str) -> audit::Event {
        audit::Event::new(&self.name, kind, id, self.clock.now_secs_f64())
    }

    /// Appends events to the audit trail.
    async fn audit(&mut self, events: &[audit::Event]) -> Result<()> {
        audit::append(&mut self.store, &self.config, events).await
    }

    /// Audits that approval `id` ended without being sent, and why.
    async fn audit_failed(&mut self, id: &str, reason: &str, status: Option<&str>) -> Result<()> {
        let failed = self
            .event(audit::Kind::Failed, id)
            .with(audit::field::REASON, reason)
            .with_opt(audit::field::OUTCOME, status);
        self.audit(&[failed]).await
    }

    /// The `parked` event of a new record: who asked, for what, bound by which digest.
    fn parked_event(&self, r: &Record) -> audit::Event {
        self.event(audit::Kind::Parked, &r.id)
            .with_opt(audit::field::AGENT, r.agent())
            .with(audit::field::STREAM, &r.stream)
            .with(audit::field::ENTRY_ID, &r.entry_id)
            .with(audit::field::DESTINATION, &r.channel_id)
            .with(audit::field::DIGEST, &r.message_sha256)
            .with(audit::field::NOTIFY, &r.notify)
    }

    /// A send that may have gone out: kept for an operator to reconcile (never
    /// retried), and audited.
    async fn record_uncertain(
        &mut self,
        src: SourceId,
        entry: &Entry,
        message: &Message,
        approval_id: Option<&str>,
        reason: &str,
    ) -> Result<()> {
        let source = &self.sources[src];
        let u = crate::deliveries::Uncertain {
            id: delivery_key(&source.key, &entry.id),
            bridge: self.name.clone(),
            stream: source.key.clone(),
            entry_id: entry.id.clone(),
            agent: source.agent.clone(),
            approval_id: approval_id.map(str::to_string),
            destination: message.channel_id.clone(),
            digest: message.sha256(),
            reason: reason.to_string(),
            at: self.clock.now_secs_f64(),
            fields: entry
                .fields
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
            // What was being sent (an approver's edit included) is what is
            // put back, never silently the agent's first draft.
            sent: Some(crate::approval::edit::EditedMessage {
                channel_id: message.channel_id.clone(),
                subject: message.subject.clone(),
                content: message.content.clone(),
            }),
        };
        crate::deliveries::record(&mut self.store, &self.config, &u).await
    }
}

/// Whether an `XADD` failed because the stream can take no entry after its
/// last id (someone wrote the largest possible id), not for a passing reason.
fn refused_by_stream(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.to_string().contains(" ID")
}

/// Refuses a destination (in the sender's canonical form) where bridge
/// `name`'s approval requests are shown: agents may not post there. Also used
/// by `cowboy mcp` before it writes, so both refuse with these words.
pub fn not_an_approval_channel(
    config: &crate::config::Config,
    name: &str,
    destination: &str,
    canonical: impl Fn(&str) -> std::result::Result<String, String>,
) -> std::result::Result<(), String> {
    let shown_there = config.approval_channels(name).any(|c| {
        let c = canonical(c).unwrap_or_else(|_| c.to_string());
        same_destination(&c, destination)
    });
    match shown_there {
        true => Err(format!(
            "destination `{destination}` is where approval requests are shown; agents may not post there"
        )),
        false => Ok(()),
    }
}

/// Whether a destination names an approval channel: compared without case,
/// without an email display name (`Boss <boss@example.org>`) and without a
/// subaddress (`boss+x@example.org` reaches `boss@example.org` on most mail
/// systems).
pub fn same_destination(a: &str, b: &str) -> bool {
    let bare = |s: &str| {
        let s = s.trim();
        let inner = match (s.rfind('<'), s.rfind('>')) {
            (Some(i), Some(j)) if i < j => &s[i + 1..j],
            _ => s,
        };
        let inner = inner.trim().to_lowercase();
        match inner.rsplit_once('@') {
            Some((local, domain)) => {
                let mailbox = local.split('+').next().unwrap_or(local);
                format!("{mailbox}@{domain}")
            }
            None => inner,
        }
    };
    bare(a) == bare(b)
}

#[cfg(test)]
mod tests {
    use super::same_destination;

    #[test]
    fn an_approval_address_has_no_second_spelling() {
        for other in [
            "ops@example.org",
            "OPS@Example.org",
            "Ops <ops@example.org>",
            "ops+look-alike@example.org",
        ] {
            assert!(same_destination("ops@example.org", other), "{other}");
        }
        assert!(!same_destination("ops@example.org", "opsx@example.org"));
        assert!(same_destination("222222222222222222", "222222222222222222"));
    }
}
