//! What a bridge crate provides, and the one runner every bridge binary shares.
//!
//! A bridge is its settings, its [`Sender`] (the contract below: [`Outgoing`]
//! in, [`Sent`] or [`SendError`] out, [`CardUpdate`] for a card), its ingest
//! and (optionally) a liveness probe: [`Bridge`]. Everything else (connections, groups, parking,
//! pings, heartbeats) is the broker's, and nothing in `broker` names a bridge
//! type. A binary's `main` is one line: `service::main::<MyBridge>(Service::Outbox)`.
//!
//! Invariant: settings (and the secrets they name) are read and validated before
//! Redis is contacted, so a bad config fails at start-up naming its key.

use std::future::Future;
use std::sync::Arc;

use crate::approval::Record;
use crate::clock::Clock;
use crate::config::BridgeConfig;
use crate::config::{Config, Service};
use crate::entry::{Message, NoticeStatus};
use crate::error::{ConfigError, Result};
use crate::ingest::Ingest;
use crate::keys;
use crate::outbox::OutboxService;
use crate::ping::{PingService, Probe};
use crate::shutdown::Shutdown;
use crate::store::Entry;
use crate::store::Store;
use crate::timing::Timing;

/// One bridge type: what talks to its platform.
pub trait Bridge: Sized + Send + Sync + 'static {
    /// The `type` of the `[bridges.NAME]` tables this crate serves.
    const TYPE: &'static str;
    /// Delivers for the outbox service.
    type Sender: Sender;

    /// Reads and validates the settings of bridge `name` (and the secrets they
    /// name); an error names the offending key.
    fn load(config: &Config, name: &str) -> Result<Self>;

    /// The sender of the outbox service.
    fn sender(&self, name: &str) -> Result<Self::Sender>;

    /// Runs the ingest until shutdown: platform events into `ingest`.
    fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> impl Future<Output = Result<()>> + Send;

    /// A platform check run with each ping heartbeat, if the platform has one.
    fn probe(&self, name: &str) -> Result<Option<Probe>> {
        let _ = name;
        Ok(None)
    }
}

// The contract between the outbox and a bridge's platform: what to deliver
// ([`Outgoing`]), how it went ([`Sent`], [`SendError`]), and how an approval
// ended, for its card ([`CardUpdate`]).

/// One message to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub message: &'a Message,
    /// Stable per stream entry: the same on every retry, unique across entries.
    pub delivery_key: &'a str,
    /// A previous attempt may have delivered it already (crash or lost reply).
    pub retry: bool,
    /// On an approval notification: the record it asks about, with the values
    /// that say what the message is and whose laid over from the
    /// notification (`approval::drawn_notification`): draw the card from this,
    /// never from a fresh read of the record.
    pub approval: Option<&'a Record>,
}

/// What a run of a declared action reported (effects bridges): passed on to
/// the agent in its notice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// `Done`, `Failed` or `TimedOut`.
    pub status: NoticeStatus,
    pub exit_code: Option<i32>,
    /// The last few KiB of what it printed.
    pub output: String,
    /// One line for people: what happened.
    pub reason: String,
}

/// A delivery made: the platform's id for it, and what it reported, if anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sent {
    pub external_id: String,
    pub report: Option<Report>,
}

impl From<String> for Sent {
    fn from(external_id: String) -> Sent {
        Sent {
            external_id,
            report: None,
        }
    }
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
    /// A declared action ran and did not succeed (`failed`, `timed_out`): dead
    /// letter, and the report goes to the agent. Never retried.
    #[error("{}", .0.reason)]
    Ran(Report),
    /// The platform refused the bridge's own credentials (a wrong or revoked
    /// token, a refused SMTP login): nothing can be sent until the config is
    /// fixed. Nothing was sent; the service stops with a configuration error
    /// (exit 78, not restarted) and the entry stays pending, so no message is
    /// dead-lettered for what is the deployment's fault, and the platform is
    /// not sent request after refused request (Discord bans an address that
    /// makes too many).
    #[error("credentials refused: {0}")]
    Credentials(String),
}

