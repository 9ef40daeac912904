//! Delivery through the [`Sender`], dead letters and notices.
//!
//! Invariants:
//! - A send that may have happened before a crash is retried only with `retry =
//!   true`, so the sender can deduplicate by `delivery_key` or report the delivery
//!   uncertain. Every delivery passes a gate on its mark in
//!   `{<stream>}:in-flight` right before the platform call (see
//!   [`super::inflight`]), so for senders that cannot deduplicate
//!   ([`Sender::DEDUPLICATES`]) `retry` is set exactly when an attempt may
//!   have reached the platform.
//! - `Transient` means "not delivered": retrying it never sets `retry`.
//! - A transient failure never stalls the loop: the entry stays pending and is
//!   deferred to a retry time ([`RetryPolicy`]) while the loop goes on reading,
//!   settling decisions and expiries and beating. After `max_attempts` attempts
//!   or `max_retry_seconds` it is dead-lettered with the last error.
//! - Order per destination: while a delivery to a `channel_id` waits for its
//!   retry, later entries for that destination queue behind it, in stream order.
//! - Each entry is scheduled once: a deferred or queued entry read again (after
//!   a reconnect, by the sweep, by a wake-up) is not started a second time.
//! - Sends run beside the reader loop, plain, approved and notifications alike
//!   ([`Purpose`]): their outcomes are recorded as they finish, and the plain
//!   sends finished by then are acked together, one `XACK` per stream; an
//!   email's in-flight mark is cleared only after its ack. An approved entry or
//!   a notification is marked scheduled while its send is under way, so a
//!   repeated wake-up, the sweep or a re-read never starts it twice.
//! - Order per destination is kept for plain entries (one send, or one run
//!   of sends made one after another, at a time per `channel_id`; a run
//!   stops at a send to be retried, and what it did not attempt goes back to
//!   the head of the queue). Approved entries go in the order they are
//!   decided, and notifications to one approval channel may be shown side by
//!   side. Those two hold their destination only where the sender splits
//!   messages, and only a send that holds a destination starts what waits
//!   behind it ([`OutboxService::end_dispatched`]).
//! - A dead letter copies the refused entry under `field:` names (huge entries in
//!   part), so its fields cannot shadow the broker's.

use super::inflight::{self, Gate};
use super::*;

impl<S: Sender> OutboxService<S> {
    /// Delivers an entry that needs no approval and acks it; on a transient
    /// failure it is deferred. `resumed`: called by the retry runner for a job it
    /// scheduled (so it is not queued behind itself).
    pub(super) async fn deliver_and_ack(
        &mut self,
        src: SourceId,
        entry: Entry,
        message: Message,
        retry: bool,
        resumed: bool,
    ) -> Result<()> {
        let key = delivery_key(&self.sources[src].key, &entry.id);
        if !resumed && self.mem.sched.is_scheduled(&key) {
            return Ok(()); // read again while it waits for its retry
        }
        if resumed {
            // Released to it, or its retry time came: it is its destination's
            // current delivery already.
            self.mem.sched.hold(&message.channel_id);
        }
        // Marked with the rest of the batch; then it starts, or waits behind
        // its destination's current delivery, marked already.
        let flight = Flight {
            source: src,
            entry,
            message,
            retry: retry && S::DEDUPLICATES,
            key,
            purpose: Purpose::Plain,
            gate: Gate::Mine(self.worker.clone()),
            fenced: false,
            unreplicated: false,
            skipped: false,
        };
        self.mem.to_mark.push(Unmarked {
            flight,
            marking: Marking::Plain { current: resumed },
            needs_mark: retry,
        });
        Ok(())
    }

    /// Starts an approved entry's or a notification's send, after any other
    /// delivery to its destination when the sender splits messages (two
    /// overlapping deliveries would interleave their parts). It stays scheduled
    /// until its outcome is recorded, so nothing starts it twice.
    pub(super) fn dispatch(&mut self, flight: Flight) {
        if let Some(flight) = self.mem.sched.dispatch(flight, S::SPLITS) {
            self.take_off(flight);
        }
    }

    /// The delivery to `channel` is over (or waits for a retry without holding
    /// it): starts what queued behind it.
    pub(super) async fn start_next(&mut self, channel: &str) -> Result<()> {
        match self.mem.sched.release(channel) {
            Some((
                _,
                Job::Plain {
                    source,
                    entry,
                    message,
                    retry,
                },
            )) => Box::pin(self.deliver_and_ack(source, entry, message, retry, true)).await,
            Some((_, Job::Flight(f))) => {
                self.take_off_run(channel, *f);
                Ok(())
            }
            // Retries wait for their time, never behind a destination.
            Some((_, Job::Approved { .. } | Job::Notification { .. })) | None => Ok(()),
        }
    }

    /// The end of an approved entry's or a card's send (started by
    /// [`Self::dispatch`], or by [`Self::launch_cards`] alone): it held its
    /// destination only where the sender splits messages, and only what
    /// holds a destination may start what waits behind it. Elsewhere a plain
    /// send may be current there, or waiting for its retry, with later ones
    /// queued behind it in order.
    pub(super) async fn end_dispatched(&mut self, channel: &str) -> Result<()> {
        match S::SPLITS {
            true => self.start_next(channel).await,
            false => Ok(()),
        }
    }

