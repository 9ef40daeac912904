//! The notify side: showing approval notifications and their outcomes.
//!
//! Invariants:
//! - Only the requesting service can ask. An entry carrying `approval_id` is
//!   shown only when it has exactly a notification's fields (checked first:
//!   the digest frames values, not names) and its digest is this surface's
//!   card's `notify_sha256` on the record and it is the first such entry (the
//!   card's `notify_entry` claim, one Lua step); its destination is the channel the config gives
//!   this surface for the asking bridge (never the record's, which every
//!   surface of the approval can write), which must also pass this bridge's
//!   `destinations`. Anything else is dead-lettered. Its frame, and the lines
//!   of a platform's own card that say what the message is and whose, are
//!   drawn from the notification's `approval_frame`, never from the record.
//! - A card's map entry (only this surface writes its map) holds the digest
//!   of the version the card shows: answers to it bind to that version.
//! - A reminder (`reminder`, acted on only while the record says it was
//!   reminded and is unsettled) asks the platform to remind the approvers of
//!   a live card once; its text comes from the record.
//! - A snooze or an escalation step redraws a live card (`snoozed`,
//!   `escalated`: acted on only while the record is snoozed or escalated and
//!   unsettled, for a card this surface's map gives to the approval, once per
//!   change the config allows), from the record and the notification's own
//!   content in this bridge's stream.
//! - Only real outcomes change a card. An outcome entry carries `approval_id`
//!   and `approval_outcome` only; it is acted on when the record exists, is
//!   settled with that outcome and names this bridge, and the card's text is
//!   built from the record. Then the record is deleted, when it has no other
//!   card (else its TTL deletes it).

use super::inflight::Gate;
use super::*;
use crate::approval::repo::{ClaimRequest, Claimed};

/// The outcome entry an edit writes for the card of the version it replaced.
const SUPERSEDED: &str = "superseded";

/// How many snooze redraws and reminders are remembered (see `Memory::redrawn`).
const REDRAWN_KEPT: usize = 10_000;

/// A notification shown on the platform, waiting to be recorded.
pub(super) struct Shown {
    stream: String,
    entry_id: String,
    approval_id: String,
    external_id: String,
    /// The digest of the version the card shows (what answers to it bind).
    digest: String,
    /// The requesting bridge, whose audit trail records the card.
    requester: String,
    /// Its worker, woken to say the card is shown (so it need not read).
    worker: String,
    /// The send's gate: its in-flight mark (and one taken over) goes once the
    /// card is recorded and its entry acked.
    gate: Gate,
    key: String,
}

impl<S: Sender> OutboxService<S> {
    /// Claims the records of a batch's notifications in one round trip; each is
    /// then checked as it is handled ([`Self::check_notification`]).
    pub(super) async fn prefetch_claims(&mut self, batch: &StreamBatch) -> Result<()> {
        if !self.config.is_approval_surface(&self.name) {
            return Ok(());
        }
        let flat = keys::outbox(&self.name);
        let mut asked = Vec::new();
        for (key, entries) in batch {
            if *key != flat {
                continue;
            }
            for (entry_id, fields) in entries {
                let Some(fields) = fields else { continue };
                if Class::of_fields(Kind::Flat, fields) != Class::Notification {
                    continue;
                }
                let get = |n: &str| fields.iter().find(|(k, _)| k == n).map(|(_, v)| v);
                let Some(id) = get(crate::fields::outbox::APPROVAL_ID)
                    .and_then(|v| std::str::from_utf8(v).ok())
                else {
                    continue;
                };
                if !approval::asked_through(&self.config, &self.name, id) {
                    continue;
                }
                // Refused when handled, never claimed (see `check_notification`).
                if !approval::is_notification_layout(fields.iter().map(|(k, _)| k.as_str())) {
                    continue;
                }
                let digest = approval::entry_sha256(fields);
                asked.push((id, entry_id.as_str(), digest));
            }
        }
        if asked.len() < 2 {
            return Ok(()); // one is claimed as it is handled
        }
        let requests: Vec<ClaimRequest> = asked
            .iter()
            .map(|(id, entry_id, digest)| ClaimRequest {
                id,
                entry_id,
                digest,
            })
            .collect();
        let claims = Approvals::on(&mut self.store)
            .claim_many(&self.name, &requests)
            .await?;
        self.mem.claims.extend(
            asked
                .iter()
                .map(|(_, entry_id, _)| entry_id.to_string())
                .zip(claims),
        );
        Ok(())
    }

