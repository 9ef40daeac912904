//! Takeover: a live worker takes over the entries of a dead worker of the same
//! bridge, parked ones included.
//!
//! Invariants:
//! - A worker is alive while its lease (`{bridge}:worker:{worker}`, holding its
//!   process's instance id) exists. A task beside the loop renews it every third
//!   of `claim_idle_seconds`, busy or not; Redis expires it, so no two hosts'
//!   clocks are compared. Only a consumer whose lease is gone is taken over, and
//!   each of its entries only if itself idle `claim_idle_seconds` (`XCLAIM`
//!   min-idle-time). (`XAUTOCLAIM` looks at entries alone and would take a live
//!   worker's parked entries, which sit idle by design.)
//! - A worker that finds its lease expired (it was paused, or cut off from Redis
//!   past `claim_idle_seconds`) may have been taken over: it fences itself, drops
//!   everything it holds in memory ([`super::memory`], forgotten as one) and reads
//!   its own pending list again, which no longer holds what was taken. One that
//!   finds its lease held by another instance stops: two processes were started
//!   with one worker name.
//! - A taken parked entry's record is made to name the new worker after the
//!   `XCLAIM` and before its state is read: a decision made earlier is seen in
//!   that read, one made later wakes the new worker.
//! - Taken entries are handled as retries (`XCLAIM` counts a delivery, so the
//!   poison rule of the reader applies to them too); a send the dead worker had
//!   under way is therefore sent with `retry` set, and a sender that does not
//!   deduplicate sees the in-flight mark it left.
//! - Order per destination is kept within a worker; two workers read different
//!   entries of one stream, so across workers it is not (see docs/operations.md).
//! - The cost when nobody died is one `XINFO CONSUMERS` per outbox stream per
//!   `claim_idle_seconds / 2` (and an `EXISTS` per other consumer holding
//!   entries), whatever the number of parked entries.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

/// Renews a lease held by this instance (`kept`); re-takes an expired one
/// (`lost`: the holder may have been taken over); reports one held by another
/// instance (`usurped`). KEYS: the lease. ARGV: instance id, lifetime in ms.
const RENEW: &str = r#"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 'kept' end
if v then return 'usurped' end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 'lost'
"#;

