//! What an outbox worker has scheduled: sends waiting for their retry time,
//! sends queued behind an earlier one to the same destination, sends waiting
//! for room beside the others, and the attempts each delivery has had.
//!
//! Pure: no Redis, no tasks; time is passed in (tokio's, so tests pause it).
//!
//! Invariants:
//! - A delivery key is scheduled at most once ([`Scheduler::is_scheduled`]):
//!   deferred, queued behind its destination, or (approved entries and
//!   cards, and plain sends that waited behind their destination) under way.
//!   Whoever reads it again while it is scheduled leaves it alone. A plain
//!   send started at once is not scheduled: every path that reads a worker's
//!   entries again waits for its sends first.
//! - One current delivery per destination while later ones queue behind it
//!   ([`Scheduler::hold`], [`Scheduler::release`]), or one run of them
//!   handed out together ([`Scheduler::release_more`]); what a run did not
//!   attempt goes back to the head ([`Scheduler::requeue_front`]); queued
//!   cards take turns by requesting agent ([`Lanes`]).
//! - A deferred plain delivery keeps its destination held (later ones wait
//!   for it); a deferred approved entry or card does not.
//! - Forgetting is `Scheduler::default()`: nothing here outlives a lost
//!   connection's abandoned sends or a fence.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::deliver::{Flight, Job};
use super::fair::Lanes;
use crate::retry::RetryPolicy;

/// Where a scheduled delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for its retry time.
    Deferred,
    /// Queued behind another delivery to its destination.
    Queued,
    /// Under way: an approved entry's or a card's send, or a plain send
    /// that waited behind its destination.
    UnderWay,
}

#[derive(Default)]
pub(super) struct Scheduler {
    phase: HashMap<String, Phase>,
    /// Due time → (delivery key, job); the sequence number keeps equal times apart.
    deferred: BTreeMap<(Instant, u64), (String, Job)>,
    seq: u64,
    /// Destinations with a current delivery, and the jobs queued behind it:
    /// cards in their requester's lane, the rest in [`super::deliver::PLAIN_LANE`].
    destinations: HashMap<String, Lanes<(String, Job)>>,
    /// Delivery key → (failed attempts, time of the first failure).
    attempts: HashMap<String, (u32, Instant)>,
    /// Sends waiting for room beside the others, taking turns by lane.
    room: Lanes<Flight>,
}

impl Scheduler {
    /// Whether `key` is deferred, queued or under way (see [`Phase`]).
    pub fn is_scheduled(&self, key: &str) -> bool {
        self.phase.contains_key(key)
    }

    /// Whether `key`'s send is queued or under way (not waiting for its retry).
    pub fn is_sending(&self, key: &str) -> bool {
        matches!(self.phase.get(key), Some(Phase::Queued | Phase::UnderWay))
    }

    /// `key` is under way (an approved entry's or a card's send).
    pub fn begin(&mut self, key: String) {
        self.phase.insert(key, Phase::UnderWay);
    }

    /// `key` is no longer scheduled (its outcome is recorded, or it was fenced).
    pub fn end(&mut self, key: &str) {
        self.phase.remove(key);
    }

    /// Whether `channel` has a current delivery.
    pub fn is_busy(&self, channel: &str) -> bool {
        self.destinations.contains_key(channel)
    }

    /// Makes the delivery starting now `channel`'s current one.
    pub fn hold(&mut self, channel: &str) {
        if !self.destinations.contains_key(channel) {
            self.destinations
                .insert(channel.to_string(), Lanes::default());
        }
    }

    /// Queues `job` behind `channel`'s current delivery, in `lane`.
    pub fn queue_behind(&mut self, channel: &str, lane: &str, key: String, job: Job) {
        self.queue(channel, lane, key, job, false);
    }

    fn queue(&mut self, channel: &str, lane: &str, key: String, job: Job, front: bool) {
        self.phase.insert(key.clone(), Phase::Queued);
        self.hold(channel);
        let Some(queue) = self.destinations.get_mut(channel) else {
            return; // held just above
        };
        match front {
            true => queue.push_front(lane, (key, job)),
            false => queue.push(lane, (key, job)),
        }
    }

