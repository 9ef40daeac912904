//! `broker`: the Outbox Approval Protocol over Redis Streams.
//!
//! Agents write to outbox streams; a bridge's outbox service delivers each entry
//! through the bridge's [`bridge::Sender`], or first parks it behind an
//! `approval:{uuid}` record and asks a human through another bridge. Inbound
//! traffic and notices flow back into inbox streams. Everything a bridge shares
//! with the others (groups, parking, expiry, maps, notices, dead letters, pings,
//! liveness) lives here; a bridge crate only talks to its platform.
//!
//! # Layout
//!
//! - [`bridge`]: the [`bridge::Bridge`] trait a bridge crate implements, and its runner.
//! - [`acl`]: Redis ACL users rendered from the config, and the probes that check them.
//! - [`keys`]: the Redis key schema, the only place that formats key names.
//! - [`config`]: the deployment TOML, validated at start-up with keys named.
//! - [`store`]: connections and stream primitives.
//! - [`topology`]: where Redis is (a server, Sentinels, a cluster), and the connection that keeps reaching it.
//! - [`cluster`]: the connection to a Redis Cluster.
//! - [`blocking`]: connections for blocking group reads.
//! - [`gauges`]: the counts the operator's views read of each bridge.
//! - [`sessions`]: the approval page's login sessions.
//! - [`entry`]: outbox entry validation and notices to agents.
//! - [`identity`]: approver identities (`KIND:ID`) in one canonical form.
//! - [`fields`]: field names of the entries the broker writes besides the agent's.
//! - [`error`]: typed errors, whether to retry, and the one table of exit codes.
//! - [`audit`]: the audit trail of every approval, and its queries.
//! - [`deliveries`]: uncertain deliveries and their reconciliation by an operator.
//! - [`approval`]: records, lazy expiry, `resolve_approval`, notification text.
//! - [`outbox`]: the outbox service (park, notify, settle, deliver).
//! - [`ingest`]: what a bridge's ingest uses: inbox writes and answers.
//! - [`carried`]: what an ingest carried to the inbox, and its position per channel.
//! - [`text`]: text rules every chat surface shares (cutting long content, typed answers).
//! - [`ping`]: the inbox-side wake-up service and liveness.
//! - [`retry`]: back-off, and the retry policy of deliveries.
//! - [`request`]: decisions and edits asked by the operators and the page, applied by the outbox.
//! - [`cli`]: the operator commands behind `cowboy`.
//! - [`clock`]: the clock every decision about time reads (injectable for tests).
//! - [`timing`]: the loops' intervals (sweep, heartbeat, retention), passed in at launch.
//! - [`schema`]: the config schema as data (key names read from serde).
//! - [`service`]: what every binary shares: arguments, tracing, exit codes.
//! - [`systemd`]: readiness, watchdog and stopping notifications.
//! - [`alloc`]: handing freed memory back after recovery.
//! - [`shutdown`]: the shutdown signal passed into every loop.

pub mod acl;
pub mod alloc;
pub mod approval;
pub mod audit;
pub mod blocking;
pub mod bridge;
pub mod carried;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod deliveries;
pub mod entry;
pub mod error;
pub mod fields;
pub mod gauges;
pub mod identity;
pub mod ingest;
pub mod keys;
pub mod outbox;
pub mod ping;
pub mod request;
pub mod retry;
pub mod schema;
pub mod service;
pub mod sessions;
pub mod shutdown;
pub mod store;
pub mod systemd;
pub mod text;
pub mod timing;
pub mod topology;

pub use bridge::{CardUpdate, Outgoing, Report, SendError, Sender, Sent};
pub use clock::Clock;
pub use config::Config;
pub use error::{Error, Result};
pub use outbox::OutboxService;
pub use shutdown::Shutdown;
pub use store::Store;

/// Unix time in whole seconds, from the wall clock.
pub fn now_secs() -> u64 {
    Clock::system().now_secs()
}

/// Unix time in milliseconds, from the wall clock.
pub fn now_millis() -> u64 {
    Clock::system().now_millis()
}

/// Unix time in fractional seconds, from the wall clock.
pub fn now_secs_f64() -> f64 {
    Clock::system().now_secs_f64()
}
