//! The reader loop: one blocking `XREADGROUP` over the outbox streams and
//! `{bridge}:decisions`, recovery of this consumer's pending entries, and the
//! dispatch of each entry to parking, delivery, the notify side or settling.
//!
//! Invariants:
//! - An entry is acked only once its outcome is recorded: sent, dead-lettered with
//!   a notice, or settled. A parked entry stays pending, so a restart finds it in
//!   the pending list ("resume or start") with the same derived approval id.
//! - Recovery handles the decisions stream's pending entries last, so every
//!   parked entry is known when they are applied; new decisions are served
//!   between recovery pages, for what is recovered already (the rest is settled
//!   from its record when recovery reaches it). A lost connection recovers what
//!   a lost reply left pending.
//! - Idle cost: the loop blocks on one read, woken by new entries, by decisions,
//!   or by the next deadline kept in memory.
//! - An entry handed out more than `max_deliveries` times (restarts, takeovers)
//!   without an outcome is dead-lettered as poison before anything else is done
//!   with it, so one entry that kills its worker cannot stop the bridge. Parked
//!   entries are exempt: waiting through restarts is what they are for.

use super::*;

/// Batches from the reader task, or the error that ended it.
pub(super) type Reads = tokio::sync::mpsc::Receiver<Result<StreamBatch>>;

impl<S: Sender> OutboxService<S> {
    /// Runs until shutdown. Returns an error only for what a restart cannot fix
    /// by waiting (permissions, config) or after Redis stayed away.
    pub async fn run(mut self) -> Result<()> {
        self.prepare().await?;
        // Before recovery, so a long recovery is not mistaken for a dead worker.
        self.take_lease().await?;
        let mut conn = self.store.blocking().await?;
        self.recover(&mut conn).await?;
        let mut reads = Some(self.spawn_reader(conn));
        systemd::ready();
        tracing::info!(bridge = %self.name, worker = %self.worker, parked = self.mem.parked.len(), "outbox service running");
        self.claim_dead().await?;
        self.retain().await?;
        let mut st = LoopState {
            last_sweep: Instant::now(),
            last_beat: None,
            last_claim: Instant::now(),
            last_retain: Instant::now(),
        };
        let mut failures = 0u32;
        while !self.shutdown.is_set() {
            self.watchdog.tick();
            let step = match reads.as_mut() {
                Some(rx) => self.step(rx, &mut st).await,
                None => self.reconnect().await.map(|conn| {
                    reads = Some(self.spawn_reader(conn));
                    Turn::Go
                }),
            };
            match step {
                Ok(Turn::Go) => failures = 0,
                Ok(Turn::Stop) => break,
                Ok(Turn::Fence) => {
                    // The reader goes with its receiver; the reconnect reads this
                    // worker's pending list again, without what was taken.
                    reads = None;
                    self.fence().await?;
                }
                Err(e) => {
                    // The reader is gone or about to be: what it read is pending
                    // and recovery after the reconnect reads it again.
                    reads = None;
                    let _ = self.drain().await;
                    let e = match e {
                        // Redis lost its data (restarted without persistence, or a
                        // failover lost the groups): they come back empty. Or a
                        // stream was deleted under a blocked read (UNBLOCKED).
                        // Recreating them may itself fail (behind Sentinels, on
                        // the old master before the store follows the new one):
                        // that failure is handled as any other below.
                        Error::Redis(e) if matches!(e.code(), Some("NOGROUP" | "UNBLOCKED")) => {
                            tracing::warn!("consumer group missing; creating it again");
                            match self.prepare().await {
                                Ok(()) => continue,
                                Err(e) => e,
                            }
                        }
                        e => e,
                    };
                    match e {
                        e if e.is_retriable() && failures < MAX_FAILURES => {
                            failures += 1;
                            tracing::warn!(error = %e, failures, "Redis unavailable; retrying");
                            if !self.shutdown.sleep(crate::retry::backoff(failures)).await {
                                break;
                            }
                        }
                        e => return Err(e),
                    }
                }
            }
        }
        // In flight at shutdown: finished and recorded, or (on a Redis error) left
        // pending for the next start. Never half-handled.
        let _ = self.drain().await;
        tracing::info!(bridge = %self.name, "outbox service stopped");
        Ok(())
    }