    /// Records the shown notifications when due, as acks are
    /// ([`Self::flush_due`]): one round trip for many cards (recording what
    /// had landed at every turn of the loop cost about three a card), while
    /// a card stays unanswerable only briefly.
    pub(super) async fn flush_shown_due(&mut self) -> Result<()> {
        if self.flush_due(self.mem.shown.len(), self.mem.shown_since) {
            self.flush_shown().await?;
        }
        Ok(())
    }

    /// Records the shown notifications in one round trip: each card's map entry,
    /// the record's note of it, the ack. A record settled and gone meanwhile keeps
    /// no answerable card: answers to it could only be late.
    pub(super) async fn flush_shown(&mut self) -> Result<()> {
        self.mem.shown_since = None;
        if self.mem.shown.is_empty() {
            return Ok(());
        }
        let shown = std::mem::take(&mut self.mem.shown);
        let cards: Vec<(&str, &str, &str, &str)> = shown
            .iter()
            .map(|s| {
                (
                    s.approval_id.as_str(),
                    s.entry_id.as_str(),
                    s.external_id.as_str(),
                    s.digest.as_str(),
                )
            })
            .collect();
        let mut by_stream: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for s in &shown {
            by_stream.entry(&s.stream).or_default().push(&s.entry_id);
        }
        let group = &self.group;
        let at = self.clock.now_secs_f64();
        let events: Vec<audit::Event> = shown
            .iter()
            .map(|s| {
                audit::Event::new(&s.requester, audit::Kind::Notified, &s.approval_id, at)
                    .with(audit::field::NOTIFY, &self.name)
                    .with(audit::field::EXTERNAL_ID, &s.external_id)
            })
            .collect();
        let retention = self.config.audit.retention_days;
        let kept = Approvals::on(&mut self.store)
            .record_shown(&self.name, &cards, |pipe| {
                for (stream, ids) in &by_stream {
                    pipe.xack(*stream, group, ids).ignore();
                }
                audit::prepare(pipe);
                audit::add_all_to(pipe, &events, retention);
            })
            .await?;
        // Once noted (on a cluster the notes and a wake-up may go to different
        // nodes, so not in the same pipeline), and only for the cards noted:
        // the requester stops watching for these without reading them. A
        // lost hint costs the requester a read at its next sweep, nothing more.
        let mut wakes = redis::pipe();
        for (s, _) in shown.iter().zip(&kept).filter(|(_, k)| **k) {
            let what = approval::Wake::Shown(&self.name);
            let wake = approval::wake_cmd(&s.requester, &s.worker, &s.approval_id, what);
            wakes.add_command(wake).ignore();
        }
        if kept.iter().any(|k| *k) {
            let woken: redis::RedisResult<()> = wakes.query_async(&mut self.store.conn).await;
            if let Err(e) = woken {
                tracing::warn!(error = %e, "the requesters were not told their cards are shown; their sweeps read them");
            }
        }
        // Recorded and acked: a restart no longer shows them again.
        let marks: Vec<&str> = shown.iter().map(|s| s.key.as_str()).collect();
        self.clear_acked_in_flight(&marks).await?;
        for s in &shown {
            self.forget_taken_mark(&s.gate, &s.key).await?;
        }
        Ok(())
    }