/// This worker's lease, renewed by a task beside the loop.
pub(super) struct Lease {
    state: Arc<LeaseState>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct LeaseState {
    /// Milliseconds after `start` of the last renewal that found the lease ours.
    renewed_ms: AtomicU64,
    lost: AtomicBool,
    usurped: AtomicBool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the loop must do about its lease.
pub(super) enum Standing {
    Held,
    /// Possibly taken over: fence.
    Lost,
    /// Another process runs under this worker name.
    Usurped,
}

impl<S: Sender> OutboxService<S> {
    /// How often the consumers are checked for dead ones.
    pub(super) fn claim_every(&self) -> Duration {
        Duration::from_secs(self.bridge.claim_idle_seconds)
            .div_f64(2.0)
            .max(Duration::from_millis(500))
    }

    pub(super) fn heartbeat_field(&self) -> String {
        keys::outbox_heartbeat_field(&self.worker)
    }

    /// Takes this worker's lease (overwriting a dead predecessor's) and starts
    /// renewing it.
    pub(super) async fn take_lease(&mut self) -> Result<()> {
        let key = keys::worker_lease(&self.name, &self.worker);
        let life_ms = self.bridge.claim_idle_seconds * 1000;
        let instance = uuid::Uuid::new_v4().simple().to_string();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&instance)
            .arg("PX")
            .arg(life_ms)
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("SET {key}"), e))?;
        let state = Arc::new(LeaseState::default());
        let start = Instant::now();
        let every = Duration::from_millis((life_ms / 3).max(100));
        let mut conn = self.store.conn.clone();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let script = redis::Script::new(RENEW);
            loop {
                tokio::time::sleep(every).await;
                let r: redis::RedisResult<String> = script
                    .key(&key)
                    .arg(&instance)
                    .arg(life_ms)
                    .invoke_async(&mut conn)
                    .await;
                match r.as_deref() {
                    Ok("kept") => {}
                    Ok("lost") => shared.lost.store(true, Ordering::SeqCst),
                    Ok(_) => shared.usurped.store(true, Ordering::SeqCst),
                    Err(e) => {
                        tracing::warn!(error = %e, lease = %key, "worker lease not renewed");
                        continue;
                    }
                }
                let ms = start.elapsed().as_millis() as u64;
                shared.renewed_ms.store(ms, Ordering::SeqCst);
            }
        });
        self.lease = Some((Lease { state, task }, start));
        Ok(())
    }

    /// Whether this worker still holds its lease: also lost when no renewal
    /// succeeded for `claim_idle_seconds` (it may have expired unseen).
    pub(super) fn standing(&self) -> Standing {
        let Some((lease, start)) = &self.lease else {
            return Standing::Held;
        };
        if lease.state.usurped.load(Ordering::SeqCst) {
            return Standing::Usurped;
        }
        let renewed = Duration::from_millis(lease.state.renewed_ms.load(Ordering::SeqCst));
        let silent = start.elapsed().saturating_sub(renewed);
        if lease.state.lost.load(Ordering::SeqCst)
            || silent >= Duration::from_secs(self.bridge.claim_idle_seconds)
        {
            return Standing::Lost;
        }
        Standing::Held
    }

    /// Forgets everything held in memory after a possible takeover, and takes the
    /// lease again; the caller then reads this worker's pending list afresh.
    pub(super) async fn fence(&mut self) -> Result<()> {
        tracing::warn!(bridge = %self.name, worker = %self.worker, "worker lease lapsed; another worker may have taken over: starting over from this worker's pending list");
        self.mem.forget().await;
        self.lease = None;
        self.take_lease().await
    }

    /// Whether the worker behind consumer `consumer` holds its lease.
    async fn alive(&mut self, consumer: &str) -> Result<bool> {
        let Some(worker) = consumer.strip_prefix(&format!("{}-", self.name)) else {
            return Ok(false);
        };
        let key = keys::worker_lease(&self.name, worker);
        self.store
            .conn
            .exists(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("EXISTS {key}"), e))
    }

    /// Takes over every entry of each dead worker, stream by stream.
    pub(super) async fn claim_dead(&mut self) -> Result<()> {
        let idle_ms = self.bridge.claim_idle_seconds * 1000;
        for src in self.sources.ids() {
            if self.sources[src].kind == Kind::Decisions {
                continue; // each worker's own; a dead one's wake-ups are moot
            }
            let key = self.sources[src].key.clone();
            let consumers = self.store.consumers(&key, &self.group).await?;
            let me = self.consumer.clone();
            for dead in consumers
                .into_iter()
                .filter(|c| c.name != me && c.pending > 0)
            {
                if self.alive(&dead.name).await? {
                    continue;
                }
                tracing::warn!(stream = %key, worker = %dead.name, pending = dead.pending, "taking over the entries of a worker whose lease expired");
                self.claim_from(src, &dead.name, idle_ms).await?;
            }
        }
        Ok(())
    }

    async fn claim_from(&mut self, src: SourceId, dead: &str, idle_ms: u64) -> Result<()> {
        let key = self.sources[src].key.clone();
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
                self.adopt(src, entry).await?;
            }
            for entry in taken {
                // The claim counted one more delivery.
                let deliveries = counts.remove(entry.id.as_str()).unwrap_or(1) + 1;
                self.handle(src, entry.id, Some(entry.fields), deliveries)
                    .await?;
            }
            // Not taken: either no longer in the stream (Redis dropped it from the
            // pending list) or touched meanwhile by another worker.
            for id in counts.into_keys().map(str::to_string).collect::<Vec<_>>() {
                if self.store.entry(&key, &id).await?.is_none() {
                    self.vanished(src, &id).await?;
                }
            }
            self.drain().await?;
            if page.len() < self.bridge.batch {
                return Ok(());
            }
        }
    }

    /// Points a taken parked entry's record at this worker, so decisions wake it.
    async fn adopt(&mut self, src: SourceId, entry: &Entry) -> Result<()> {
        let source = &self.sources[src];
        let class = Class::of_fields(source.kind, &entry.fields);
        if !self.bridge.approval.required || class != Class::Agent {
            return Ok(());
        }
        let id = self.approval_id(&source.key, &entry.id)?;
        let worker = self.worker.clone();
        Approvals::on(&mut self.store)
            .set_worker(&id, &worker)
            .await?;
        Ok(())
    }
}