    /// Starts `first`, released to be `channel`'s current delivery, and with
    /// it the plain sends and cards from its stream queued right behind it, as one run
    /// gated in one step ([`Self::launch_run`]): only for a sender that can
    /// tell on a retry whether it sent (a run widens the time between the
    /// gate and a send, and a send cut off in between is a retry), and only
    /// when there is room for it now.
    fn take_off_run(&mut self, channel: &str, first: Flight) {
        if !(S::DEDUPLICATES && first.runs() && self.mem.flights.len() < self.bridge.max_in_flight)
        {
            return self.take_off(first);
        }
        let source = first.source;
        let mut run = vec![first];
        let fits = |j: &Job| matches!(j, Job::Flight(f) if f.runs() && f.source == source);
        while run.len() < self.run_len() {
            match self.mem.sched.release_more(channel, fits) {
                Some((_, Job::Flight(f))) => run.push(*f),
                _ => break,
            }
        }
        self.launch_run(run, true);
    }

    /// How many sends the next run gates together.
    fn run_len(&self) -> usize {
        match self.mem.run_len {
            0 => RUN_START,
            n => n.clamp(1, RUN_MAX),
        }
    }

    /// Starts a send now if there is room, or as soon as there is.
    pub(super) fn take_off(&mut self, flight: Flight) {
        if self.mem.flights.len() < self.bridge.max_in_flight {
            self.launch(flight);
        } else {
            self.mem.sched.wait_for_room(flight);
        }
    }

    /// Starts one send beside the others; its gate is passed inside the task,
    /// right before the platform call (see [`super::inflight`]).
    fn launch(&mut self, mut flight: Flight) {
        let sender = self.sender.clone();
        let mut conn = self.store.conn.clone();
        let holder = inflight::Holder {
            stream: self.sources[flight.source].key.clone(),
            group: self.group.clone(),
            consumer: self.consumer.clone(),
            entry_id: flight.entry.id.clone(),
        };
        let task = async move {
            let passed = match &flight.gate {
                Gate::Mine(worker) => inflight::pass(&mut conn, &holder, &flight.key, worker).await,
                Gate::Taken(_) | Gate::Repeat(_) => Ok(true),
            };
            match passed {
                Ok(true) => {
                    // The mark that makes a later attempt a retry must outlive
                    // a failover: no replica, no send (and no attempt spent).
                    if let Err(e) = conn.replicated("the send's gate mark").await {
                        flight.unreplicated = true;
                        return (flight, Err(SendError::Transient(e.to_string())));
                    }
                }
                Ok(false) => {
                    // Taken over while this worker was away: the taker sends.
                    flight.fenced = true;
                    let why = SendError::Transient("taken over by another worker".into());
                    return (flight, Err(why));
                }
                Err(e) => return (flight, Err(e)),
            }
            let approval = match &flight.purpose {
                Purpose::Notification { record, .. } => Some(&**record),
                _ => None,
            };
            let out = Outgoing {
                message: &flight.message,
                delivery_key: &flight.key,
                retry: flight.retry,
                approval,
            };
            let result = match &flight.gate {
                Gate::Taken(by) => match sender.delivered_already(out).await {
                    Some(external_id) => Ok(Sent::from(external_id)),
                    None => Err(SendError::Uncertain(format!(
                        "worker `{by}` had started this send ({}) when it was taken over, and may still complete it; not sent again",
                        flight.key
                    ))),
                },
                Gate::Mine(_) | Gate::Repeat(_) => sender.send(out).await,
            };
            (flight, result)
        };
        self.mem
            .flights
            .spawn(async move { Landed::One(Box::new(task.await)) });
    }

