//! The reader loop: one blocking `XREADGROUP` over the outbox streams and
//! `{bridge}:decisions`, recovery of this consumer's pending entries, and the
//! dispatch of each entry to parking, delivery, the notify side or settling.
//!
//! Invariants:
//! - An entry is acked only once its outcome is recorded: sent, dead-lettered with
//!   a notice, or settled. A parked entry stays pending, so a restart finds it in
//!   the pending list ("resume or start") with the same derived approval id.
//! - Recovery handles decisions last, so every parked entry is known when they
//!   are applied; a lost connection recovers what a lost reply left pending.
//! - Idle cost: the loop blocks on one read, woken by new entries, by decisions,
//!   or by the next deadline kept in memory.

use super::*;

impl<S: Sender> OutboxService<S> {
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
                // Or its stream was deleted under a blocked read (UNBLOCKED).
                Err(Error::Redis(e)) if matches!(e.code(), Some("NOGROUP" | "UNBLOCKED")) => {
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
    pub(super) async fn reconnect(&mut self) -> Result<redis::aio::MultiplexedConnection> {
        let mut conn = self.store.blocking().await?;
        self.recover(&mut conn).await?;
        tracing::info!(bridge = %self.name, "reconnected to Redis");
        Ok(conn)
    }

    /// One turn of the loop: heartbeat, one blocking read, handling, deadlines,
    /// sweep. Returns false when shutdown came during the read.
    pub(super) async fn step(
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
        // The batch's sends run side by side; every outcome is recorded before
        // the next read.
        self.drain().await?;
        self.settle_due().await?;
        self.retry_due().await?;
        if st.last_sweep.elapsed() >= SWEEP_EVERY {
            self.sweep().await?;
            st.last_sweep = Instant::now();
        }
        Ok(true)
    }

    pub(super) fn block_for(&self, last_sweep: Instant) -> Duration {
        let mut block = MAX_BLOCK.min(SWEEP_EVERY.saturating_sub(last_sweep.elapsed()));
        if let Some(w) = self.watchdog.interval() {
            block = block.min(w);
        }
        if let Some(due) = self.retries.next_due() {
            block = block.min(due.saturating_duration_since(tokio::time::Instant::now()));
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
    pub(super) async fn recover(
        &mut self,
        blocking: &mut redis::aio::MultiplexedConnection,
    ) -> Result<()> {
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
                self.drain().await?;
            }
        }
        self.settle_due().await
    }

    pub(super) async fn handle(
        &mut self,
        idx: usize,
        id: String,
        fields: Option<Vec<(String, Vec<u8>)>>,
        retry: bool,
    ) -> Result<()> {
        let source = self.sources[idx].clone();
        let Some(fields) = fields else {
            return self.vanished(idx, &id).await;
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
        let message = Message::from_entry(&entry, &self.bridge).and_then(|m| {
            if self
                .config
                .approval_channels(&self.name)
                .any(|c| same_destination(c, &m.channel_id))
            {
                Err(format!(
                    "destination `{}` is where approval requests are shown; agents may not post there",
                    m.channel_id
                ))
            } else {
                Ok(m)
            }
        });
        let message = match message {
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
            return self
                .deliver_and_ack(idx, &entry, &message, retry, false)
                .await;
        }
        let approval_id = self.approval_id(&source.key, &entry.id)?;
        if retry && self.parked.contains_key(&approval_id) {
            return Ok(());
        }
        self.park(idx, &entry, &message, approval_id, retry).await
    }
}

/// Timers of the main loop.
pub(super) struct LoopState {
    last_sweep: Instant,
    last_beat: Option<Instant>,
}
