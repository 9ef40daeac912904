//! Takeover: a live worker takes over the entries of a dead worker of the same
//! bridge, parked ones included.
//!
//! Invariants:
//! - Only a worker that has neither read (`XINFO CONSUMERS` idle) nor beaten
//!   (its field in `{bridge}:heartbeat`) for `claim_idle_seconds` counts as dead;
//!   a live one does both well within that (its reader blocks at most
//!   `claim_idle_seconds / 2`, its loop beats every third of it, busy or not).
//!   Each of its entries is taken only if itself idle that long (`XCLAIM`
//!   min-idle-time). A live worker's parked entries sit
//!   idle by design, so `XAUTOCLAIM`, which looks at entries alone, would steal
//!   them; this looks at the worker first.
//! - A taken parked entry's record is made to name the new worker after the
//!   `XCLAIM` and before its state is read: a decision made earlier is seen in
//!   that read, one made later wakes the new worker.
//! - Taken entries are handled as retries (`XCLAIM` counts a delivery, so the
//!   poison rule of the reader applies to them too); a send the dead worker had
//!   under way is therefore sent with `retry` set, and a sender that does not
//!   deduplicate sees the in-flight mark it left.
//! - The cost when nobody died is one `XINFO CONSUMERS` per outbox stream per
//!   `claim_idle_seconds / 2` (and an `HGET` per idle consumer holding entries),
//!   whatever the number of parked entries.

use super::*;

impl<S: Sender> OutboxService<S> {
    /// How often the consumers are checked for dead ones.
    pub(super) fn claim_every(&self) -> Duration {
        Duration::from_secs(self.bridge.claim_idle_seconds)
            .div_f64(2.0)
            .max(Duration::from_millis(500))
    }

    /// How often this worker beats: often enough for the others to tell it is alive.
    pub(super) fn beat_every(&self) -> Duration {
        HEARTBEAT_EVERY
            .min(Duration::from_secs(self.bridge.claim_idle_seconds).div_f64(3.0))
            .max(Duration::from_millis(250))
    }

    pub(super) fn heartbeat_field(&self) -> String {
        keys::outbox_heartbeat_field(&self.worker)
    }

    /// Whether the worker behind consumer `consumer` beat within `claim_idle_seconds`.
    async fn beats(&mut self, consumer: &str) -> Result<bool> {
        let Some(worker) = consumer.strip_prefix(&format!("{}-", self.name)) else {
            return Ok(false);
        };
        let key = keys::heartbeat(&self.name);
        let beat: Option<u64> = self
            .store
            .conn
            .hget(&key, keys::outbox_heartbeat_field(worker))
            .await
            .map_err(|e| Error::from_redis(&format!("HGET {key}"), e))?;
        // Beats are whole seconds: one second of slack.
        Ok(beat.is_some_and(|t| crate::now_secs() < t + self.bridge.claim_idle_seconds + 1))
    }

    /// Takes over every entry of each dead worker, stream by stream.
    pub(super) async fn claim_dead(&mut self) -> Result<()> {
        let idle_ms = self.bridge.claim_idle_seconds * 1000;
        for idx in 0..self.sources.len() {
            if self.sources[idx].kind == Kind::Decisions {
                continue; // each worker's own; a dead one's wake-ups are moot
            }
            let key = self.sources[idx].key.clone();
            let consumers = self.store.consumers(&key, &self.group).await?;
            let me = self.consumer.clone();
            for dead in consumers
                .into_iter()
                .filter(|c| c.name != me && c.pending > 0 && c.idle_ms >= idle_ms)
            {
                if self.beats(&dead.name).await? {
                    continue; // busy, not dead
                }
                tracing::warn!(stream = %key, worker = %dead.name, idle_ms = dead.idle_ms, pending = dead.pending, "taking over the entries of a worker that stopped reading");
                self.claim_from(idx, &dead.name, idle_ms).await?;
            }
        }
        Ok(())
    }

    async fn claim_from(&mut self, idx: usize, dead: &str, idle_ms: u64) -> Result<()> {
        let key = self.sources[idx].key.clone();
        let mut start = "-".to_string();
        loop {
            let page = self
                .store
                .pending(
                    &key,
                    &self.group,
                    &start,
                    self.bridge.batch,
                    Some(dead),
                    idle_ms,
                )
                .await?;
            let Some(last) = page.last() else {
                return Ok(());
            };
            start = format!("({}", last.id);
            let ids: Vec<&str> = page.iter().map(|p| p.id.as_str()).collect();
            let consumer = self.consumer.clone();
            let taken = self
                .store
                .claim(&key, &self.group, &consumer, idle_ms, &ids)
                .await?;
            let mut counts: HashMap<&str, u64> =
                page.iter().map(|p| (p.id.as_str(), p.deliveries)).collect();
            for entry in &taken {
                self.adopt(idx, entry).await?;
            }
            for entry in taken {
                // The claim counted one more delivery.
                let deliveries = counts.remove(entry.id.as_str()).unwrap_or(1) + 1;
                self.handle(idx, entry.id, Some(entry.fields), deliveries)
                    .await?;
            }
            // Not taken: either no longer in the stream (Redis dropped it from the
            // pending list) or touched meanwhile by another worker.
            for id in counts.into_keys().map(str::to_string).collect::<Vec<_>>() {
                if self.store.entry(&key, &id).await?.is_none() {
                    self.vanished(idx, &id).await?;
                }
            }
            self.drain().await?;
            if page.len() < self.bridge.batch {
                return Ok(());
            }
        }
    }

    /// Points a taken parked entry's record at this worker, so decisions wake it.
    async fn adopt(&mut self, idx: usize, entry: &Entry) -> Result<()> {
        let source = &self.sources[idx];
        let surface_entry = source.kind == Kind::Flat
            && (entry.get("approval_id").is_some() || entry.get("approval_outcome").is_some());
        if !self.bridge.approval.required || surface_entry {
            return Ok(());
        }
        let id = self.approval_id(&source.key, &entry.id)?;
        let worker = self.worker.clone();
        set_if_exists(&mut self.store, &id, &[("worker", &worker)]).await?;
        Ok(())
    }
}