    /// Starts a run of plain sends or cards to one destination from one
    /// stream, in order, as one task: their gate is passed in one step, then the first
    /// is sent as a send alone would be, and each later one only while that
    /// gate is fresh (`Timing::run_fresh`). The run stops at a send to be
    /// tried again later (transient), at one its gate refused, or at a stale
    /// gate; what it did not attempt goes back to the head of the queue (or,
    /// for cards started beside their destination, `holds` false, starts
    /// again), taken out of the run's mark.
    fn launch_run(&mut self, mut run: Vec<Flight>, holds: bool) {
        let sender = self.sender.clone();
        let mut conn = self.store.conn.clone();
        let worker = self.worker.clone();
        let run_fresh = self.timing.run_fresh;
        let holder = inflight::Holder {
            stream: self.sources[run[0].source].key.clone(),
            group: self.group.clone(),
            consumer: self.consumer.clone(),
            entry_id: String::new(),
        };
        self.mem.flights.spawn(async move {
            use inflight::RunGate;
            // Read before the gate, on a clock that runs on while the process
            // is stopped: however long a pause after the gate, it counts.
            let gated = crate::clock::since_boot();
            let mark = inflight::run_mark(&worker);
            let ids: Vec<&str> = run.iter().map(|f| f.entry.id.as_str()).collect();
            let gate = inflight::pass_run(&mut conn, &holder, &mark, &ids, &worker).await;
            let gate = match gate {
                Ok(g) if g.len() != run.len() => Err(SendError::Transient(
                    "the run's gate answered for another number of sends".into(),
                )),
                gate => gate,
            };
            if gate.is_err() {
                // Redis may have passed it all the same, its answer lost:
                // nothing of the run is sent, so its mark must not say so.
                if let Err(e) = inflight::ungate(&mut conn, &holder.stream, &mark, &ids, &worker).await {
                    tracing::warn!(error = %e, "a run whose gate failed may keep its mark until the trim");
                }
            }
            drop(ids);
            // The first send that cannot go stops the run: a transient
            // failure (an attempt of its own, or not, as alone) holds its
            // destination for its retry; one another worker holds goes back
            // to be asked again. Everything after it waits, unattempted, so
            // order is kept either way.
            let mut stop: Option<(usize, SendError, bool)> = None;
            let gate = gate.unwrap_or_else(|e| {
                stop = Some((0, e, false));
                vec![RunGate::Refused; run.len()]
            });
            // Nothing is sent unless the first passed (a refused first stops
            // the run), so only then do the marks wait for replicas.
            if stop.is_none() && gate.first().is_some_and(|g| *g != RunGate::Refused) {
                if let Err(e) = conn.replicated("the run's gate marks").await {
                    stop = Some((0, SendError::Transient(e.to_string()), true));
                }
            }
            let mut results = Vec::with_capacity(run.len());
            let mut unattempted: Vec<String> = Vec::new();
            // The sends the run's mark lists that were attempted: theirs
            // goes with their outcomes.
            let mut listed: Vec<String> = Vec::new();
            let (mut stale, mut begun) = (false, false);
            for (i, (mut f, g)) in run.drain(..).zip(gate).enumerate() {
                // The first send goes whenever its gate passed, as a send
                // alone would; each later one only while the gate is fresh.
                let fresh = !begun || crate::clock::since_boot().saturating_sub(gated) < run_fresh;
                let result = match &stop {
                    Some((at, why, unreplicated)) if *at == i => {
                        // Passed, and listed: its mark goes with its outcome.
                        if g == RunGate::Passed {
                            listed.push(f.key.clone());
                        }
                        f.unreplicated = *unreplicated;
                        Err(why.clone())
                    }
                    None if g == RunGate::Refused => {
                        f.fenced = true;
                        stop = Some((usize::MAX, SendError::Transient(String::new()), false));
                        Err(SendError::Transient("taken over by another worker".into()))
                    }
                    Some(_) | None if g == RunGate::Refused || stop.is_some() || !fresh => {
                        if stop.is_none() {
                            stale = true;
                            stop = Some((usize::MAX, SendError::Transient(String::new()), false));
                        }
                        f.skipped = true;
                        if g == RunGate::Passed {
                            unattempted.push(f.entry.id.clone());
                        }
                        Err(SendError::Transient("not attempted".into()))
                    }
                    _ => {
                        begun = true;
                        if g == RunGate::Passed {
                            listed.push(f.key.clone());
                        }
                        let approval = match &f.purpose {
                            Purpose::Notification { record, .. } => Some(&**record),
                            _ => None,
                        };
                        let out = Outgoing {
                            message: &f.message,
                            delivery_key: &f.key,
                            retry: f.retry,
                            approval,
                        };
                        let result = sender.send(out).await;
                        if let Err(e @ (SendError::Transient(_) | SendError::Credentials(_))) =
                            &result
                        {
                            stop = Some((usize::MAX, e.clone(), false));
                        }
                        result
                    }
                };
                results.push((f, result));
            }
            let unattempted: Vec<&str> = unattempted.iter().map(String::as_str).collect();
            if let Err(e) =
                inflight::ungate(&mut conn, &holder.stream, &mark, &unattempted, &worker).await
            {
                // Left `writing:`: a taker would report them `uncertain`
                // rather than send them; this worker sends them as before.
                tracing::warn!(error = %e, "the unattempted sends of a run keep their marks");
            }
            if stale {
                tracing::debug!(
                    sent = results.iter().filter(|(f, _)| !f.skipped).count(),
                    "a run's gate went stale; the rest pass it again"
                );
            }
            let took = crate::clock::since_boot().saturating_sub(gated);
            Landed::Run {
                results,
                stale,
                took,
                holds,
                listed: (mark, listed),
            }
        });
    }

    /// Starts cards marked together, for a sender that neither splits
    /// messages (its cards never queue behind each other) nor needs every
    /// send gated alone: in runs of one stream and destination, each gated
    /// in one step ([`Self::launch_run`]), while there is room; a card alone,
    /// or past the room, goes as before.
    pub(super) fn launch_cards(&mut self, cards: Vec<Flight>) {
        let len = self.run_len();
        // Taking turns between the agents that asked, as cards waiting for
        // room do: one agent's flood does not fill the first runs.
        let mut turns = super::fair::Lanes::default();
        for f in cards {
            turns.push(&f.lane(), f);
        }
        let mut runs: Vec<Vec<Flight>> = Vec::new();
        while let Some(f) = turns.pop() {
            self.mem.sched.begin(f.key.clone());
            let joins = |r: &&mut Vec<Flight>| {
                r.len() < len
                    && r[0].source == f.source
                    && r[0].message.channel_id == f.message.channel_id
            };
            match runs.iter_mut().find(joins) {
                Some(run) => run.push(f),
                None => runs.push(vec![f]),
            }
        }
        for run in runs {
            if run.len() > 1 && self.mem.flights.len() < self.bridge.max_in_flight {
                self.launch_run(run, false);
            } else {
                for f in run {
                    self.take_off(f);
                }
            }
        }
    }

