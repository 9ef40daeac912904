//! Delivery through the [`Sender`], dead letters and notices.
//!
//! Invariants:
//! - A send that may have happened before a crash is retried only with `retry =
//!   true`, so the sender can deduplicate by `delivery_key` or report the delivery
//!   uncertain. For senders that cannot deduplicate ([`Sender::DEDUPLICATES`]),
//!   each delivery is marked in `{bridge}:in-flight` first, so `retry` is set
//!   exactly when an attempt may have reached the platform.
//! - `Transient` means "not delivered": retrying it never sets `retry`.
//! - A dead letter copies the refused entry under `field:` names (huge entries in
//!   part), so its fields cannot shadow the broker's.

use super::*;

impl<S: Sender> OutboxService<S> {
    pub(super) async fn deliver_and_ack(
        &mut self,
        idx: usize,
        entry: &Entry,
        message: &Message,
        retry: bool,
    ) -> Result<()> {
        let stream = self.sources[idx].key.clone();
        let key = delivery_key(&stream, &entry.id);
        let mut retry = retry;
        if !S::DEDUPLICATES {
            retry = retry && self.in_flight(&key).await?;
            self.mark_in_flight(&key).await?;
        }
        let out = Outgoing {
            message,
            delivery_key: &key,
            retry,
            approval: None,
        };
        let result = match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                tracing::debug!(entry = %entry.id, external_id, "delivered");
                self.ack(&stream, &entry.id).await
            }
            Delivery::Failed(n) => self.dead_letter(idx, entry, n).await,
            // Stopped while waiting out a transient failure: nothing was delivered.
            Delivery::Interrupted => Ok(()),
        };
        // Only once the outcome is recorded: a mark cleared before a failed ack
        // would let a restart send the message again.
        if result.is_ok() && !S::DEDUPLICATES {
            self.clear_in_flight(&key).await?;
        }
        result
    }

    pub(super) async fn in_flight(&mut self, delivery_key: &str) -> Result<bool> {
        let key = keys::in_flight(&self.name);
        self.store
            .conn
            .hexists(&key, delivery_key)
            .await
            .map_err(|e| Error::from_redis(&format!("HEXISTS {key}"), e))
    }

    pub(super) async fn mark_in_flight(&mut self, delivery_key: &str) -> Result<()> {
        let key = keys::in_flight(&self.name);
        let _: i64 = self
            .store
            .conn
            .hset(&key, delivery_key, crate::now_secs())
            .await
            .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        Ok(())
    }

    pub(super) async fn clear_in_flight(&mut self, delivery_key: &str) -> Result<()> {
        let key = keys::in_flight(&self.name);
        let _: i64 = self
            .store
            .conn
            .hdel(&key, delivery_key)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
        Ok(())
    }

    /// Sends, waiting out transient failures with backoff until shutdown.
    pub(super) async fn deliver(&mut self, out: Outgoing<'_>) -> Result<Delivery> {
        let mut attempt = 0u32;
        loop {
            match self.sender.send(out).await {
                Ok(id) => return Ok(Delivery::Sent(id)),
                Err(SendError::Transient(why)) => {
                    self.watchdog.tick();
                    attempt += 1;
                    tracing::warn!(attempt, error = %why, "send failed; retrying");
                    if !self.shutdown.sleep(backoff(attempt)).await {
                        return Ok(Delivery::Interrupted);
                    }
                    // `Transient` means not delivered, so `retry` stays as it was.
                }
                Err(SendError::Permanent(why)) => {
                    return Ok(Delivery::Failed(FailedNotice::new("failed", why)))
                }
                Err(SendError::Uncertain(why)) => {
                    return Ok(Delivery::Failed(FailedNotice::new(
                        "uncertain",
                        format!("delivery uncertain, not retried: {why}"),
                    )))
                }
            }
        }
    }

    /// Copies the entry to the dead letter, tells the agent, acks.
    pub(super) async fn dead_letter(
        &mut self,
        idx: usize,
        entry: &Entry,
        n: impl AsNotice,
    ) -> Result<()> {
        let n = n.as_notice();
        tracing::warn!(stream = %self.sources[idx].key, entry = %entry.id, reason = n.reason, "entry refused");
        self.dead_letter_only(idx, entry, &n).await?;
        self.notice(idx, &entry.id, Some(entry), n).await?;
        self.ack(&self.sources[idx].key.clone(), &entry.id).await
    }

    pub(super) async fn dead_letter_only(
        &mut self,
        idx: usize,
        entry: &Entry,
        n: &Notice<'_>,
    ) -> Result<()> {
        let source = &self.sources[idx];
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("reason", n.reason.as_bytes()),
            ("status", n.status.as_bytes()),
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
        idx: usize,
        entry_id: &str,
        entry: Option<&Entry>,
        mut n: Notice<'_>,
    ) -> Result<()> {
        let source = self.sources[idx].clone();
        n.stream = &source.key;
        n.entry_id = entry_id;
        if n.request_id.is_none() {
            n.request_id = entry.and_then(|e| e.text("request_id"));
        }
        let inbox = keys::inbox_for(source.agent.as_deref(), &self.name);
        self.store.xadd(&inbox, &n.fields()).await?;
        Ok(())
    }

    pub(super) async fn ack(&mut self, stream: &str, id: &str) -> Result<()> {
        let group = self.group.clone();
        self.store.ack(stream, &group, &[id]).await
    }
}

/// The outcome of a send after retries.
pub(super) enum Delivery {
    Sent(String),
    Failed(FailedNotice),
    /// Shutdown came during a retry wait: leave the entry pending.
    Interrupted,
}

/// An owned notice for a failed delivery.
pub(super) struct FailedNotice {
    status: &'static str,
    pub(super) reason: String,
    approval_id: Option<String>,
}

impl FailedNotice {
    pub(super) fn new(status: &'static str, reason: impl Into<String>) -> Self {
        FailedNotice {
            status,
            reason: reason.into(),
            approval_id: None,
        }
    }

    pub(super) fn with_approval(mut self, id: &str) -> Self {
        self.approval_id = Some(id.to_string());
        self
    }
}

pub(super) trait AsNotice {
    fn as_notice(&self) -> Notice<'_>;
}

impl AsNotice for Notice<'_> {
    fn as_notice(&self) -> Notice<'_> {
        self.clone()
    }
}

impl AsNotice for FailedNotice {
    fn as_notice(&self) -> Notice<'_> {
        Notice {
            status: self.status,
            reason: &self.reason,
            approval_id: self.approval_id.as_deref(),
            ..Notice::default()
        }
    }
}