    /// An entry carrying `approval_id` on the flat outbox: shown only when it is the
    /// one notification the requesting service wrote for a pending approval. One
    /// handed out more than `max_deliveries` times (its send kills workers) is not
    /// tried again: a genuine one rejects its approval, so the agent hears why.
    pub(super) async fn handle_notification(
        &mut self,
        src: SourceId,
        entry: &Entry,
        deliveries: u64,
    ) -> Result<()> {
        let retry = deliveries > 1;
        let id = entry
            .text(crate::fields::outbox::APPROVAL_ID)
            .unwrap_or_default()
            .to_string();
        if self
            .mem
            .sched
            .is_scheduled(&delivery_key(&self.sources[src].key, &entry.id))
        {
            return Ok(()); // waits for its retry time
        }
        let (record, message) = match self.check_notification(entry, &id).await? {
            Ok(checked) => checked,
            Err(reason) => {
                let n = Notice::new(NoticeStatus::Invalid, reason).approval(&id);
                return self.dead_letter(src, entry, n).await;
            }
        };
        if self.is_poison(deliveries) {
            let reason = format!(
                "the notification was handed to a worker {deliveries} times without being shown (max_deliveries = {})",
                self.bridge.max_deliveries
            );
            approval::reject_unshown(
                &mut self.store,
                &self.config,
                &self.clock,
                &record,
                &self.name,
                &reason,
            )
            .await?;
            let n = Notice::new(NoticeStatus::Failed, reason).approval(&id);
            return self.dead_letter(src, entry, n).await;
        }
        let stream = self.sources[src].key.clone();
        let key = delivery_key(&stream, &entry.id);
        // Fenced like every send: a worker that stalled before its platform
        // call shows nothing once another took the entry over. Marked with
        // the rest of the batch.
        let flight = Flight {
            gate: Gate::Mine(self.worker.clone()),
            fenced: false,
            unreplicated: false,
            skipped: false,
            source: src,
            entry: entry.clone(),
            message,
            retry,
            key,
            purpose: Purpose::Notification {
                record: Box::new(record),
                deliveries,
            },
        };
        // Scheduled from now, so it is not asked twice while its mark is taken.
        self.mem.sched.begin(flight.key.clone());
        self.mem.to_mark.push(Unmarked {
            flight,
            marking: Marking::Card,
            needs_mark: true,
        });
        Ok(())
    }