    /// Schedules an approved entry's or a card's send: returns it to start
    /// now, or `None` when it queued behind its destination (only when the
    /// sender `splits` messages, whose parts must not interleave).
    pub fn dispatch(&mut self, flight: Flight, splits: bool) -> Option<Flight> {
        if !splits {
            self.begin(flight.key.clone());
            return Some(flight);
        }
        let channel = flight.message.channel_id.clone();
        if self.is_busy(&channel) {
            let lane = flight.lane();
            let key = flight.key.clone();
            self.queue_behind(&channel, &lane, key, Job::Flight(Box::new(flight)));
            return None;
        }
        self.hold(&channel);
        self.begin(flight.key.clone());
        Some(flight)
    }

    /// The delivery to `channel` is over: returns the next one queued behind
    /// it (now the destination's current delivery), or frees the destination.
    pub fn release(&mut self, channel: &str) -> Option<(String, Job)> {
        let queue = self.destinations.get_mut(channel)?;
        match queue.pop() {
            Some((key, job)) => {
                match job {
                    Job::Flight(_) => self.phase.insert(key.clone(), Phase::UnderWay),
                    _ => self.phase.remove(&key),
                };
                Some((key, job))
            }
            None => {
                self.destinations.remove(channel);
                None
            }
        }
    }

    /// While `channel`'s current delivery is held: hands out the next job
    /// queued behind it too, if `fits` it (so sends queued behind one
    /// destination go on as one run), now under way with the current one.
    pub fn release_more(
        &mut self,
        channel: &str,
        fits: impl Fn(&Job) -> bool,
    ) -> Option<(String, Job)> {
        let queue = self.destinations.get_mut(channel)?;
        if !queue.peek().is_some_and(|(_, job)| fits(job)) {
            return None;
        }
        let (key, job) = queue.pop()?;
        self.phase.insert(key.clone(), Phase::UnderWay);
        Some((key, job))
    }

    /// Puts `job` back at the head of `channel`'s queue, in `lane`: handed
    /// out with a run and not started, it goes before everything queued.
    pub fn requeue_front(&mut self, channel: &str, lane: &str, key: String, job: Job) {
        self.queue(channel, lane, key, job, true);
    }

    /// Waits `job` until `due`.
    pub fn defer(&mut self, key: String, due: Instant, job: Job) {
        self.seq += 1;
        self.phase.insert(key.clone(), Phase::Deferred);
        self.deferred.insert((due, self.seq), (key, job));
    }

    /// The earliest deferred job due at `now`, no longer scheduled.
    pub fn pop_due(&mut self, now: Instant) -> Option<(String, Job)> {
        let first = *self.deferred.keys().next()?;
        if first.0 > now {
            return None;
        }
        let (key, job) = self.deferred.remove(&first)?;
        self.phase.remove(&key);
        Some((key, job))
    }

    /// The earliest retry time.
    pub fn next_due(&self) -> Option<Instant> {
        self.deferred.keys().next().map(|(t, _)| *t)
    }

    /// One more transient failure of `key` at `now`: how long to wait, or
    /// (attempts, time since the first failure) when the policy gives up.
    pub fn failed(
        &mut self,
        key: &str,
        now: Instant,
        policy: &RetryPolicy,
    ) -> Result<Duration, (u32, Duration)> {
        let a = self.attempts.entry(key.to_string()).or_insert((0, now));
        a.0 += 1;
        let (attempts, first) = *a;
        match policy.next(attempts, now - first) {
            Some(wait) => Ok(wait),
            None => {
                self.attempts.remove(key);
                Err((attempts, now - first))
            }
        }
    }

    /// `key` reached an end (sent, refused, uncertain): its attempts are forgotten.
    pub fn finished(&mut self, key: &str) {
        self.attempts.remove(key);
    }

    /// `flight` waits for room, in its lane.
    pub fn wait_for_room(&mut self, flight: Flight) {
        let lane = flight.lane();
        self.room.push(&lane, flight);
    }

    /// The next send to start when there is room.
    pub fn next_for_room(&mut self) -> Option<Flight> {
        self.room.pop()
    }

    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.phase.is_empty() && self.destinations.is_empty() && self.deferred.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::deliver::PLAIN_LANE;
    use super::*;

    fn job(n: usize) -> Job {
        Job::Approved {
            approval_id: format!("a{n}"),
        }
    }