/// How an approval ended, for the notify bridge to show on its card.
#[derive(Debug, Clone, Copy)]
pub struct CardUpdate<'a> {
    /// `approved`, `rejected`, `expired`, `failed` or `uncertain`, as the
    /// record says; `superseded` for a card an edit replaced; `snoozed` for
    /// a live card whose deadline moved (redraw it, still answerable);
    /// `reminder` for a live card still waiting after `approval.remind_after`
    /// (remind its approvers, e.g. with a reply to it).
    pub outcome: &'a str,
    /// The notification's id on the platform.
    pub external_id: &'a str,
    /// Where the notification was sent.
    pub channel_id: &'a str,
    /// The record, checked against the outcome (settled with it, or snoozed,
    /// escalated, reminded as the outcome says); for a live card's redraw,
    /// with the values that say what the message is and whose laid over from
    /// its notification.
    pub record: &'a Record,
    /// For `snoozed`: the content the card shows (the notification's, as the
    /// requesting service wrote it), to draw the live card again.
    pub content: Option<&'a str>,
}

/// What a platform does for the outbox: deliver and name the result, and
/// optionally show an approval's outcome on its notification.
pub trait Sender: Send + Sync + 'static {
    /// Whether sending one delivery key twice is harmless because the sender or
    /// its platform drops the duplicate (a nonce, a search before writing). When
    /// false, the outbox marks each delivery in flight, and `retry` is set only
    /// when such a mark shows an earlier attempt may have reached the platform.
    const DEDUPLICATES: bool = true;

    /// Whether one delivery may be several platform messages (Discord splits
    /// long content). Then two deliveries to one destination never overlap, or
    /// their parts would interleave; plain entries keep stream order anyway.
    /// True unless the sender says otherwise: overlapping is the risk.
    const SPLITS: bool = true;

    /// Turns an agent's entry into what this bridge delivers, or the reason it
    /// is refused (dead letter and notice). Messages by default; a bridge whose
    /// entries are something else (a declared action) validates them here, and
    /// may add `context` for approvers. Called again before an approved entry
    /// is sent, and the result must bind to the same digest.
    fn request(
        &self,
        entry: &Entry,
        bridge: &BridgeConfig,
    ) -> impl Future<Output = std::result::Result<Message, String>> + Send {
        let parsed = Message::from_entry_with(entry, bridge, |raw| self.canonical_destination(raw));
        async move { parsed }
    }

    /// The destination as this platform will deliver to it, or why the sender
    /// would reinterpret it (and so refuses it): Discord ids as the one decimal
    /// spelling of a snowflake, email as the bare mailbox with its domain in
    /// lower case and no routing, quoting or look-alike characters. Every check
    /// (`destinations`, the approval channels) and the digest use this form.
    /// The default takes a destination as written.
    fn canonical_destination(&self, raw: &str) -> std::result::Result<String, String> {
        Ok(raw.to_string())
    }

    /// Delivers one message and returns its id on the platform (the external id).
    fn send(
        &self,
        out: Outgoing<'_>,
    ) -> impl Future<Output = std::result::Result<Sent, SendError>> + Send;

    /// Shows the outcome on the notification (e.g. edits the Discord card), so
    /// nobody answers a dead request. Cosmetic: failures are logged, not retried.
    fn update(
        &self,
        outcome: CardUpdate<'_>,
    ) -> impl Future<Output = std::result::Result<(), SendError>> + Send {
        let _ = outcome;
        async { Ok(()) }
    }

    /// Whether the platform already has this delivery, which another worker
    /// started and may still be completing: its external id when the sender
    /// can prove it, `None` when it cannot tell. Never sends. The default
    /// cannot tell, so such a delivery is reported `uncertain`.
    fn delivered_already(&self, out: Outgoing<'_>) -> impl Future<Output = Option<String>> + Send {
        let _ = out;
        async { None }
    }
}

/// What a service process was started with.
pub struct Launch {
    pub config: Arc<Config>,
    /// The `[bridges.NAME]` served.
    pub bridge: String,
    /// The outbox worker name (`--worker`); `None` is the default worker.
    pub worker: Option<String>,
    pub shutdown: Shutdown,
    /// What time it is, for every decision about time (deadlines, answers).
    pub clock: Clock,
    /// How often the loops do their periodic work.
    pub timing: Timing,
}

