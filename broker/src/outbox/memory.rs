//! Everything an outbox worker remembers between steps, in one owner, so
//! forgetting is one assignment that cannot miss a field.
//!
//! Invariants:
//! - What is here is a cache of Redis (pending lists, records, marks): losing
//!   it loses nothing, and the recovery that follows every forget rebuilds it.
//!   One exception, informational only: `told`, the `delivered` notices of
//!   the acks to come; forgotten with them, the agent may not hear of those
//!   deliveries (they were made; `status` then stays `awaiting` or `queued`
//!   until the trail is asked). And `recovering.woken`, the wake-ups a
//!   recovery acked for entries it had not reached: kept through a forget
//!   for the recovery that follows, since Redis no longer holds them.
//! - Forgetting is all or nothing ([`Memory::forget`]): the scheduler and the
//!   parked index in particular never go apart (a parked entry whose send was
//!   abandoned must be tracked afresh, or only the slow sweep repairs it).
//!   Sends are aborted and waited for first, so none passes its gate after.
//! - A recovery starts from a clean batch ([`Memory::forget_batch`]) but keeps
//!   sends, retries and parked entries: a reconnect after a clean drain must
//!   neither restart back-offs nor send a deferred entry early.
//! - Kept outside: the configuration, the connection, the id key and the
//!   worker's lease (a lost connection must not give up the lease; a fence
//!   takes a new one itself).

use std::collections::HashMap;
use tokio::time::Instant;

use crate::approval::{repo::Claim, Record};
use crate::store::Entry;

use super::parked::ParkedIndex;
use super::schedule::Scheduler;
use super::source::SourceId;
use super::{deliver::Landed, surface, NewPark};

#[derive(Default)]
pub(super) struct Memory {
    /// The parked entries known, their deadlines and the sweep ([`super::parked`]).
    pub parked: ParkedIndex,
    /// Deliveries deferred, queued behind their destination or waiting for
    /// room, and their attempts ([`super::schedule`]).
    pub sched: Scheduler,
    /// Sends under way side by side (at most `max_in_flight`).
    pub flights: tokio::task::JoinSet<Landed>,
    /// Sends of the batch waiting for their in-flight marks, taken together
    /// after it ([`super::inflight::Unmarked`]); a resumed one's destination
    /// is held for it already.
    pub to_mark: Vec<super::inflight::Unmarked>,
    /// Fresh entries of the batch being read, parked together after it.
    pub to_park: Vec<NewPark>,
    /// Claims of the batch's notifications, made together before it is
    /// handled: entry id → the claim.
    pub claims: HashMap<String, Claim>,
    /// Records of a recovery page, read together (and put in the pending
    /// index), each with only the fields recovery reads
    /// (`OutboxService::recovery_fields`): never written back or shown.
    pub prefetched: HashMap<String, Option<Record>>,
    /// What a recovery under way knows ([`Recovering`]); after one that
    /// failed, its notes for the next (through a forget too); `None` once
    /// one completed.
    pub recovering: Option<Recovering>,
    /// Outcome entries waiting for their card's send to end: notification
    /// delivery key → (source, outcome entry).
    pub outcomes_waiting: HashMap<String, (SourceId, Entry)>,
    /// Notifications shown, recorded together (`flush_shown_due`).
    pub shown: Vec<surface::Shown>,
    /// When the oldest of `shown` was shown.
    pub shown_since: Option<Instant>,
    /// Delivered this batch, to ack together: (stream, entry id, delivery
    /// key); a wake-up that needed no read has an empty delivery key.
    pub acks: Vec<(String, String, String)>,
    /// When the oldest of `acks` was delivered.
    pub acks_since: Option<Instant>,
    /// Progress notices of `acks` (`delivered`), written just before them.
    pub told: Vec<super::deliver::Told>,
    /// Cards redrawn for a snooze or an escalation step, and the count of
    /// both each showed: a `snoozed` or `escalated` entry (which anyone who
    /// writes the flat outbox can repeat) redraws a card once per change,
    /// never more. Bounded: cleared when full.
    pub redrawn: HashMap<String, u32>,
    /// Approvals whose approvers this notify side reminded (once each, the
    /// same way). Bounded: cleared when full.
    pub reminded: std::collections::HashSet<String>,
    /// The runs' marks this worker wrote and has not removed yet
    /// ([`super::inflight::RunMarks`]).
    pub runs: super::inflight::RunMarks,
    /// How many sends the next run gates together (see `deliver.rs`,
    /// `size_runs`); 0 before the first run.
    pub run_len: usize,
    /// The digest period this worker last looked at (see `digest.rs`).
    pub digest_period: Option<u64>,
}

/// What a recovery under way knows beside its pages (`super::recovery`).
#[derive(Default)]
pub(super) struct Recovering {
    /// Approvals tracked when it began (a reconnect keeps what the worker
    /// knew): their entries are skipped, and their records not read ahead,
    /// since a decision served between pages may settle and ack one before
    /// its page is handled.
    pub known: std::sync::Arc<std::collections::HashSet<String>>,
    /// Approvals a wake-up named before their entry was reached (their
    /// records read ahead may be older than it), and whether it announced a
    /// change still to come.
    pub woken: HashMap<String, bool>,
}

impl Memory {
    /// Forgets everything, after abandoning every send (waited for, so none
    /// is still running when this returns).
    pub async fn forget(&mut self) {
        self.flights.abort_all();
        while self.flights.join_next().await.is_some() {}
        let woken = self.recovering.take().map(|r| r.woken);
        *self = Memory::default();
        self.recovering = woken.map(|woken| Recovering {
            woken,
            ..Default::default()
        });
    }

    /// Forgets the batch being read (a recovery starts afresh from Redis).
    /// Sends waiting for their marks are kept (a resumed one holds its
    /// destination): a drain or the next step starts them.
    pub fn forget_batch(&mut self) {
        self.to_park.clear();
        self.claims.clear();
        self.prefetched.clear();
    }
}