    /// Whether cards marked together go in runs ([`Self::launch_cards`]).
    pub(super) fn runs_cards(&self) -> bool {
        S::DEDUPLICATES && !S::SPLITS
    }

    /// Waits for every send in flight (and those waiting for room) and records
    /// each outcome. On an error the remaining sends are abandoned and the
    /// delivery state reset: their entries are still pending, and recovery
    /// handles them again as retries (deduplicated, or reported uncertain).
    pub(super) async fn drain(&mut self) -> Result<()> {
        let result = self.drain_all().await;
        if result.is_err() {
            // Parked entries whose sends were abandoned (or queued) are tracked
            // again by the recovery that follows every error, which settles the
            // decided ones at once instead of leaving them to the sweep.
            self.mem.forget().await;
        }
        result
    }

    /// Records the outcome of a finished send and of every other send finished by
    /// now, starts what waited for room, then records the shown cards and acks
    /// the delivered entries together when due ([`Self::flush_due`]).
    pub(super) async fn collect(&mut self, joined: Joined) -> Result<()> {
        let mut joined = Some(joined);
        while let Some(j) = joined.take().or_else(|| self.mem.flights.try_join_next()) {
            let landed = self.joined(j).await?;
            self.land(landed).await?;
        }
        self.launch_ready();
        self.flush_shown_due().await?;
        self.flush_acks_due().await
    }

    /// Ends the service with a configuration error when the platform refused
    /// the bridge's credentials: the flight's mark goes (nothing was sent, so
    /// the send after the fix is no retry) and its entry stays pending.
    async fn stop_if_refused(
        &mut self,
        flight: &Flight,
        result: &std::result::Result<Sent, SendError>,
    ) -> Result<()> {
        let Err(SendError::Credentials(why)) = result else {
            return Ok(());
        };
        self.clear_in_flight(&[&flight.key]).await?;
        // Nor did an approved entry's send start: after the fix it is a first
        // attempt, not a retry a sender that cannot deduplicate calls uncertain.
        if let Purpose::Approved { record } = &flight.purpose {
            Approvals::on(&mut self.store)
                .clear_delivery_started(&record.id)
                .await?;
        }
        Err(crate::error::ConfigError::invalid(
            format!("bridges.{}", self.name),
            format!("the platform refused this bridge's credentials ({why}); nothing was sent, and the entries wait until the config is fixed"),
        )
        .into())
    }

    /// Acks what was delivered once nothing is in flight, a batch's worth is
    /// waiting, or the oldest has waited [`ACK_DELAY`]: one `XACK` per stream
    /// for many entries, while a delivered entry stays pending only briefly (a
    /// crash before its ack sends it again with `retry`, which is deduplicated).
    pub(super) async fn flush_acks_due(&mut self) -> Result<()> {
        if self.flush_due(self.mem.acks.len(), self.mem.acks_since) {
            self.flush_acks().await?;
        }
        Ok(())
    }

    /// Whether what waits to be written together (`waiting` of it, the
    /// oldest since `since`) goes now: once nothing is in flight (no more
    /// will join it soon), a batch's worth waits, or the oldest has waited
    /// [`ACK_DELAY`].
    pub(super) fn flush_due(&self, waiting: usize, since: Option<Instant>) -> bool {
        self.mem.flights.is_empty()
            || waiting >= self.bridge.batch
            || since.is_some_and(|t| t.elapsed() >= ACK_DELAY)
    }

    /// Starts queued sends while there is room.
    fn launch_ready(&mut self) {
        while self.mem.flights.len() < self.bridge.max_in_flight {
            match self.mem.sched.next_for_room() {
                Some(f) => self.launch(f),
                None => break,
            }
        }
    }

    async fn drain_all(&mut self) -> Result<()> {
        loop {
            // What finished sends released is marked and started too: a
            // drain ends with nothing queued, held or under way.
            self.flush_marks().await?;
            self.launch_ready();
            let Some(joined) = self.mem.flights.join_next().await else {
                self.flush_shown().await?;
                return self.flush_acks().await;
            };
            let landed = self.joined(joined).await?;
            self.watchdog.tick();
            self.land(landed).await?;
        }
    }

    /// What a send task ended with; a task that panicked (or was cancelled)
    /// left its sends scheduled with no outcome, so everything is forgotten
    /// for the recovery that follows the error to rebuild from Redis.
    async fn joined(&mut self, j: Joined) -> Result<Landed> {
        match j {
            Ok(landed) => Ok(landed),
            Err(e) => {
                self.mem.forget().await;
                Err(Error::internal(format!("a delivery task failed: {e}")))
            }
        }
    }

    /// Records what a send task ended with. If a run's outcomes cannot all
    /// be recorded, what was delivered is acked if it still can be, and
    /// everything else is forgotten for the recovery that follows every
    /// error to rebuild from Redis: none of the run's members may stay
    /// scheduled with no one to start it, its destination held.
    async fn land(&mut self, landed: Landed) -> Result<()> {
        match landed {
            Landed::One(one) => {
                let (flight, result) = *one;
                self.stop_if_refused(&flight, &result).await?;
                self.complete(flight, result).await
            }
            Landed::Run {
                results,
                stale,
                took,
                holds,
                listed: (mark, listed),
            } => {
                // Before any outcome is recorded: each one's mark goes with
                // it, and the run's with its last.
                self.mem.runs.listed(&mark, listed);
                self.size_runs(&results, stale, took);
                let recorded = self.complete_run(results, holds).await;
                if recorded.is_err() {
                    if let Err(e) = self.flush_acks().await {
                        tracing::warn!(error = %e, "delivered entries left unacked: they are retries now");
                    }
                    self.mem.forget().await;
                }
                recorded
            }
        }
    }