impl Launch {
    /// A launch on the wall clock with the default intervals.
    pub fn new(
        config: Arc<Config>,
        bridge: &str,
        worker: Option<String>,
        shutdown: Shutdown,
    ) -> Launch {
        Launch {
            config,
            bridge: bridge.to_string(),
            worker,
            shutdown,
            clock: Clock::system(),
            timing: Timing::default(),
        }
    }
}

/// How many times in a row an ingest that failed retriably (lost Redis, say)
/// is started again before its service exits (about 80 s of back-off).
const INGEST_RESTARTS: u32 = 20;

/// The longest wait between two starts: well under the watchdog's 30 s.
const INGEST_MOST_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long an ingest must have run for its next failure to count as a first.
const INGEST_STEADY: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs one service of a bridge of type `B` until shutdown.
pub async fn run<B: Bridge>(service: Service, launch: Launch) -> Result<()> {
    let Launch {
        config,
        bridge: name,
        worker,
        shutdown,
        clock,
        timing,
    } = launch;
    let bridge = B::load(&config, &name)?;
    if worker.is_some() && service != Service::Outbox {
        return Err(ConfigError::invalid("--worker", "only the outbox service has workers").into());
    }
    let store = Store::connect(&config.redis_for(&name, service)).await?;
    match service {
        Service::Outbox => {
            let sender = bridge.sender(&name)?;
            // The engine runs on its own shutdown, fired by the service's, or
            // by the task beside it that applies the operators' and the page's
            // decisions on a parking bridge's approvals (see `crate::request`)
            // when that stops for good: an outbox that delivers while ignoring
            // decisions would fail silently.
            let (trigger, engine) = Shutdown::new();
            let outbox = OutboxService::new(config.clone(), &name, sender, store.clone(), engine)?
                .with_worker(worker.as_deref())?
                .with_clock(clock)
                .with_timing(timing);
            let parks = config.bridge(&name)?.approval.required;
            let worker = worker.unwrap_or_else(|| keys::DEFAULT_WORKER.to_string());
            let beside = tokio::spawn(async move {
                let result = match parks {
                    true => {
                        let shutdown = shutdown.clone();
                        crate::request::serve(store, config, name, worker, shutdown, clock).await
                    }
                    false => Ok(()),
                };
                if result.is_ok() {
                    shutdown.wait().await;
                }
                trigger.fire();
                result
            });
            let result = outbox.run().await;
            // Stopped, or failed by itself: the task beside goes with it (a
            // request cut short stays pending and lapses unapplied).
            if !beside.is_finished() {
                beside.abort();
            }
            match beside.await {
                Ok(Err(e)) => Err(e),
                _ => result,
            }
        }
        Service::Ingest => {
            // Losing Redis (a restart, a failover) ends an ingest's loop with a
            // retriable error: it starts again here, as systemd would start
            // the process, on the master the store now follows. What it had
            // not saved its cursor past is read again, as after a restart.
            let mut bridge = Some(bridge);
            let mut failures = 0u32;
            loop {
                let this = match bridge.take() {
                    Some(b) => b,
                    None => B::load(&config, &name)?,
                };
                let ingest = Ingest::new(config.clone(), &name, store.clone())?
                    .with_clock(clock)
                    .with_timing(timing);
                let started = tokio::time::Instant::now();
                match this.ingest(ingest, shutdown.clone()).await {
                    Err(e) if e.is_retriable() && failures < INGEST_RESTARTS => {
                        // A run that lasted was not part of a row of failures.
                        if started.elapsed() > INGEST_STEADY {
                            failures = 0;
                        }
                        failures += 1;
                        tracing::warn!(bridge = %name, error = %e, failures, "the ingest failed retriably; starting it again");
                        // Alive, only waiting: the watchdog (30 s) must not
                        // kill what this loop is about to restart.
                        crate::systemd::notify("WATCHDOG=1");
                        let wait = crate::retry::backoff(failures).min(INGEST_MOST_WAIT);
                        if !shutdown.sleep(wait).await {
                            return Ok(());
                        }
                    }
                    other => return other,
                }
            }
        }
        Service::Ping => {
            let mut ping = PingService::new(config, &name, store, shutdown)?;
            if let Some(probe) = bridge.probe(&name)? {
                ping = ping.with_probe(probe);
            }
            ping.run().await
        }
    }
}