    /// A fresh blocking connection, and whatever a lost reply left pending.
    pub(super) async fn reconnect(&mut self) -> Result<crate::store::Blocking> {
        // Cut off past its lease, this worker may have been taken over: it
        // forgets what it knew before recovering, as a step would have. No
        // lease at all: a fence here failed to take a new one (Redis was
        // away), and is done again before anything else.
        if self.lease.is_none() || matches!(self.standing(), claim::Standing::Lost) {
            self.fence().await?;
        }
        let mut conn = self.store.blocking().await?;
        self.recover(&mut conn).await?;
        tracing::info!(bridge = %self.name, "reconnected to Redis");
        Ok(conn)
    }

    /// The reader: one blocking `XREADGROUP` after another on its own connection,
    /// each batch handed to the loop. It runs beside the loop so sends, timers and
    /// beats never wait for a read, and a read is never abandoned half-way (an
    /// abandoned read would leave its entries pending and unknown). One batch
    /// waits in the channel at most. It ends at its first error, which it passes on.
    fn spawn_reader(&self, mut conn: crate::store::Blocking) -> Reads {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let keys: Vec<String> = self.sources.iter().map(|s| s.key.clone()).collect();
        let group = self.group.clone();
        let consumer = self.consumer.clone();
        let count = self.bridge.batch;
        tokio::spawn(async move {
            let new_ids = vec![">"; keys.len()];
            loop {
                let read = tokio::select! {
                    _ = tx.closed() => return,
                    r = conn.read_group(&group, &consumer, &keys, &new_ids, count, Some(MAX_BLOCK)) => r,
                };
                let failed = read.is_err();
                match read {
                    Ok(batch) if batch.iter().all(|(_, e)| e.is_empty()) => continue,
                    r => {
                        if tx.send(r).await.is_err() || failed {
                            return;
                        }
                    }
                }
            }
        });
        rx
    }

    /// One turn of the loop: heartbeat, then whichever comes first of a batch, a
    /// finished send, a timer or shutdown; then deadlines, retries, sweep and
    /// takeover. Returns `Stop` on shutdown, `Fence` when the lease lapsed.
    pub(super) async fn step(&mut self, reads: &mut Reads, st: &mut LoopState) -> Result<Turn> {
        match self.standing() {
            claim::Standing::Held => {}
            claim::Standing::Lost => return Ok(Turn::Fence),
            claim::Standing::Usurped => {
                return Err(crate::error::ConfigError::invalid(
                    "--worker",
                    format!(
                        "another process now runs as worker `{}` of bridge `{}`: each process needs its own worker name",
                        self.worker, self.name
                    ),
                )
                .into())
            }
        }
        if st
            .last_beat
            .is_none_or(|t| t.elapsed() >= self.timing.heartbeat_every)
        {
            let field = self.heartbeat_field();
            self.store
                .heartbeat(
                    &self.name,
                    &field,
                    self.timing.heartbeat_every * 3,
                    &self.clock,
                )
                .await?;
            st.last_beat = Some(Instant::now());
        }
        let wait = self.block_for(st);
        let busy = !self.mem.flights.is_empty();
        tokio::select! {
            _ = self.shutdown.wait() => return Ok(Turn::Stop),
            Some(joined) = self.mem.flights.join_next(), if busy => self.collect(joined).await?,
            read = reads.recv() => {
                let batch = match read {
                    Some(batch) => batch?,
                    None => return Err(Error::internal("the outbox reader stopped")),
                };
                self.prefetch_claims(&batch).await?;
                for (key, entries) in batch {
                    let Some(src) = self.sources.by_key(&key) else {
                        continue;
                    };
                    for (id, fields) in entries {
                        self.handle(src, id, fields, 1).await?;
                    }
                }
                self.park_batch().await?;
                self.mem.claims.clear();
            }
            _ = tokio::time::sleep(wait) => {}
        }
        self.flush_acks_due().await?;
        self.settle_due().await?;
        self.remind_due().await?;
        self.escalate_due().await?;
        self.digest_due().await?;
        self.retry_due().await?;
        self.flush_shown_due().await?;
        if st.last_sweep.elapsed() >= self.timing.sweep_every {
            self.sweep().await?;
            st.last_sweep = Instant::now();
        }
        if st.last_claim.elapsed() >= self.claim_every() {
            self.claim_dead().await?;
            st.last_claim = Instant::now();
        }
        if st.last_retain.elapsed() >= self.timing.retain_every {
            self.retain().await?;
            st.last_retain = Instant::now();
        }
        // Last, so nothing queued this turn waits through the next one's block.
        self.flush_marks().await?;
        Ok(Turn::Go)
    }

