//! The notify side: showing approval notifications and their outcomes.
//!
//! Invariants:
//! - Only the requesting service can ask. An entry carrying `approval_id` is
//!   shown only when its digest is the record's `notify_sha256` and it is the
//!   first such entry (the record's `notify_entry` claim, one Lua step); its
//!   destination is the record's `notify_channel`, which must also pass this
//!   bridge's `destinations`. Anything else is dead-lettered.
//! - Only real outcomes change a card. An outcome entry carries `approval_id`
//!   and `approval_outcome` only; it is acted on when the record exists, is
//!   settled with that outcome and names this bridge, and the card's text is
//!   built from the record. Then the record is deleted.

use super::*;

impl<S: Sender> OutboxService<S> {
    /// An entry carrying `approval_id` on the flat outbox: shown only when it is the
    /// one notification the requesting service wrote for a pending approval. One
    /// handed out more than `max_deliveries` times (its send kills workers) is not
    /// tried again: a genuine one rejects its approval, so the agent hears why.
    pub(super) async fn handle_notification(
        &mut self,
        idx: usize,
        entry: &Entry,
        deliveries: u64,
    ) -> Result<()> {
        let retry = deliveries > 1;
        let id = entry.text("approval_id").unwrap_or_default().to_string();
        if self
            .retries
            .scheduled
            .contains(&delivery_key(&self.sources[idx].key, &entry.id))
        {
            return Ok(()); // waits for its retry time
        }
        let (record, message) = match self.check_notification(entry, &id).await? {
            Ok(checked) => checked,
            Err(reason) => {
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    approval_id: Some(&id),
                    ..Notice::default()
                };
                return self.dead_letter(idx, entry, n).await;
            }
        };
        if self.is_poison(deliveries) {
            let reason = format!(
                "the notification was handed to a worker {deliveries} times without being shown (max_deliveries = {})",
                self.bridge.max_deliveries
            );
            approval::reject_unshown(&mut self.store, &record, &self.name, &reason).await?;
            let n = FailedNotice::new("failed", reason).with_approval(&id);
            return self.dead_letter(idx, entry, n).await;
        }
        let key = delivery_key(&self.sources[idx].key, &entry.id);
        let out = Outgoing {
            message: &message,
            delivery_key: &key,
            retry,
            approval: Some(&record),
        };
        match self.deliver(out).await? {
            Delivery::Sent(external_id) => {
                // One round trip: the map entry, the record's note of the card, the ack.
                let map = keys::approval_map(&self.name);
                let set = redis::Script::new(approval::SET_IF_EXISTS);
                let mut note = set.key(keys::approval(&id));
                note.arg("notify_external_id").arg(&external_id);
                let stream = self.sources[idx].key.clone();
                let (kept,): (i64,) = redis::pipe()
                    .hset(&map, &external_id, &id)
                    .ignore()
                    .load_script(&set)
                    .ignore()
                    .invoke_script(&note)
                    .xack(&stream, &self.group, &[&entry.id])
                    .ignore()
                    .query_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis(&format!("HSET {map}"), e))?;
                if kept == 0 {
                    // Settled and gone while the card was being posted: answers to it
                    // could only be late, so it is not kept as an answerable card.
                    let _: i64 = self
                        .store
                        .conn
                        .hdel(&map, &external_id)
                        .await
                        .map_err(|e| Error::from_redis(&format!("HDEL {map}"), e))?;
                }
                tracing::info!(approval = %id, external_id, "approval notification delivered");
                Ok(())
            }
            Delivery::Failed(n) => {
                approval::reject_unshown(&mut self.store, &record, &self.name, &n.reason).await?;
                self.dead_letter(idx, entry, n.with_approval(&id)).await
            }
            Delivery::Deferred(due) => {
                let job = Job::Notification {
                    source: idx,
                    entry: entry.clone(),
                    deliveries,
                };
                self.retries.defer(key, due, job);
                Ok(())
            }
        }
    }

    /// Verifies a notification entry against its record and claims the record for
    /// it. `Ok(Err(reason))` is a refusal; the entry then goes to the dead letter.
    pub(super) async fn check_notification(
        &mut self,
        entry: &Entry,
        id: &str,
    ) -> Result<std::result::Result<(Record, Message), String>> {
        if !self.config.is_approval_surface(&self.name) {
            return Ok(Err(format!(
                "bridge `{}` carries no approval notifications (no bridge with approval.required names it as notify)",
                self.name
            )));
        }
        if !approval::is_id(id) {
            return Ok(Err(format!("approval `{id}` does not exist")));
        }
        let digest = approval::fields_sha256(
            entry
                .fields
                .iter()
                .map(|(k, v)| (k.as_str(), Some(v.as_slice()))),
        );
        let key = keys::approval(id);
        let (claim, fields): (String, HashMap<String, String>) =
            redis::Script::new(approval::CLAIM)
                .key(&key)
                .arg(&self.name)
                .arg(&entry.id)
                .arg(&digest)
                .invoke_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("EVALSHA claim {key}"), e))?;
        if fields.is_empty() {
            return Ok(Err(format!("approval `{id}` does not exist")));
        }
        let record = Record {
            id: id.to_string(),
            fields,
        };
        if record.get("notify") != self.name
            || self.config.notify_bridge(record.source()) != self.name
        {
            return Ok(Err(format!(
                "approval `{id}` does not notify through bridge `{}`",
                self.name
            )));
        }
        match record.state(crate::now_secs_f64()) {
            State::Pending => {}
            other => return Ok(Err(format!("approval `{id}` is {}", other.as_str()))),
        }
        let refusal = match claim.as_str() {
            "ok" => None,
            "digest" => Some(format!(
                "not the notification the requesting service wrote for approval `{id}` (its digest differs); not shown"
            )),
            "claimed" => Some(format!(
                "approval `{id}` was already notified by entry {}; a second notification is not shown",
                record.get("notify_entry")
            )),
            "missing" => Some(format!("approval `{id}` does not exist")),
            "settled" => Some(format!("approval `{id}` is settled")),
            other => Some(format!("approval `{id}` cannot be notified here ({other})")),
        };
        if let Some(reason) = refusal {
            tracing::warn!(approval = %id, entry = %entry.id, reason, "forged or repeated notification refused");
            return Ok(Err(reason));
        }
        // Genuine from here on: a refusal now is one no human saw, so the
        // approval is rejected at once and the agent told.
        let channel = record.get("notify_channel").to_string();
        if !self.bridge.allows_destination(&channel) {
            let reason = format!(
                "notify_channel `{channel}` of approval `{id}` is not on this bridge's `destinations` allow-list"
            );
            approval::reject_unshown(&mut self.store, &record, &self.name, &reason).await?;
            return Ok(Err(reason));
        }
        let text = |name: &str| entry.text(name).map(str::to_string);
        let message = Message {
            channel_id: channel,
            content: text("content").unwrap_or_default(),
            approval_id: Some(id.to_string()),
            approval_content: text("approval_content"),
            ..Message::default()
        };
        Ok(Ok((record, message)))
    }

    /// An outcome entry written by a requesting service when it settled an
    /// approval this bridge notified: acted on only when the record confirms it,
    /// and shown from the record, never from the entry's text.
    pub(super) async fn handle_outcome(&mut self, idx: usize, entry: &Entry) -> Result<()> {
        let id = entry.text("approval_id").unwrap_or("").to_string();
        let claimed = entry.text("approval_outcome").unwrap_or("");
        // Off an approval surface the record is not even read (no rights on it).
        let record = if approval::is_id(&id) && self.config.is_approval_surface(&self.name) {
            approval::load(&mut self.store, &id).await?
        } else {
            None
        };
        let refusal = match &record {
            _ if entry.fields.len() != 2 => {
                Some("outcome entries carry `approval_id` and `approval_outcome` only".to_string())
            }
            None => Some(format!("no settled approval `{id}` to show an outcome for")),
            Some(r) if r.get("notify") != self.name => Some(format!(
                "approval `{id}` was not notified through this bridge"
            )),
            Some(r) if !r.fields.contains_key("settled_at") => {
                Some(format!("approval `{id}` is not settled"))
            }
            Some(r) if r.get("outcome") != claimed => Some(format!(
                "the outcome `{claimed}` is not the record's `{}`",
                r.get("outcome")
            )),
            Some(_) => None,
        };
        let record = match (refusal, record) {
            (None, Some(r)) => r,
            (reason, _) => {
                let reason = reason.unwrap_or_default();
                tracing::warn!(approval = %id, reason, "forged outcome refused");
                let n = Notice {
                    status: "invalid",
                    reason: &reason,
                    ..Notice::default()
                };
                return self.dead_letter(idx, entry, n).await;
            }
        };
        let external = record.get("notify_external_id");
        if !external.is_empty() {
            let update = Outcome {
                outcome: record.get("outcome"),
                external_id: external,
                channel_id: record.get("notify_channel"),
                record: &record,
            };
            if let Err(e) = self.sender.update(update).await {
                tracing::warn!(approval = %record.id, error = %e, "could not show the outcome on the notification");
            }
        }
        let key = keys::approval(&record.id);
        let mut pipe = redis::pipe();
        pipe.del(&key).ignore();
        if !external.is_empty() {
            pipe.hdel(keys::approval_map(&self.name), external).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        self.ack(&self.sources[idx].key.clone(), &entry.id).await
    }
}