    /// Sizes the next runs by how this one went: as many as it sent before
    /// its gate went stale, or twice as many when all went within half the
    /// time; so a slow platform gates about what it sends, and a fast one
    /// long runs.
    fn size_runs(&mut self, results: &[FlightResult], stale: bool, took: Duration) {
        let fresh = self.timing.run_fresh;
        let attempted = results.iter().filter(|(f, _)| !f.skipped).count();
        let all_sent = results.iter().all(|(_, r)| r.is_ok());
        let len = self.run_len();
        self.mem.run_len = if stale {
            attempted.max(1)
        } else if all_sent && results.len() >= len && took < fresh / 2 {
            (len * 2).min(RUN_MAX)
        } else {
            len
        };
    }

    /// Records the outcomes of a run, in order. Its destination stays held
    /// by a send deferred for a retry; what the run did not attempt goes
    /// back to the head of the queue behind it (a send its gate refused, to
    /// be marked afresh when its turn comes, which asks whose it is);
    /// otherwise the next send starts. Cards started together beside their
    /// destination (`holds` false) hold nothing: what they did not attempt
    /// starts again at once, gated afresh.
    async fn complete_run(&mut self, results: Vec<FlightResult>, holds: bool) -> Result<()> {
        let Some(channel) = results.first().map(|(f, _)| f.message.channel_id.clone()) else {
            return Ok(());
        };
        // What goes back to the queue is put there before anything that can
        // fail, so no member of the run is left nowhere.
        let mut done = Vec::with_capacity(results.len());
        let mut back: Vec<(String, String, Job)> = Vec::new();
        let mut again = Vec::new();
        for (mut f, result) in results {
            if f.skipped {
                // Not attempted: it goes again as it was before the run.
                f.skipped = false;
                match holds {
                    true => back.push((f.lane(), f.key.clone(), Job::Flight(Box::new(f)))),
                    false => again.push(f),
                }
            } else if f.fenced && !matches!(f.purpose, Purpose::Plain) {
                // A card another worker holds now: that worker shows it, as
                // for a card sent alone (`complete`).
                tracing::warn!(entry = %f.entry.id, "card not shown: taken over by another worker");
                self.mem.sched.end(&f.key);
            } else if f.fenced {
                // Its gate refused it: marked afresh when its turn comes,
                // which asks whose it is (dropped if another worker's, sent
                // as a retry if still this one's).
                tracing::warn!(entry = %f.entry.id, "send not made: its gate refused it; asked again whose it is");
                let key = f.key.clone();
                back.push((PLAIN_LANE.to_string(), key, f.into_job(true)));
            } else {
                done.push((f, result));
            }
        }
        for (lane, key, job) in back.into_iter().rev() {
            self.mem.sched.requeue_front(&channel, &lane, key, job);
        }
        let mut held = false;
        for (mut f, result) in done {
            self.stop_if_refused(&f, &result).await?;
            match std::mem::replace(&mut f.purpose, Purpose::Plain) {
                Purpose::Notification { record, deliveries } => {
                    // A card's retry never holds its destination.
                    self.record_notification(f, *record, deliveries, result)
                        .await?;
                }
                _ => held |= !self.complete_plain(f, result).await?,
            }
        }
        // Only once the run's outcomes are recorded: an error on the way
        // forgets everything (recovery rebuilds it), and a card started
        // again before would be shown with nobody to record it.
        self.launch_cards(again);
        if held || !holds {
            return Ok(());
        }
        self.start_next(&channel).await
    }