    /// Under paused time nothing is due until the clock reaches it, and jobs
    /// come out in due order (equal times in the order they were deferred).
    #[tokio::test(start_paused = true)]
    async fn deferred_jobs_come_due_in_order_as_time_passes() {
        let mut s = Scheduler::default();
        let now = Instant::now();
        s.defer("k2".into(), now + Duration::from_secs(2), job(2));
        s.defer("k1".into(), now + Duration::from_secs(1), job(1));
        s.defer("k1b".into(), now + Duration::from_secs(1), job(3));
        assert!(s.is_scheduled("k2") && s.is_scheduled("k1"));
        assert!(!s.is_sending("k1"), "deferred is not being sent");
        assert_eq!(s.next_due(), Some(now + Duration::from_secs(1)));
        assert!(s.pop_due(Instant::now()).is_none());
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let due: Vec<String> = std::iter::from_fn(|| s.pop_due(Instant::now()))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(due, ["k1", "k1b"]);
        assert!(!s.is_scheduled("k1"), "popped is no longer scheduled");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(s.pop_due(Instant::now()).unwrap().0, "k2");
        assert_eq!(s.next_due(), None);
        assert!(s.is_idle());
    }

    /// A destination stays busy while it has a current delivery; releasing it
    /// hands out the queued ones in order, then frees it.
    #[test]
    fn a_destination_hands_out_its_queue_in_order() {
        let mut s = Scheduler::default();
        s.hold("ops");
        for n in 1..=2 {
            s.queue_behind("ops", PLAIN_LANE, format!("q{n}"), job(n));
        }
        assert!(
            s.is_scheduled("q1") && s.is_sending("q1"),
            "queued counts as sending"
        );
        assert_eq!(s.release("ops").unwrap().0, "q1");
        assert!(s.is_busy("ops"), "q1 is now current");
        assert_eq!(s.release("ops").unwrap().0, "q2");
        assert!(s.release("ops").is_none());
        assert!(!s.is_busy("ops"), "free again");
        assert!(s.is_idle());
    }

    /// A run takes what fits from the head of the queue and stops at the
    /// first that does not; what it puts back goes first again.
    #[test]
    fn a_run_takes_the_head_of_the_queue_and_puts_back_in_front() {
        let mut s = Scheduler::default();
        s.hold("ops");
        for n in 1..=4 {
            s.queue_behind("ops", PLAIN_LANE, format!("q{n}"), job(n));
        }
        let fits = |j: &Job| matches!(j, Job::Approved { approval_id } if approval_id != "a4");
        let run: Vec<String> = std::iter::from_fn(|| s.release_more("ops", fits))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            run,
            ["q1", "q2", "q3"],
            "stops at the first that does not fit"
        );
        assert!(s.is_sending("q2"), "handed out: under way");
        s.requeue_front("ops", PLAIN_LANE, "q3".into(), job(3));
        s.requeue_front("ops", PLAIN_LANE, "q2".into(), job(2));
        let order: Vec<String> = std::iter::from_fn(|| s.release("ops"))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(order, ["q2", "q3", "q4"]);
        assert!(!s.is_busy("ops"));
    }

    /// Attempts count per delivery until the policy gives up, and the time
    /// counted is tokio's, so paused time decides it.
    #[tokio::test(start_paused = true)]
    async fn failures_back_off_until_the_policy_gives_up() {
        let mut s = Scheduler::default();
        let policy = RetryPolicy {
            max_attempts: 3,
            max_retry: Duration::from_secs(60),
        };
        assert_eq!(
            s.failed("k", Instant::now(), &policy),
            Ok(Duration::from_millis(400))
        );
        assert_eq!(
            s.failed("k", Instant::now(), &policy),
            Ok(Duration::from_millis(800))
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            s.failed("k", Instant::now(), &policy),
            Err((3, Duration::from_secs(5)))
        );
        assert_eq!(
            s.failed("k", Instant::now(), &policy),
            Ok(Duration::from_millis(400)),
            "given up: counted afresh"
        );
        s.finished("k");
        tokio::time::advance(Duration::from_secs(120)).await;
        assert_eq!(
            s.failed("k", Instant::now(), &policy),
            Ok(Duration::from_millis(400)),
            "a finished delivery starts over"
        );
    }
}