    /// How long the loop may wait for a batch or a finished send before a timer
    /// is due: the next deadline, retry, sweep, takeover check or beat.
    pub(super) fn block_for(&self, st: &LoopState) -> Duration {
        let mut block = MAX_BLOCK
            .min(
                self.timing
                    .sweep_every
                    .saturating_sub(st.last_sweep.elapsed()),
            )
            .min(self.claim_every().saturating_sub(st.last_claim.elapsed()));
        if let Some(t) = st.last_beat {
            block = block.min(self.timing.heartbeat_every.saturating_sub(t.elapsed()));
        }
        if let Some(w) = self.watchdog.interval() {
            block = block.min(w);
        }
        if let Some(due) = self.mem.sched.next_due() {
            block = block.min(due.saturating_duration_since(tokio::time::Instant::now()));
        }
        for t in [self.mem.acks_since, self.mem.shown_since]
            .into_iter()
            .flatten()
        {
            block = block.min(ACK_DELAY.saturating_sub(t.elapsed()));
        }
        let timers = self.mem.parked.next_deadline().into_iter();
        if let Some(at) = timers.chain(self.next_digest_at()).min() {
            let until = at as f64 - self.clock.now_secs_f64();
            block = block.min(Duration::from_secs_f64(until.max(0.0)));
        }
        block.max(Duration::from_millis(1))
    }

    /// Handles this consumer's pending entries: parked ones are tracked again
    /// (after a reconnect, those still tracked are kept and skipped),
    /// unfinished ones handled as retries. Decisions come last, so every parked
    /// entry is known when they are applied.
    pub(super) async fn recover(&mut self, blocking: &mut crate::store::Blocking) -> Result<()> {
        // Nothing read or begun before this recovery is trusted: what it left
        // half-done is pending and is read again here.
        self.mem.forget_batch();
        // A recovery that failed leaves the wake-ups it noted to the next
        // one: acked, they come only once.
        let woken = self.mem.recovering.take().map(|r| r.woken);
        // Cloned (about 80 bytes an approval tracked; none at start-up or
        // after a fence): the reader needs them beside this task.
        let known: std::collections::HashSet<String> = self.mem.parked.ids().collect();
        self.mem.recovering = Some(memory::Recovering {
            known: Arc::new(known),
            woken: woken.unwrap_or_default(),
        });
        self.recover_pages(blocking).await?;
        self.mem.recovering = None;
        // The pages' record table (a thousand records wide) is not kept for
        // the small live batches, and the freed heap goes back: at start-up
        // and after a reconnect alike.
        self.mem.prefetched = Default::default();
        crate::alloc::release_freed();
        self.settle_due().await
    }

    /// Handles the pages of pending entries, each read while the one before
    /// is handled (see `recovery`).
    async fn recover_pages(&mut self, blocking: &mut crate::store::Blocking) -> Result<()> {
        let mut pages = self.page_reader().await?.spawn();
        while let Some(page) = pages.next().await? {
            self.mem.prefetched.extend(page.records);
            for (id, fields) in page.entries {
                // This re-read counted as one more delivery of each.
                let deliveries = page.counts.get(&id).copied().unwrap_or(2);
                self.handle(page.source, id, fields, deliveries).await?;
            }
            self.mem.prefetched.clear();
            self.drain().await?;
            // A long recovery does not hold up decisions on what it has
            // recovered already.
            self.serve_decisions(blocking).await?;
        }
        Ok(())
    }

    /// Acts on the decisions that arrived since the last look, without waiting
    /// for more: between recovery pages. A decision on an entry not recovered
    /// yet is acked and loses nothing: the record holds it, and the entry is
    /// settled when recovery reaches it.
    async fn serve_decisions(&mut self, blocking: &mut crate::store::Blocking) -> Result<()> {
        let src = self.sources.decisions();
        let key = self.sources[src].key.clone();
        let batch = blocking
            .read_group(
                &self.group,
                &self.consumer,
                std::slice::from_ref(&key),
                &[">"],
                self.bridge.batch,
                None,
            )
            .await?;
        for (id, fields) in batch.into_iter().flat_map(|(_, e)| e) {
            self.handle(src, id, fields, 1).await?;
        }
        self.drain().await
    }

    /// The reader of recovery's pages: every source in order, the decisions
    /// stream last, on a connection of its own.
    async fn page_reader(&self) -> Result<recovery::PageReader> {
        let records = match (&self.id_key, self.bridge.approval.required) {
            (Some(key), true) => Some((key.clone(), self.recovery_fields())),
            _ => None,
        };
        Ok(recovery::PageReader {
            known: self
                .mem
                .recovering
                .as_ref()
                .map(|r| r.known.clone())
                .unwrap_or_default(),
            store: self.store.clone(),
            blocking: self.store.blocking().await?,
            group: self.group.clone(),
            consumer: self.consumer.clone(),
            sources: self
                .sources
                .ids()
                .map(|src| recovery::SourcePages {
                    source: src,
                    key: self.sources[src].key.clone(),
                    kind: self.sources[src].kind,
                })
                .collect(),
            records,
        })
    }