    /// Acks the batch's delivered entries, one `XACK` per stream, each
    /// followed by the removal of their in-flight marks, all in one round
    /// trip (a mark cleared before its ack would let a restart send the
    /// message again). Once acked an entry is no one's to send, so its mark,
    /// whoever wrote it, is a leftover: no script needs to check whose.
    async fn flush_acks(&mut self) -> Result<()> {
        self.mem.acks_since = None;
        if self.mem.acks.is_empty() {
            return Ok(());
        }
        // Taken only once written: a failed write is tried again with the acks.
        self.notices(self.mem.told.clone()).await?;
        self.mem.told.clear();
        let acks = std::mem::take(&mut self.mem.acks);
        let mut by_stream: BTreeMap<&str, (Vec<&str>, Vec<&str>)> = BTreeMap::new();
        for (stream, id, key) in &acks {
            let (ids, keys) = by_stream.entry(stream.as_str()).or_default();
            ids.push(id.as_str());
            keys.push(key.as_str());
        }
        let mut pipe = redis::pipe();
        for (stream, (ids, delivery_keys)) in &by_stream {
            pipe.xack(*stream, &self.group, ids).ignore();
            // A wake-up has no mark (its key is empty).
            let marked: Vec<&str> = delivery_keys
                .iter()
                .copied()
                .filter(|k| !k.is_empty())
                .collect();
            // And the marks of the runs whose last sends these were.
            let runs = self.runs_acked(marked.iter().copied());
            if !marked.is_empty() {
                pipe.hdel(keys::in_flight_marks(stream), marked).ignore();
            }
            if !runs.is_empty() {
                let runs: Vec<&str> = runs.iter().map(|r| &**r).collect();
                pipe.hdel(keys::in_flight_runs(stream), runs).ignore();
            }
        }
        let () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("XACK and HDEL (delivered entries)", e))?;
        Ok(())
    }

    /// Records the outcome of one send: delivered (acked with its batch), dead
    /// letter, or a deferred retry.
    async fn complete(
        &mut self,
        mut f: Flight,
        result: std::result::Result<Sent, SendError>,
    ) -> Result<()> {
        if f.fenced {
            // A plain send marked with its batch may wait long behind its
            // destination; if its mark went meanwhile (Redis restarted from an
            // older snapshot) while the entry is still this worker's, it is
            // marked again and sent, never forgotten while pending.
            if matches!(f.purpose, Purpose::Plain) && self.still_mine(&f).await? {
                tracing::warn!(entry = %f.entry.id, "the send gate found no mark on an entry still this worker's; marking it again");
                f.gate = Gate::Mine(self.worker.clone());
                self.mem.sched.end(&f.key);
                self.mem.to_mark.push(Unmarked {
                    flight: f,
                    marking: Marking::Plain { current: true },
                    needs_mark: true,
                });
                return Ok(());
            }
            // Another worker holds this delivery now; this one forgets it (and
            // fences itself once it sees its lease lapsed).
            tracing::warn!(entry = %f.entry.id, "send not made: the delivery was taken over by another worker");
            self.mem.sched.end(&f.key);
            return match f.purpose {
                Purpose::Plain => self.start_next(&f.message.channel_id).await,
                _ => self.end_dispatched(&f.message.channel_id).await,
            };
        }
        match std::mem::replace(&mut f.purpose, Purpose::Plain) {
            Purpose::Plain => {}
            Purpose::Approved { record } => {
                return self.complete_approved(f, *record, result).await
            }
            Purpose::Notification { record, deliveries } => {
                let channel = f.message.channel_id.clone();
                self.record_notification(f, *record, deliveries, result)
                    .await?;
                return self.end_dispatched(&channel).await;
            }
        }
        let channel = f.message.channel_id.clone();
        if self.complete_plain(f, result).await? {
            // The next delivery to this destination starts now.
            self.start_next(&channel).await?;
        }
        Ok(())
    }

    /// Records the outcome of a plain send; whether its destination is free
    /// for the next (not when it waits for a retry).
    async fn complete_plain(
        &mut self,
        f: Flight,
        result: std::result::Result<Sent, SendError>,
    ) -> Result<bool> {
        // Scheduled while it waited behind its destination, marked.
        self.mem.sched.end(&f.key);
        let stream = self.sources[f.source].key.clone();
        let taken = f.gate.clone();
        match self.outcome_of(&f.key, f.unreplicated, result) {
            Delivery::Sent(external_id, _) => {
                tracing::debug!(entry = %f.entry.id, external_id, "delivered");
                if f.message.progress {
                    let n = Notice {
                        external_id: Some(external_id),
                        ..Notice::new(NoticeStatus::Delivered, "delivered")
                    };
                    // Written with the batch's acks, before them.
                    let told = self.notice_entry(f.source, &f.entry.id, Some(&f.entry), n);
                    self.mem.told.push(told);
                }
                // Acked with the rest of the batch, then its mark cleared. A
                // taken-over one was proven on the platform: a restart before
                // its ack finds it there again, so the other's mark can go now.
                self.mem
                    .acks
                    .push((stream, f.entry.id.clone(), f.key.clone()));
                self.mem.acks_since.get_or_insert_with(Instant::now);
                self.forget_taken_mark(&taken, &f.key).await?;
            }
            Delivery::Failed(n) => {
                let n = *n;
                if n.status == NoticeStatus::Uncertain {
                    let reason = n.reason.clone();
                    self.record_uncertain(f.source, &f.entry, &f.message, None, &reason)
                        .await?;
                }
                self.dead_letter(f.source, &f.entry, n).await?;
                // Only once the outcome is recorded: a mark cleared before a
                // failed ack would let a restart send the message again.
                self.clear_in_flight(&[&f.key]).await?;
                self.forget_taken_mark(&taken, &f.key).await?;
            }
            Delivery::Deferred(due) => {
                // Not delivered: the mark goes, the entry waits (still pending),
                // and the destination stays busy.
                self.clear_in_flight(&[&f.key]).await?;
                let (key, retry) = (f.key.clone(), f.retry);
                self.mem.sched.defer(key, due, f.into_job(retry));
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Classifies one attempt's result under the retry policy: a transient
    /// failure is `Deferred` to a retry time under the bridge's [`RetryPolicy`],
    /// or `Failed` once the policy gives up.
    pub(super) fn outcome_of(
        &mut self,
        key: &str,
        unreplicated: bool,
        result: std::result::Result<Sent, SendError>,
    ) -> Delivery {
        let key = key.to_string();
        if unreplicated {
            // Redis's replicas, not the platform, held it back: tried again
            // soon, however long they take, and never given up on.
            tracing::warn!(delivery = %key, "replicas did not confirm the send's mark; deferred");
            return Delivery::Deferred(tokio::time::Instant::now() + crate::retry::backoff(2));
        }
        match result {
            Ok(sent) => {
                self.mem.sched.finished(&key);
                Delivery::Sent(sent.external_id, sent.report)
            }
            Err(SendError::Ran(report)) => {
                self.mem.sched.finished(&key);
                Delivery::Failed(Box::new(Notice::ran(report)))
            }
            // Credentials stop the service before this ([`Self::stop_if_refused`]).
            Err(SendError::Transient(why) | SendError::Credentials(why)) => {
                let now = tokio::time::Instant::now();
                match self.mem.sched.failed(&key, now, &self.policy) {
                    Ok(wait) => {
                        tracing::warn!(error = %why, retry_in = ?wait, "send failed; deferred");
                        Delivery::Deferred(now + wait)
                    }
                    Err((attempts, over)) => Delivery::Failed(Box::new(Notice::new(
                        NoticeStatus::Failed,
                        format!(
                            "gave up after {attempts} attempts over {} s: {why}",
                            over.as_secs()
                        ),
                    ))),
                }
            }
            Err(SendError::Permanent(why)) => {
                self.mem.sched.finished(&key);
                Delivery::Failed(Box::new(Notice::new(NoticeStatus::Failed, why)))
            }
            Err(SendError::Uncertain(why)) => {
                self.mem.sched.finished(&key);
                Delivery::Failed(Box::new(Notice::new(
                    NoticeStatus::Uncertain,
                    format!("delivery uncertain, not retried: {why}"),
                )))
            }
        }
    }

    /// Runs every deferred job whose retry time has come.
    pub(super) async fn retry_due(&mut self) -> Result<()> {
        while let Some((_, job)) = self.mem.sched.pop_due(tokio::time::Instant::now()) {
            match job {
                Job::Plain {
                    source,
                    entry,
                    message,
                    retry,
                } => {
                    self.deliver_and_ack(source, entry, message, retry, true)
                        .await?
                }
                Job::Approved { approval_id } => self.settle(approval_id).await?,
                Job::Notification {
                    source,
                    entry,
                    deliveries,
                } => self.handle_notification(source, &entry, deliveries).await?,
                // Queued behind a destination, never deferred.
                Job::Flight(_) => {
                    return Err(Error::internal(
                        "a queued send was found among the deferred ones",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether `f`'s entry is still in this worker's pending list.
    async fn still_mine(&mut self, f: &Flight) -> Result<bool> {
        let stream = &self.sources[f.source].key;
        let id = &f.entry.id;
        let pending: Vec<redis::Value> = redis::cmd("XPENDING")
            .arg(stream)
            .arg(&self.group)
            .arg(id)
            .arg(id)
            .arg(1)
            .arg(&self.consumer)
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XPENDING {stream}"), e))?;
        Ok(!pending.is_empty())
    }

    /// Copies the entry to the dead letter, tells the agent, acks.
    pub(super) async fn dead_letter(
        &mut self,
        src: SourceId,
        entry: &Entry,
        n: Notice,
    ) -> Result<()> {
        tracing::warn!(stream = %self.sources[src].key, entry = %entry.id, reason = %n.reason, "entry refused");
        self.dead_letter_only(src, entry, &n).await?;
        self.notice(src, &entry.id, Some(entry), n).await?;
        self.ack(&self.sources[src].key.clone(), &entry.id).await
    }

    pub(super) async fn dead_letter_only(
        &mut self,
        src: SourceId,
        entry: &Entry,
        n: &Notice,
    ) -> Result<()> {
        let source = &self.sources[src];
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("reason", n.reason.as_bytes()),
            ("status", n.status.as_str().as_bytes()),
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
    pub(super) async fn notice(
        &mut self,
        src: SourceId,
        entry_id: &str,
        entry: Option<&Entry>,
        n: Notice,
    ) -> Result<()> {
        let (inbox, fields) = self.notice_entry(src, entry_id, entry, n);
        let fields: Vec<(&str, &[u8])> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        self.store.xadd(&inbox, &fields).await?;
        Ok(())
    }

    /// A notice as the inbox entry it becomes: the inbox and the fields.
    pub(super) fn notice_entry(
        &self,
        src: SourceId,
        entry_id: &str,
        entry: Option<&Entry>,
        mut n: Notice,
    ) -> Told {
        let source = &self.sources[src];
        if n.request_id.is_none() {
            n.request_id = entry.and_then(|e| e.text("request_id")).map(str::to_string);
        }
        let inbox = keys::inbox_for(source.agent.as_deref(), &self.name);
        let fields = n
            .fields(&source.key, entry_id)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        (inbox, fields)
    }

    /// Writes notices in one round trip (progress notices of a batch: one
    /// agent's flood must not cost the loop a round trip per entry).
    pub(super) async fn notices(&mut self, told: Vec<Told>) -> Result<()> {
        if told.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (inbox, fields) in &told {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(inbox).arg("*");
            for (k, v) in fields {
                cmd.arg(k).arg(v.as_slice());
            }
            pipe.add_command(cmd).ignore();
        }
        let () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("XADD notices", e))?;
        Ok(())
    }

    pub(super) async fn ack(&mut self, stream: &str, id: &str) -> Result<()> {
        let group = self.group.clone();
        self.store.ack(stream, &group, &[id]).await
    }
}

/// A notice ready to write: its inbox and its fields.
pub(super) type Told = (String, Vec<(String, Vec<u8>)>);

/// A delivery waiting for its retry time, or queued behind one.
pub(super) enum Job {
    /// An entry that needs no approval.
    Plain {
        source: SourceId,
        entry: Entry,
        message: Message,
        retry: bool,
    },
    /// An approved parked entry: settling it again re-reads and re-checks it.
    Approved { approval_id: String },
    /// A notification on the notify side.
    Notification {
        source: SourceId,
        entry: Entry,
        /// As the pending list counted them when it was read.
        deliveries: u64,
    },
    /// A send queued behind another delivery to its destination, its mark
    /// taken: a plain entry's, an approved entry's or a notification's.
    Flight(Box<Flight>),
}

/// A send under way, with what its outcome needs.
pub(super) struct Flight {
    pub(super) source: SourceId,
    pub(super) entry: Entry,
    pub(super) message: Message,
    pub(super) retry: bool,
    pub(super) key: String,
    pub(super) purpose: Purpose,
    /// Whether and how the send is gated (see [`super::inflight`]).
    pub(super) gate: Gate,
    /// Set by the send task when the gate refused: nothing was sent.
    pub(super) fenced: bool,
    /// Set by the send task when replicas did not confirm its gate mark:
    /// nothing was sent, and it is not an attempt.
    pub(super) unreplicated: bool,
    /// Set by a run's task for a send it did not attempt (see
    /// [`OutboxService::launch_run`]): not an attempt either.
    pub(super) skipped: bool,
}

/// What a send task ended with: one send, or a run's, in order (with
/// whether it stopped on a stale gate, and how long it took).
pub(super) enum Landed {
    One(Box<FlightResult>),
    Run {
        results: Vec<FlightResult>,
        stale: bool,
        took: Duration,
        /// Whether the run is its destination's current delivery (released
        /// to it), or cards started together beside whatever holds it.
        holds: bool,
        /// The run's mark, and the sends it lists that were attempted (each
        /// settles it: see [`super::inflight::RunMarks`]).
        listed: (String, Vec<String>),
    },
}

/// Most sends gated as one run. A run's gate stands for the sends after its
/// first for `Timing::run_fresh` only: a run that takes longer (a slow
/// platform, a paused process) stops there, and the rest pass the gate
/// again, so a worker that slept through a takeover sends at most what it
/// had begun. What a worker that dies mid-run had not begun, a taker
/// cannot tell from what it had: it reports them `uncertain` (or delivered,
/// where the sender finds them) rather than send them, so this bounds that
/// loss too. Each run waits once for Redis before its first send, which on
/// a fast platform and a busy machine is most of what a run costs: 256 sends
/// forward about a third faster than 64 (`docs/benchmarks.md`). Runs grow
/// only while the last full one went out within half of `Timing::run_fresh`
/// (`size_runs`), so only a platform taking over 1,000
/// sends a second reaches 256.
const RUN_MAX: usize = 256;
/// Sends gated as one run before any run was timed.
const RUN_START: usize = 8;

impl Flight {
    /// The plain send it is, as a job to start afresh (marked again when
    /// its turn comes, the gate with it).
    pub(super) fn into_job(self, retry: bool) -> Job {
        Job::Plain {
            source: self.source,
            entry: self.entry,
            message: self.message,
            retry,
        }
    }

    /// Whether it may go in a run: a plain send or an approval card of this
    /// worker's own (an approved entry's send is never run with others: it
    /// is fenced by its record's delivery mark too).
    pub(super) fn runs(&self) -> bool {
        matches!(self.purpose, Purpose::Plain | Purpose::Notification { .. })
            && matches!(self.gate, Gate::Mine(_))
            && !self.fenced
    }

    /// The lane this send waits in for room ([`Lanes`]): an approval card in
    /// the lane of the bridge and agent that asked, so one agent's flood of
    /// cards takes turns with the others'; every other send in one lane, in
    /// arrival order.
    pub(super) fn lane(&self) -> String {
        match &self.purpose {
            Purpose::Notification { record, .. } => {
                format!(
                    "{}/{}",
                    record.source(),
                    record.agent.as_deref().unwrap_or("")
                )
            }
            Purpose::Plain | Purpose::Approved { .. } => PLAIN_LANE.to_string(),
        }
    }
}

/// The lane of every send that is not an approval card.
pub(super) const PLAIN_LANE: &str = "";

/// What a send is for, and so what its outcome does.
pub(super) enum Purpose {
    /// An entry that needs no approval: acked with its batch.
    Plain,
    /// An approved entry: its record is settled.
    Approved { record: Box<Record> },
    /// An approval notification this bridge shows: its card is recorded.
    Notification {
        record: Box<Record>,
        deliveries: u64,
    },
}

pub(super) enum Delivery {
    /// Delivered: its external id, and what the send reported.
    Sent(String, Option<Report>),
    Failed(Box<Notice>),
    /// Not delivered (transient): retry at this time; the entry stays pending.
    Deferred(tokio::time::Instant),
}
