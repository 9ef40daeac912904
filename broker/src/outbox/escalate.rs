//! Escalation: when a step of `approval.escalate` comes due (`after` seconds
//! since parking) with the approval still waiting, its surface is asked too
//! (a card of its own, like those of `approval.also`) and its approvers may
//! answer from then on; the cards shown already say so.
//!
//! Invariants:
//! - Steps are taken in order, each once: the count is on the record
//!   (`escalated`), moved by one server-side step that compares what was
//!   read (the count and the version seal), so two workers never both take
//!   one, and an edit or snooze landing between the read and the write
//!   makes it try again a second later.
//! - A step is taken only on a record whose version seal verifies, and the
//!   count is sealed with the version: nobody without the bridge's key adds
//!   approvers (a record that says `escalated` without the seal decides
//!   nothing; see `approval::decide`).
//! - The step's card is bound by its digest before its notification exists,
//!   as every card is; a crash before it is written leaves it unnotified,
//!   and the sweep writes it.
//! - Telling the other cards is a courtesy (an `escalated` outcome entry the
//!   notify side checks against the record and acts on once per change).

use super::*;
use crate::approval::Card;

/// The outcome entry that asks a notify side to redraw its card with the
/// surfaces now asked.
pub const OUTCOME: &str = "escalated";

/// Steps taken per turn of the loop (the rest wait for the next turns).
const PER_TURN: usize = 64;

impl<S: Sender> OutboxService<S> {
    /// Arms `record`'s next escalation step, if the ladder has one that
    /// comes before the deadline.
    pub(super) fn arm_escalation(&mut self, record: &Record) {
        let steps = &self.bridge.approval.escalate;
        let Some(step) = steps.get(record.escalated as usize) else {
            return;
        };
        let at = record.created_at.saturating_add(step.after);
        if record.expires_at == 0 || at < record.expires_at {
            self.mem.parked.escalate(&record.id, at);
        }
    }

    /// Takes the escalation steps that are due (at most [`PER_TURN`] a turn).
    /// Redis away: this one and those not tried yet are armed again a second
    /// later; any other failure is logged, and that step is not retried (a
    /// restart arms it again).
    pub(super) async fn escalate_due(&mut self) -> Result<()> {
        let now = self.clock.now_secs_f64();
        let due = self.mem.parked.due_escalations(now, PER_TURN);
        for (i, id) in due.iter().enumerate() {
            match self.escalate(id, now).await {
                Err(e) if e.is_retriable() => {
                    let again = self.clock.now_secs() + 1;
                    for id in &due[i..] {
                        self.mem.parked.escalate(id, again);
                    }
                    return Err(e);
                }
                Err(e) => tracing::warn!(approval = %id, error = %e, "escalation step not taken"),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    async fn escalate(&mut self, id: &str, now: f64) -> Result<()> {
        let Some(parked) = self.mem.parked.get(id).cloned() else {
            return Ok(());
        };
        let Some(record) = Approvals::on(&mut self.store).load(id).await? else {
            return Ok(());
        };
        if record.is_settled() || record.state(now) != State::Pending {
            return Ok(());
        }
        // The seal first: the step count read must be the bridge's.
        let Some(key) = self.id_key.clone() else {
            return Ok(());
        };
        if !self.deadline_sealed(&record) {
            tracing::error!(approval = %id, "a record changed outside the broker (version seal); not escalated");
            return Ok(());
        }
        let Some(step) = self
            .bridge
            .approval
            .escalate
            .get(record.escalated as usize)
            .cloned()
        else {
            return Ok(());
        };
        // Due by the record (a retry after a race may come early).
        if (record.created_at.saturating_add(step.after) as f64) > now {
            self.arm_escalation(&record);
            return Ok(());
        }
        // The message as approvers are shown it (an edit's version).
        let stream = self.sources[parked.source].key.clone();
        let Some(entry) = self
            .store
            .entry(&stream, &parked.entry_id.to_string())
            .await?
        else {
            return Ok(()); // the vanished-entry check settles it
        };
        let requested = self.requested(&stream, &entry).await;
        let Ok(message) = requested.and_then(|m| approval::edit::apply(m, &record)) else {
            return Ok(()); // settled as failed when it is approved
        };
        let shown = message.for_approvers();
        // A record whose digest was changed asks no one more (its send is
        // refused anyway), rather than draw a card from its other values.
        let Some(mut next) = self.framed(&record, parked.source, &message) else {
            return Ok(());
        };
        next.escalated += 1;
        let mut card = Card {
            bridge: step.notify.clone(),
            channel: step.notify_channel.clone(),
            ..Card::default()
        };
        // Listed already (written by someone else before the step): replaced.
        next.also.retain(|c| c.bridge != card.bridge);
        next.also.push(card.clone());
        let fields = approval::notification_fields(&next, &card.channel, &shown);
        card.sha256 = approval::notification_digest(&fields);
        next.bind_card(&card, card.sha256.clone());
        next.version_seal = Some(key.seal_version(&next));
        let answer = Approvals::on(&mut self.store)
            .escalate(&record, &next, &card, now)
            .await?;
        match answer.as_str() {
            "ok" => {}
            // Changed between the read and the write (an edit, a snooze):
            // tried again on the record as it is now.
            "stale" => {
                self.mem.parked.escalate(id, self.clock.now_secs() + 1);
                return Ok(());
            }
            other => {
                tracing::warn!(approval = %id, why = other, surface = %step.notify, "escalation step not taken");
                return Ok(());
            }
        }
        // The next step is armed at once: nothing below may lose it.
        self.arm_escalation(&next);
        let step_number = next.escalated.to_string();
        tracing::info!(approval = %id, step = %step_number, surface = %step.notify, "escalated");
        let event = self
            .event(audit::Kind::Escalated, id)
            .with(audit::field::COUNT, step_number)
            .with(audit::field::NOTIFY, step.notify.as_str())
            .with(audit::field::WAITED, step.after.to_string());
        self.audit(&[event]).await?;
        if let Err(why) = self.notify_card(&next, &card, &shown, false).await? {
            tracing::warn!(approval = %id, surface = %step.notify, why, "the escalation's surface refused its card");
        }
        let bit = self.surface_bit(&step.notify);
        self.mem.parked.watch(id, bit);
        // The cards shown already say who else is asked now.
        let told: Vec<(&str, &[u8])> = vec![
            (crate::fields::outbox::APPROVAL_ID, id.as_bytes()),
            (crate::fields::outbox::APPROVAL_OUTCOME, OUTCOME.as_bytes()),
        ];
        let asked = approval::cards_asked(&self.config, &record);
        for shown in asked.iter().filter(|c| c.external_id.is_some()) {
            if let Err(e) = self.store.xadd(&keys::outbox(&shown.bridge), &told).await {
                tracing::warn!(approval = %id, surface = %shown.bridge, error = %e, "a card was not told of the escalation");
            }
        }
        Ok(())
    }
}