    /// Records the outcome of showing a notification; what waits behind it
    /// is for the caller to start (a card of a run leaves that to the run's end).
    pub(super) async fn record_notification(
        &mut self,
        f: Flight,
        record: Record,
        deliveries: u64,
        result: std::result::Result<Sent, SendError>,
    ) -> Result<()> {
        self.mem.sched.end(&f.key);
        let key = f.key.clone();
        let gate = f.gate.clone();
        let (src, id) = (f.source, record.id.clone());
        match self.outcome_of(&f.key, f.unreplicated, result) {
            Delivery::Sent(external_id, _) => {
                tracing::info!(approval = %id, external_id, "approval notification delivered");
                // Recorded with the others shown in the last ACK_DELAY, so a card
                // is answerable (its map entry written) soon after it appears.
                self.mem.shown.push(Shown {
                    stream: self.sources[src].key.clone(),
                    entry_id: f.entry.id.clone(),
                    approval_id: id,
                    external_id,
                    digest: record.message_sha256.clone(),
                    requester: record.source().to_string(),
                    worker: record.worker.clone(),
                    gate,
                    key: key.clone(),
                });
                // Recorded when due, by the same rule as acks (`collect`).
                self.mem.shown_since.get_or_insert_with(Instant::now);
            }
            Delivery::Failed(n) => {
                let n = *n;
                approval::reject_unshown(
                    &mut self.store,
                    &self.config,
                    &self.clock,
                    &record,
                    &self.name,
                    &n.reason,
                )
                .await?;
                self.dead_letter(src, &f.entry, n.approval(&id)).await?;
                self.clear_in_flight(&[&key]).await?;
                self.forget_taken_mark(&gate, &key).await?;
            }
            Delivery::Deferred(due) => {
                // Not shown: the mark goes; the retry marks it again.
                self.clear_in_flight(&[&key]).await?;
                let job = Job::Notification {
                    source: src,
                    entry: f.entry,
                    deliveries,
                };
                self.mem.sched.defer(f.key, due, job);
            }
        }
        // An outcome that arrived while the card was being sent acts now: on
        // the card if it was shown, else on the record alone.
        if let Some((source, entry)) = self.mem.outcomes_waiting.remove(&key) {
            self.handle_outcome(source, &entry, false).await?;
        }
        Ok(())
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
        if !approval::asked_through(&self.config, &self.name, id) {
            return Ok(Err(format!(
                "approval `{id}` does not exist among the bridges that ask through `{}`",
                self.name
            )));
        }
        // Before the digest: only these names make its bytes unambiguous.
        if !approval::is_notification_layout(entry.fields.iter().map(|(k, _)| k.as_str())) {
            return Ok(Err(format!(
                "not a notification's fields (`approval_id`, `channel_id`, `approval_frame`, `approval_content`, in that order, `approval_content` left out when the record's preview holds the message, or an earlier version's with `content`) for approval `{id}`; not shown"
            )));
        }
        let digest = approval::entry_sha256(&entry.fields);
        let claim = match self.mem.claims.remove(&entry.id) {
            Some(claimed) => claimed,
            None => {
                let request = ClaimRequest {
                    id,
                    entry_id: &entry.id,
                    digest: &digest,
                };
                Approvals::on(&mut self.store)
                    .claim_many(&self.name, &[request])
                    .await?
                    .remove(0)
            }
        };
        let Some(record) = claim.record else {
            return Ok(Err(format!("approval `{id}` does not exist")));
        };
        let claim = claim.answer;
        // Shown only where the config says this surface shows the asking
        // bridge's cards: any surface's password can write the record's
        // card fields, so the record's channel is never read.
        let configured = self
            .config
            .card_channel_at(record.source(), &self.name, record.escalated);
        let card = record.card(&self.name);
        let (Some(card), Some(configured)) = (card, configured) else {
            return Ok(Err(format!(
                "approval `{id}` does not notify through bridge `{}`",
                self.name
            )));
        };
        match record.state(self.clock.now_secs_f64()) {
            State::Pending => {}
            other => return Ok(Err(format!("approval `{id}` is {}", other.as_str()))),
        }
        let refusal = match claim {
            Claimed::Ok => None,
            Claimed::Digest => Some(format!(
                "not the notification the requesting service wrote for approval `{id}` (its digest differs); not shown"
            )),
            Claimed::Claimed => Some(format!(
                "approval `{id}` was already notified by entry {}; a second notification is not shown",
                card.entry.as_deref().unwrap_or("")
            )),
            Claimed::Missing => Some(format!("approval `{id}` does not exist")),
            Claimed::Settled => Some(format!("approval `{id}` is settled")),
            Claimed::NotOurs => Some(format!(
                "approval `{id}` cannot be notified here (it is not asked through this bridge)"
            )),
        };
        if let Some(reason) = refusal {
            tracing::warn!(approval = %id, entry = %entry.id, reason, "forged or repeated notification refused");
            return Ok(Err(reason));
        }
        // Genuine from here on: a refusal now is one no human saw, so the
        // approval is rejected at once and the agent told.
        let channel = configured.to_string();
        // Drawn from the entry's own values, which its digest binds (a
        // genuine one always parses), read once: the frame, and the record
        // a platform that lays out its own card draws from, its header
        // values the entry's (a refusal below acts on the record as read).
        let approval::Drawn {
            text: framed,
            content,
            record: drawn,
        } = approval::drawn_notification(&record, |name| entry.text(name));
        // A card that cannot be drawn from a record that no longer binds it
        // (an edit landed between the claim and the read of the record: its
        // preview is the new version's) is superseded, not unshowable: the
        // edit writes the new version's card, which must not be rejected.
        if framed.is_none() && card.sha256 != digest {
            return Ok(Err(format!(
                "approval `{id}` changed after this notification was claimed (it binds another now); not shown"
            )));
        }
        let refused = if !self.bridge.allows_destination(&channel) {
            Some(format!(
                "notify_channel `{channel}` of approval `{id}` is not on this bridge's `destinations` allow-list"
            ))
        } else if framed.is_none() {
            Some(format!(
                "the notification of approval `{id}` holds no frame that can be drawn"
            ))
        } else {
            None
        };
        if let Some(reason) = refused {
            approval::reject_unshown(
                &mut self.store,
                &self.config,
                &self.clock,
                &record,
                &self.name,
                &reason,
            )
            .await?;
            return Ok(Err(reason));
        }
        let message = Message {
            channel_id: channel,
            content: framed.unwrap_or_default(),
            approval_id: Some(id.to_string()),
            approval_content: content,
            ..Message::default()
        };
        Ok(Ok((drawn, message)))
    }