    /// Handles one entry. `deliveries` is how many times it was handed out (the
    /// pending list's count; 1 for a new entry): more than once makes it a retry.
    pub(super) async fn handle(
        &mut self,
        src: SourceId,
        id: String,
        fields: Option<Vec<(String, Vec<u8>)>>,
        deliveries: u64,
    ) -> Result<()> {
        let source = self.sources[src].clone();
        let retry = deliveries > 1;
        let Some(fields) = fields else {
            return self.vanished(src, &id).await;
        };
        let entry = Entry { id, fields };
        let class = Class::of_fields(source.kind, &entry.fields);
        // A parking bridge checks once it knows whether a record exists (see
        // `park`); a card once it knows whether it is genuine; a decision is
        // never poison.
        let checked_later = match class {
            Class::Agent => self.bridge.approval.required,
            Class::Notification | Class::Decision => true,
            Class::Outcome | Class::Digest => false,
        };
        // One waiting for its retry was handed out again by a reconnect, not by a crash.
        let waiting = || {
            self.mem
                .sched
                .is_scheduled(&delivery_key(&source.key, &entry.id))
        };
        if !checked_later && self.is_poison(deliveries) && !waiting() {
            return self.poison(src, &entry, deliveries, None).await;
        }
        match class {
            Class::Decision => return self.woken(src, &entry).await,
            Class::Outcome => return self.handle_outcome(src, &entry, true).await,
            Class::Digest => return self.handle_digest(src, &entry, retry).await,
            Class::Notification => return self.handle_notification(src, &entry, deliveries).await,
            Class::Agent => {}
        }
        let stream = self.sources[src].key.clone();
        let message = self.requested(&stream, &entry).await.and_then(|m| {
            // Both sides as the platform reads them: `+123` is channel 123.
            let sender = &self.sender;
            not_an_approval_channel(&self.config, &self.name, &m.channel_id, |c| {
                sender.canonical_destination(c)
            })?;
            Ok(m)
        });
        let message = match message {
            Ok(m) => m,
            Err(reason) => {
                let n = Notice::new(NoticeStatus::Invalid, reason);
                return self.dead_letter(src, &entry, n).await;
            }
        };
        if !self.bridge.approval.required {
            return self
                .deliver_and_ack(src, entry, message, retry, false)
                .await;
        }
        let approval_id = self.approval_id(&source.key, &entry.id)?;
        let known = |id: &String| {
            self.mem.parked.contains(id)
                || (self.mem.recovering.as_ref()).is_some_and(|r| r.known.contains(id))
        };
        if retry && known(&approval_id) {
            return Ok(());
        }
        if !retry {
            // A fresh entry: parked with the rest of its batch, in a few round trips.
            self.mem.to_park.push(NewPark {
                source: src,
                entry,
                message,
                id: approval_id,
            });
            return Ok(());
        }
        self.park(src, &entry, &message, approval_id, deliveries)
            .await
    }

    pub(super) fn is_poison(&self, deliveries: u64) -> bool {
        deliveries > self.bridge.max_deliveries
    }

    /// Dead-letters an entry handed out too often without an outcome, with a
    /// notice; an approved one (`record`) also has its approval closed as failed.
    pub(super) async fn poison(
        &mut self,
        src: SourceId,
        entry: &Entry,
        deliveries: u64,
        record: Option<&Record>,
    ) -> Result<()> {
        let reason = format!(
            "handed to a worker {deliveries} times without an outcome (max_deliveries = {}); set aside as poison, not sent",
            self.bridge.max_deliveries
        );
        let mut n = Notice::new(NoticeStatus::Failed, reason);
        if let Some(r) = record {
            n = n.approval(&r.id).request(r.request_id.as_deref());
        }
        let Some(record) = record else {
            return self.dead_letter(src, entry, n).await;
        };
        self.dead_letter_only(src, entry, &n).await?;
        self.notice(src, &entry.id, Some(entry), n).await?;
        self.finish(src, &entry.id, record, Some("failed")).await
    }
}

/// What the loop does after a turn.
pub(super) enum Turn {
    Go,
    Stop,
    /// This worker's lease lapsed: forget what is in memory and recover.
    Fence,
}

/// Timers of the main loop.
pub(super) struct LoopState {
    last_sweep: Instant,
    last_beat: Option<Instant>,
    last_claim: Instant,
    last_retain: Instant,
}
