//! How often the services' loops do their periodic work, passed in with
//! their launch so tests can shorten it.
//!
//! Invariant: these are cadences only. Nothing that decides an outcome
//! (deadlines, expiry, the age of an answer) reads them: that is the
//! [`crate::clock::Clock`]'s job, and tests inject one too.

use std::time::Duration;

/// How often a service refreshes its heartbeat (its time to live is three times this).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// The loops' intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Heartbeat refresh.
    pub heartbeat_every: Duration,
    /// How often the outbox re-reads a slice of its parked records (in case a
    /// wake-up was lost) and looks for parked entries that vanished.
    pub sweep_every: Duration,
    /// How often the outbox trims handled history.
    pub retain_every: Duration,
    /// How long the gate of a run of sends stands for the sends after its
    /// first (see `outbox::deliver`): a bound on what a paused worker may
    /// still begin, not a cadence; tests set it to nothing to see a run
    /// that always goes stale still deliver.
    pub run_fresh: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat_every: HEARTBEAT_EVERY,
            sweep_every: Duration::from_secs(30),
            retain_every: Duration::from_secs(300),
            run_fresh: Duration::from_millis(200),
        }
    }
}