    /// An outcome entry written by a requesting service when it settled an
    /// approval this bridge notified: acted on only when the record confirms it,
    /// and shown from the record, never from the entry's text.
    /// `may_wait`: an outcome for a card whose send is under way waits for it
    /// (once; then it is acted on as the record is).
    pub(super) async fn handle_outcome(
        &mut self,
        src: SourceId,
        entry: &Entry,
        may_wait: bool,
    ) -> Result<()> {
        // Cards shown but not yet recorded get their external ids first.
        self.flush_shown().await?;
        let id = entry
            .text(crate::fields::outbox::APPROVAL_ID)
            .unwrap_or("")
            .to_string();
        let claimed = entry
            .text(crate::fields::outbox::APPROVAL_OUTCOME)
            .unwrap_or("");
        // Off an approval surface the record is not even read (no rights on it).
        let record = if approval::asked_through(&self.config, &self.name, &id) {
            Approvals::on(&mut self.store).load(&id).await?
        } else {
            None
        };
        // This surface's card of it.
        let card = record
            .as_ref()
            .and_then(|r| r.card(&self.name))
            .unwrap_or_default();
        let refusal = match &record {
            _ if entry.fields.len() != 2 => {
                Some("outcome entries carry `approval_id` and `approval_outcome` only".to_string())
            }
            None => Some(format!("no settled approval `{id}` to show an outcome for")),
            Some(r) if r.card(&self.name).is_none() => Some(format!(
                "approval `{id}` was not notified through this bridge"
            )),
            // An edit: the record's earlier cards say so; the record lives on.
            Some(_) if claimed == SUPERSEDED && !card.superseded.is_empty() => None,
            Some(_) if claimed == SUPERSEDED => {
                Some(format!("approval `{id}` has no superseded card"))
            }
            // A snooze: the live card shows the new deadline.
            Some(r) if claimed == approval::snooze::OUTCOME && r.snoozes > 0 && !r.is_settled() => {
                None
            }
            Some(_) if claimed == approval::snooze::OUTCOME => {
                Some(format!("approval `{id}` is not snoozed and waiting"))
            }
            // An escalation step: the live card says who else is asked.
            Some(r)
                if claimed == super::escalate::OUTCOME && r.escalated > 0 && !r.is_settled() =>
            {
                None
            }
            Some(_) if claimed == super::escalate::OUTCOME => {
                Some(format!("approval `{id}` is not escalated and waiting"))
            }
            // A reminder: the approvers are asked again on the surface.
            Some(r)
                if claimed == super::remind::OUTCOME
                    && r.reminded.is_some()
                    && r.status == approval::Status::Pending
                    && !r.is_settled() =>
            {
                None
            }
            Some(_) if claimed == super::remind::OUTCOME => {
                Some(format!("approval `{id}` is not waiting for a reminder"))
            }
            Some(r) if !r.is_settled() => Some(format!("approval `{id}` is not settled")),
            Some(r) if r.outcome.as_deref() != Some(claimed) => Some(format!(
                "the outcome `{claimed}` is not the record's `{}`",
                r.outcome.as_deref().unwrap_or("")
            )),
            Some(_) => None,
        };
        let record = match (refusal, record) {
            (None, Some(r)) => r,
            (reason, _) => {
                let reason = reason.unwrap_or_default();
                tracing::warn!(approval = %id, reason, "forged outcome refused");
                let n = Notice::new(NoticeStatus::Invalid, reason);
                return self.dead_letter(src, entry, n).await;
            }
        };
        if claimed == SUPERSEDED {
            for old in &card.superseded {
                self.update_beside(&record, SUPERSEDED, old, None);
            }
            return self.ack(&self.sources[src].key.clone(), &entry.id).await;
        }
        if claimed == super::remind::OUTCOME {
            if let (Some(external), true) = (&card.external_id, !self.mem.reminded.contains(&id)) {
                if self.mem.reminded.len() >= REDRAWN_KEPT {
                    self.mem.reminded.clear();
                }
                self.mem.reminded.insert(id.clone());
                self.update_beside(&record, super::remind::OUTCOME, external, None);
            }
            return self.ack(&self.sources[src].key.clone(), &entry.id).await;
        }
        if claimed == approval::snooze::OUTCOME || claimed == super::escalate::OUTCOME {
            // The card is drawn again, as it was shown (the notification's
            // content, from this bridge's own stream) with the new deadline
            // or the surfaces now asked; once per snooze or step, so a
            // repeated entry costs no read.
            // Counted as the config bounds them: a record writer raising
            // the counts cannot buy more redraws than there can be changes.
            let rules = self
                .config
                .bridges
                .get(record.source())
                .map(|b| &b.approval);
            let most_snoozes = rules.map_or(0, |a| a.max_snoozes);
            let most_steps = rules.map_or(0, |a| a.escalate.len() as u32);
            let changes = record.snoozes.min(most_snoozes) + record.escalated.min(most_steps);
            let drawn = self.mem.redrawn.get(&id).copied().unwrap_or(0);
            // Only this surface's own card of this approval (its map, which
            // only it writes, says so), drawn from a notification of it:
            // the record's card fields are any surface's to write.
            let ours = match &card.external_id {
                Some(external) if changes > drawn => Approvals::on(&mut self.store)
                    .map_get(&self.name, external)
                    .await?
                    .is_some_and(|mapped| mapped == id),
                _ => false,
            };
            let shown = match &card.entry {
                Some(shown) if ours => self.store.entry(&keys::outbox(&self.name), shown).await?,
                _ => None,
            };
            let shown = shown.filter(|e| approval::is_card_of(e, &id, &card));
            // Redrawn naming what the card named, with what it showed (see
            // `check_notification`).
            let (content, drawn) = match &shown {
                Some(e) => {
                    let d = approval::drawn_notification(&record, |name| e.text(name));
                    (d.content, d.record)
                }
                None => (None, record.clone()),
            };
            if let (Some(external), Some(content)) = (&card.external_id, content) {
                if self.mem.redrawn.len() >= REDRAWN_KEPT {
                    self.mem.redrawn.clear();
                }
                self.mem.redrawn.insert(id.clone(), changes);
                self.update_beside(&drawn, claimed, external, Some(content));
            }
            return self.ack(&self.sources[src].key.clone(), &entry.id).await;
        }
        let sending = card.entry.as_deref().and_then(|shown| {
            let key = delivery_key(&self.sources[src].key, shown);
            self.mem.sched.is_sending(&key).then_some(key)
        });
        if let (true, None, Some(key)) = (may_wait, &card.external_id, sending) {
            // Its card is being sent: the outcome edits it once it exists (the
            // entry stays pending until then, so a restart loses nothing).
            self.mem.outcomes_waiting.insert(key, (src, entry.clone()));
            return Ok(());
        }
        if let Some(external) = &card.external_id {
            self.update_beside(
                &record,
                record.outcome.as_deref().unwrap_or(""),
                external,
                None,
            );
        }
        Approvals::on(&mut self.store)
            .delete_shown(&record, &card)
            .await?;
        self.ack(&self.sources[src].key.clone(), &entry.id).await
    }

    /// Shows `outcome` on card `external` beside the loop: the edit is
    /// cosmetic (failures are logged, never retried by the broker), and a
    /// platform that rate-limits its edits (Slack's `chat.update`, waited
    /// out for its `Retry-After`) must not hold up this bridge's deliveries.
    fn update_beside(
        &self,
        record: &approval::Record,
        outcome: &str,
        external: &str,
        content: Option<String>,
    ) {
        let (sender, record) = (self.sender.clone(), record.clone());
        let (outcome, external) = (outcome.to_string(), external.to_string());
        let channel = self
            .config
            .card_channel_on(record.source(), &self.name)
            .unwrap_or_default()
            .to_string();
        tokio::spawn(async move {
            let update = CardUpdate {
                outcome: &outcome,
                external_id: &external,
                channel_id: &channel,
                record: &record,
                content: content.as_deref(),
            };
            if let Err(e) = sender.update(update).await {
                tracing::warn!(approval = %record.id, outcome, error = %e, "could not show the outcome on the card");
            }
        });
    }
}
