//! `[bridges.NAME]` settings of a console bridge (beside the common keys).

use std::path::PathBuf;

use serde::Deserialize;

/// The console bridge's own keys; any other key fails the start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSettings {
    /// JSON-lines file every delivered message is appended to.
    pub output: PathBuf,
    /// JSON-lines file the ingest follows for messages and reactions.
    pub input: PathBuf,
    /// Milliseconds each delivery waits before writing, standing in for a
    /// platform's round trip (benchmarks and tests of deliveries side by side).
    #[serde(default)]
    pub latency_ms: u64,
    /// Milliseconds each delivery waits after writing, standing in for a
    /// platform's reply on its way back (the message is delivered, the sender
    /// does not know it yet: tests of takeovers while replies are under way).
    #[serde(default)]
    pub reply_latency_ms: u64,
    /// The first this many deliveries of each outbox process are not written
    /// and end as if the platform's reply had been lost (`uncertain`): a stand-in
    /// for a timed-out platform, for tests and for trying `cowboy deliveries`.
    #[serde(default)]
    pub lose_replies: u64,
}
