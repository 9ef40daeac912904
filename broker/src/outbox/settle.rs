//! Settling: acting on a decided or expired record, and closing it.
//!
//! Invariants:
//! - An approved entry is re-read from its stream and its whole-message digest
//!   compared with the record's before it is sent; a mismatch is refused.
//! - Settling marks the record `settled_at` and `outcome` (with a Redis TTL as a
//!   safety net) before acking. Once a notification was written, the notify side
//!   owns the record: the outcome entry (recorded as `outcome_sent`) follows the
//!   notification in the same stream, and the notify side deletes the record once
//!   its card shows the outcome. Without a notification the record is deleted
//!   here. A crash at any step repeats none of the others.

use super::*;

impl<S: Sender> OutboxService<S> {
    /// Acts on a parked entry's record: deliver on approved, notice on rejected or
    /// expired, nothing while pending.
    pub(super) async fn settle(&mut self, id: String) -> Result<()> {
        let Some(parked) = self.parked.get(&id).cloned() else {
            return Ok(());
        };
        let idx = parked.source;
        let Some(record) = approval::load(&mut self.store, &id).await? else {
            let n = Notice {
                status: "failed",
                reason: "the approval record disappeared; not sent",
                approval_id: Some(&id),
                ..Notice::default()
            };
            self.notice(idx, &parked.entry_id, None, n).await?;
            return self
                .finish(
                    idx,
                    &parked.entry_id,
                    &Record {
                        id,
                        ..Record::default()
                    },
                    None,
                )
                .await;
        };
        if record.fields.contains_key("settled_at") {
            return self.finish(idx, &parked.entry_id, &record, None).await;
        }
        // Approved in time stays approved while its delivery waits for a retry,
        // even once the deadline has passed.
        let state = match record.approved_in_time() {
            true => State::Approved,
            false => record.state(crate::now_secs_f64()),
        };
        match state {
            State::Pending => Ok(()),
            State::Approved => self.deliver_approved(idx, &parked.entry_id, record).await,
            State::Rejected | State::Expired => {
                let timeout_reason = format!(
                    "no decision within {} seconds",
                    self.bridge.approval.timeout
                );
                let reason = match state {
                    State::Expired => timeout_reason.as_str(),
                    _ => record.get("reason"),
                };
                let request_id = record.get("request_id").to_string();
                let n = Notice {
                    status: state.as_str(),
                    reason,
                    approval_id: Some(&id),
                    approver: (state == State::Rejected).then(|| record.get("approver")),
                    request_id: Some(&request_id),
                    ..Notice::default()
                };
                self.notice(idx, &parked.entry_id, None, n).await?;
                tracing::info!(approval = %id, state = state.as_str(), "parked entry dropped");
                self.finish(idx, &parked.entry_id, &record, Some(state.as_str()))
                    .await
            }
        }
    }

