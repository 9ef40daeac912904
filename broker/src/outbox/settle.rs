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
        let Some(parked) = self.mem.parked.get(&id).cloned() else {
            return Ok(());
        };
        let src = parked.source;
        let entry_id = parked.entry_id.to_string();
        // Its approved send is under way or queued: its outcome settles it.
        if self
            .mem
            .sched
            .is_scheduled(&delivery_key(&self.sources[src].key, &entry_id))
        {
            return Ok(());
        }
        let Some(record) = Approvals::on(&mut self.store).load(&id).await? else {
            let reason = "the approval record disappeared; not sent";
            let n = Notice::new(NoticeStatus::Failed, reason).approval(&id);
            // The entry names its request id, for the agent to match.
            let key = self.sources[src].key.clone();
            let entry = self.store.entry(&key, &entry_id).await?;
            self.notice(src, &entry_id, entry.as_ref(), n).await?;
            self.audit_failed(&id, reason, None).await?;
            self.ack(&self.sources[src].key.clone(), &entry_id).await?;
            let agent = self.sources[src].agent.clone();
            Approvals::on(&mut self.store)
                .unindex(&self.name, agent.as_deref(), &id)
                .await?;
            self.mem.parked.untrack(&id);
            return Ok(());
        };
        if record.is_settled() {
            return self.finish(src, &entry_id, &record, None).await;
        }
        // Approved in time stays approved while its delivery waits for a retry,
        // even once the deadline has passed.
        let now = self.clock.now_secs_f64();
        let mut state = match record.approved_in_time() {
            true => State::Approved,
            false => record.state(now),
        };
        let (tracked, moved) = (parked.expires_at, record.expires_at);
        if state == State::Pending && moved != tracked {
            // A snooze moved the deadline: it wakes the loop then, not now.
            // Only a later one this bridge sealed: a record writer without
            // the key cannot keep an entry parked past the deadline tracked.
            if tracked != 0 && moved > tracked && self.deadline_sealed(&record) {
                self.mem
                    .parked
                    .track(id, src, entry_id.clone(), moved, parked::RECHECK);
                // A reminder the old deadline came before may fit now.
                self.arm_reminder(&record);
                self.arm_escalation(&record);
                return Ok(());
            }
            if tracked != 0 && now >= tracked as f64 {
                tracing::error!(approval = %id, "the deadline was moved outside the broker; expired at the one tracked");
                state = State::Expired;
            }
        }
        match state {
            State::Pending => Ok(()),
            State::Approved => self.deliver_approved(src, &entry_id, record).await,
            State::Rejected | State::Expired => {
                let timeout_reason = match record.snoozes {
                    0 => format!(
                        "no decision within {} seconds",
                        self.bridge.approval.timeout
                    ),
                    n => format!(
                        "no decision within {} seconds, nor by the later deadline {n} snooze(s) set",
                        self.bridge.approval.timeout
                    ),
                };
                let reason = match state {
                    State::Expired => timeout_reason.as_str(),
                    _ => record.reason(),
                };
                let status = match state {
                    State::Expired => NoticeStatus::Expired,
                    _ => NoticeStatus::Rejected,
                };
                let mut n = Notice::new(status, reason)
                    .approval(&id)
                    .request(record.request_id.as_deref());
                if state == State::Rejected {
                    n = n.approver(record.approver());
                }
                self.notice(src, &entry_id, None, n).await?;
                if state == State::Expired {
                    let expired = self
                        .event(audit::Kind::Expired, &id)
                        .with(audit::field::REASON, reason);
                    self.audit(&[expired]).await?;
                }
                tracing::info!(approval = %id, state = state.as_str(), "parked entry dropped");
                self.finish(src, &entry_id, &record, Some(state.as_str()))
                    .await
            }
        }
    }

    /// Whether `record`'s deadline is as this bridge sealed it (with the
    /// version and quorum, see [`approval::IdKey::seal_version`]).
    pub(super) fn deadline_sealed(&self, record: &Record) -> bool {
        let seal = record.version_seal.as_deref();
        self.id_key
            .as_ref()
            .zip(seal)
            .is_some_and(|(key, seal)| approval::same_secret(&key.seal_version(record), seal))
    }

    pub(super) async fn deliver_approved(
        &mut self,
        src: SourceId,
        entry_id: &str,
        record: Record,
    ) -> Result<()> {
        let key = self.sources[src].key.clone();
        let id = record.id.clone();
        let Some(entry) = self.store.entry(&key, entry_id).await? else {
            let reason = "the entry was deleted from its stream before delivery";
            let n = Notice::new(NoticeStatus::Failed, reason)
                .approval(&id)
                .request(record.request_id.as_deref());
            self.notice(src, entry_id, None, n).await?;
            self.audit_failed(&id, reason, None).await?;
            return self.finish(src, entry_id, &record, Some("failed")).await;
        };
        // Only what this bridge sealed is sent: `approved` written by anyone
        // without its key (a surface's password, a forger) sends nothing.
        let sealed = match (&self.id_key, &record.decision_seal) {
            (Some(k), Some(seal)) => {
                approval::same_secret(&k.seal_decision(&id, &record.message_sha256), seal)
            }
            _ => false,
        };
        if !sealed {
            let reason = "marked approved without this bridge's seal (not decided through the broker); not sent";
            tracing::error!(approval = %id, "{reason}");
            let n = Notice::new(NoticeStatus::Failed, reason).approval(&id);
            self.notice(src, entry_id, Some(&entry), n).await?;
            self.audit_failed(&id, reason, None).await?;
            return self.finish(src, entry_id, &record, Some("failed")).await;
        }
        let checked = self
            .requested(&key, &entry)
            .await
            // An approver's edit is what was approved, and what is sent.
            .and_then(|m| approval::edit::apply(m, &record))
            // An edited destination too must be one the platform reads as written.
            .and_then(|m| match self.sender.canonical_destination(&m.channel_id) {
                Ok(c) if c == m.channel_id => Ok(m),
                Ok(c) => Err(format!(
                    "destination `{}` would be delivered to `{c}`; not sent",
                    m.channel_id
                )),
                Err(why) => Err(format!("destination `{}`: {why}; not sent", m.channel_id)),
            })
            .and_then(|m| {
                let sha = m.sha256();
                if sha == record.message_sha256 {
                    Ok(m)
                } else {
                    Err(format!(
                        "message sha256 {sha} differs from the approved {}; not sent",
                        record.message_sha256
                    ))
                }
            });
        let message = match checked {
            Ok(m) => m,
            Err(reason) => {
                let n = Notice::new(NoticeStatus::Failed, &reason).approval(&id);
                self.dead_letter_only(src, &entry, &n).await?;
                self.notice(src, entry_id, Some(&entry), n).await?;
                self.audit_failed(&id, &reason, None).await?;
                return self.finish(src, entry_id, &record, Some("failed")).await;
            }
        };
        let dkey = delivery_key(&key, entry_id);
        if self.mem.sched.is_scheduled(&dkey) {
            return Ok(()); // waits for its retry time
        }
        // A send another worker started (it may still complete it) is never
        // made again; one this worker started before a restart is a retry.
        let prior = self.mark_in_flight(&key, entry_id, &dkey).await?;
        if prior == super::inflight::Prior::NotMine {
            tracing::warn!(approval = %id, "not sent: the entry was taken over by another worker");
            return Ok(());
        }
        let (gate, retry) = self.gate_for(prior, record.delivery_started.is_some());
        if record.delivery_started.is_none() {
            let started = Approvals::on(&mut self.store)
                .mark_delivery_started(
                    &id,
                    self.clock.now_secs(),
                    &record.message_sha256,
                    &self.worker,
                )
                .await?;
            if !started {
                // Edited (or otherwise changed) since it was read: the record
                // as it is now decides, and a new approval wakes this again.
                tracing::info!(approval = %id, "changed before its send started; not sent");
                return Ok(());
            }
        }
        // Decided: its deadline no longer wakes the loop.
        self.mem.parked.decided(&id);
        // Sent beside the loop; scheduled until its outcome is recorded, so a
        // repeated wake-up, the sweep or a vanished-entry check leaves it alone.
        self.dispatch(Flight {
            gate,
            fenced: false,
            unreplicated: false,
            skipped: false,
            source: src,
            entry,
            message,
            retry,
            key: dkey,
            purpose: Purpose::Approved {
                record: Box::new(record),
            },
        });
        Ok(())
    }

    /// Records the outcome of an approved entry's send.
    pub(super) async fn complete_approved(
        &mut self,
        f: Flight,
        record: Record,
        result: std::result::Result<Sent, SendError>,
    ) -> Result<()> {
        self.mem.sched.end(&f.key);
        let mark = f.key.clone();
        let gate = f.gate.clone();
        let channel = f.message.channel_id.clone();
        let (src, entry_id, id) = (f.source, f.entry.id.clone(), record.id.clone());
        match self.outcome_of(&f.key, f.unreplicated, result) {
            Delivery::Sent(external_id, report) => {
                tracing::info!(approval = %id, external_id, approver = record.approver(), "approved entry delivered");
                let delivered = self
                    .event(audit::Kind::Delivered, &id)
                    .with(audit::field::EXTERNAL_ID, &external_id)
                    .with(audit::field::DESTINATION, &f.message.channel_id)
                    .with(audit::field::DIGEST, f.message.sha256())
                    .with_opt(
                        audit::field::OUTCOME,
                        report.as_ref().map(|r| r.status.as_str()),
                    );
                self.audit(&[delivered]).await?;
                if f.message.progress {
                    let n = Notice {
                        external_id: Some(external_id.clone()),
                        ..Notice::new(NoticeStatus::Delivered, "delivered")
                            .approval(&id)
                            .approver(record.approver())
                            .request(record.request_id.as_deref())
                    };
                    self.notice(src, &entry_id, Some(&f.entry), n).await?;
                }
                // A declared action tells the agent how its run went.
                if let Some(r) = report {
                    let n = Notice::ran(r)
                        .approval(&id)
                        .approver(record.approver())
                        .request(record.request_id.as_deref());
                    self.notice(src, &entry_id, Some(&f.entry), n).await?;
                }
                // Sent, but not as the agent wrote it: the agent must know.
                if let Some(original) = &record.original_sha256 {
                    let reason = format!(
                        "sent as edited by {}: your version had sha256 {original}, the one sent has {}",
                        record.edited_by.as_deref().unwrap_or("an approver"),
                        record.message_sha256
                    );
                    let n = Notice {
                        original_sha256: Some(original.clone()),
                        sent_sha256: Some(record.message_sha256.clone()),
                        ..Notice::new(NoticeStatus::Edited, reason)
                            .approval(&id)
                            .approver(record.approver())
                            .request(record.request_id.as_deref())
                    };
                    self.notice(src, &entry_id, Some(&f.entry), n).await?;
                }
                self.finish(src, &entry_id, &record, Some("approved"))
                    .await?;
            }
            Delivery::Failed(n) => {
                let n = *n;
                let n = n.approval(&id);
                self.dead_letter_only(src, &f.entry, &n).await?;
                if n.status == NoticeStatus::Uncertain {
                    self.record_uncertain(src, &f.entry, &f.message, Some(&id), &n.reason)
                        .await?;
                } else {
                    self.audit_failed(&id, &n.reason, Some(n.status.as_str()))
                        .await?;
                }
                let status = n.status;
                self.notice(src, &entry_id, Some(&f.entry), n).await?;
                // `uncertain` is shown as such: the message may have gone out.
                self.finish(src, &entry_id, &record, Some(status.as_str()))
                    .await?;
            }
            Delivery::Deferred(due) => {
                // Not delivered by this attempt: the next is a retry only if
                // this one was (an earlier attempt may have sent it, say
                // before a failover; this one may have stopped at its gate
                // mark's replication). A first attempt leaves no trace.
                if !f.retry {
                    Approvals::on(&mut self.store)
                        .clear_delivery_started(&id)
                        .await?;
                }
                // Decided: its deadline no longer wakes the loop.
                self.mem.parked.decided(&id);
                self.mem
                    .sched
                    .defer(f.key, due, Job::Approved { approval_id: id });
            }
        }
        // Its outcome is recorded: the mark goes (this worker's, or one it took over).
        self.clear_in_flight(&[&mark]).await?;
        self.forget_taken_mark(&gate, &mark).await?;
        // The retry, if any, is dispatched again when it is due: the
        // destination is free (where the send held it).
        self.end_dispatched(&channel).await
    }

    /// Marks the record settled with its outcome, tells the notify bridge, acks the
    /// entry, and closes the record. Once a notification was written the notify
    /// side owns the rest: the record stays (with its TTL) until the outcome entry,
    /// which follows the notification in the same stream, has been shown and the
    /// notify side deletes it. Each step is recorded, so a crash repeats none.
    pub(super) async fn finish(
        &mut self,
        src: SourceId,
        entry_id: &str,
        record: &Record,
        outcome: Option<&str>,
    ) -> Result<()> {
        // Handed over once any surface was asked: each shows its outcome.
        let handed_over = record.cards().iter().any(|c| c.notified.is_some());
        let outcome = outcome.or(record.outcome.as_deref()).unwrap_or("failed");
        if !record.is_settled() {
            Approvals::on(&mut self.store)
                .mark_settled(&record.id, outcome, self.clock.now_secs())
                .await?;
        }
        // Acked before the outcome entry exists: once the notify side sees the
        // outcome it deletes the record, and an unacked entry would then be
        // parked again as if new.
        self.ack(&self.sources[src].key.clone(), entry_id).await?;
        let fields: Vec<(&str, &[u8])> = vec![
            (crate::fields::outbox::APPROVAL_ID, record.id.as_bytes()),
            (crate::fields::outbox::APPROVAL_OUTCOME, outcome.as_bytes()),
        ];
        let asked = approval::cards_asked(&self.config, record);
        for card in &asked {
            if card.notified.is_none() || card.outcome_sent {
                continue;
            }
            match self.store.xadd(&keys::outbox(&card.bridge), &fields).await {
                Ok(_) => {
                    Approvals::on(&mut self.store)
                        .mark_outcome_sent(&record.id, card)
                        .await?;
                }
                // A refusing stream (see `notify`) only costs the card its closing edit.
                Err(Error::Redis(e)) if refused_by_stream(&e) => {
                    tracing::warn!(approval = %record.id, surface = %card.bridge, error = %e, "outcome not written");
                }
                Err(e) => return Err(e),
            }
        }
        // Without a notification nobody else will delete the record.
        Approvals::on(&mut self.store)
            .close(record, &asked, !handed_over)
            .await?;
        self.mem.parked.untrack(&record.id);
        Ok(())
    }
}