    pub(super) async fn deliver_approved(
        &mut self,
        idx: usize,
        entry_id: &str,
        record: Record,
    ) -> Result<()> {
        let key = self.sources[idx].key.clone();
        let id = record.id.clone();
        let Some(entry) = self.store.entry(&key, entry_id).await? else {
            let n = Notice {
                status: "failed",
                reason: "the entry was deleted from its stream before delivery",
                approval_id: Some(&id),
                ..Notice::default()
            };
            self.notice(idx, entry_id, None, n).await?;
            return self.finish(idx, entry_id, &record, Some("failed")).await;
        };
        let checked = Message::from_entry(&entry, &self.bridge).and_then(|m| {
            let sha = m.sha256();
            if sha == record.get("message_sha256") {
                Ok(m)
            } else {
                Err(format!(
                    "message sha256 {sha} differs from the approved {}; not sent",
                    record.get("message_sha256")
                ))
            }
        });
        let message = match checked {
            Ok(m) => m,
            Err(reason) => {
                let n = Notice {
                    status: "failed",
                    reason: &reason,
                    approval_id: Some(&id),
                    ..Notice::default()
                };
                self.dead_letter_only(idx, &entry, &n).await?;
                self.notice(idx, entry_id, Some(&entry), n).await?;
                return self.finish(idx, entry_id, &record, Some("failed")).await;
            }
        };
        let dkey = delivery_key(&key, entry_id);
        if self.retries.scheduled.contains(&dkey) {
            return Ok(()); // waits for its retry time
        }
        let retry = record.fields.contains_key("delivery_started");
        if !retry {
            set_if_exists(
                &mut self.store,
                &id,
                &[("delivery_started", &crate::now_secs().to_string())],
            )
            .await?;
        }
        let out = Outgoing {
            message: &message,
            delivery_key: &dkey,
            retry,
            approval: None,
        };
        match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                tracing::info!(approval = %id, external_id, approver = record.get("approver"), "approved entry delivered");
                self.finish(idx, entry_id, &record, Some("approved")).await
            }
            Delivery::Failed(failed) => {
                let failed = failed.with_approval(&id);
                let n = failed.as_notice();
                self.dead_letter_only(idx, &entry, &n).await?;
                self.notice(idx, entry_id, Some(&entry), n.clone()).await?;
                // `uncertain` is shown as such: the message may have gone out.
                self.finish(idx, entry_id, &record, Some(n.status)).await
            }
            Delivery::Deferred(due) => {
                // Not delivered, so the next attempt is not a retry.
                let key = keys::approval(&id);
                let _: i64 = self
                    .store
                    .conn
                    .hdel(&key, "delivery_started")
                    .await
                    .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
                // Decided: its deadline no longer wakes the loop.
                if let Some(p) = self.parked.get(&id) {
                    self.deadlines.remove(&(p.expires_at, id.clone()));
                }
                self.retries
                    .defer(dkey, due, Job::Approved { approval_id: id });
                Ok(())
            }
        }
    }

    /// Marks the record settled with its outcome, tells the notify bridge, acks the
    /// entry, and closes the record. Once a notification was written the notify
    /// side owns the rest: the record stays (with its TTL) until the outcome entry,
    /// which follows the notification in the same stream, has been shown and the
    /// notify side deletes it. Each step is recorded, so a crash repeats none.
    pub(super) async fn finish(
        &mut self,
        idx: usize,
        entry_id: &str,
        record: &Record,
        outcome: Option<&str>,
    ) -> Result<()> {
        let key = keys::approval(&record.id);
        let exists = !record.fields.is_empty();
        let handed_over = record.fields.contains_key("notified");
        let outcome = outcome
            .or(Some(record.get("outcome")).filter(|o| !o.is_empty()))
            .unwrap_or("failed");
        if exists && !record.fields.contains_key("settled_at") {
            let _: () = redis::pipe()
                .atomic()
                .cmd("HSET")
                .arg(&key)
                .arg("settled_at")
                .arg(crate::now_secs())
                .arg("outcome")
                .arg(outcome)
                .ignore()
                .expire(&key, SETTLED_TTL_SECS)
                .ignore()
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("HSET {key}"), e))?;
        }
        // Acked before the outcome entry exists: once the notify side sees the
        // outcome it deletes the record, and an unacked entry would then be
        // parked again as if new.
        self.ack(&self.sources[idx].key.clone(), entry_id).await?;
        if handed_over && !record.fields.contains_key("outcome_sent") {
            let fields: Vec<(&str, &[u8])> = vec![
                ("approval_id", record.id.as_bytes()),
                ("approval_outcome", outcome.as_bytes()),
            ];
            match self
                .store
                .xadd(&keys::outbox(record.get("notify")), &fields)
                .await
            {
                Ok(_) => {
                    set_if_exists(&mut self.store, &record.id, &[("outcome_sent", "1")]).await?;
                }
                // A refusing stream (see `notify`) only costs the card its closing edit.
                Err(Error::Redis(e)) if refused_by_stream(&e) => {
                    tracing::warn!(approval = %record.id, error = %e, "outcome not written");
                }
                Err(e) => return Err(e),
            }
        }
        let external = record.get("notify_external_id");
        let mut pipe = redis::pipe();
        if !record.id.is_empty() {
            pipe.zrem(keys::pending(&self.name), &record.id).ignore();
        }
        if !external.is_empty() {
            pipe.hdel(keys::approval_map(record.get("notify")), external)
                .ignore();
        }
        if !handed_over && !record.id.is_empty() {
            pipe.del(&key).ignore();
        }
        // An empty pipeline is an error in redis-rs: send one only with commands.
        if !record.id.is_empty() {
            let _: () = pipe
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        }
        self.untrack(&record.id);
        Ok(())
    }
}

/// Sets record fields unless the record is gone; returns whether it existed.
pub(super) async fn set_if_exists(
    store: &mut Store,
    id: &str,
    fields: &[(&str, &str)],
) -> Result<bool> {
    let key = keys::approval(id);
    let set: i64 = redis::Script::new(approval::SET_IF_EXISTS)
        .key(&key)
        .arg(fields)
        .invoke_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("EVALSHA set {key}"), e))?;
    Ok(set == 1)
}
