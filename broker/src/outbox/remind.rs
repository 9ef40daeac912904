//! Reminders: once an approval has waited `approval.remind_after` seconds
//! undecided, the card's surface is asked to remind its approvers.
//!
//! Invariants:
//! - One reminder per approval: the record notes it (`reminded`, set once
//!   by one server-side step, only while pending and unsettled) before the
//!   reminder entry is written, so neither a restart nor a second worker
//!   reminds twice; a crash between the two loses that reminder (it is a
//!   courtesy, never part of the gate).
//! - A reminder is an outcome entry on the notify bridge's outbox
//!   (`approval_outcome = reminder`), which the notify side acts on only
//!   when the record says it was reminded and is still waiting; its text is
//!   built from the record, never from the entry.
//! - No reminder for an approval decided, settled or expiring first, nor
//!   before its card is shown (it is tried again a little later then).

use super::*;

/// The outcome entry that asks the notify side to remind the approvers.
pub const OUTCOME: &str = "reminder";

/// How long a reminder waits when the card is not shown yet.
const NOT_SHOWN_YET_SECS: u64 = 60;
/// Reminders sent per turn of the loop (the rest wait for the next turns).
const PER_TURN: usize = 64;

impl<S: Sender> OutboxService<S> {
    /// Arms `record`'s reminder, when the bridge wants one and it is not
    /// spent: at `created_at + remind_after`, if that comes before the deadline.
    pub(super) fn arm_reminder(&mut self, record: &Record) {
        let after = self.bridge.approval.remind_after;
        // Only where cards can be brought up again (Discord, Slack, email):
        // else the trail would say reminded when nobody was.
        let asked = approval::cards_asked(&self.config, record);
        let reminds = asked.iter().any(|c| self.reminds_on(c));
        if after == 0 || record.reminded.is_some() || !reminds {
            return;
        }
        let at = record.created_at.saturating_add(after);
        if record.expires_at == 0 || at < record.expires_at {
            self.mem.parked.remind(&record.id, at);
        }
    }

    /// Sends the reminders that are due (at most [`PER_TURN`] a turn). A
    /// failure other than Redis being away is logged: reminders are a
    /// courtesy, and stop nothing.
    pub(super) async fn remind_due(&mut self) -> Result<()> {
        let now = self.clock.now_secs_f64();
        for id in self.mem.parked.due_reminders(now, PER_TURN) {
            match self.remind(&id, now).await {
                Err(e) if e.is_retriable() => return Err(e),
                Err(e) => tracing::warn!(approval = %id, error = %e, "reminder not sent"),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// Whether `card`'s surface can remind its approvers.
    fn reminds_on(&self, card: &approval::Card) -> bool {
        let shown_on = self.config.bridges.get(&card.bridge);
        shown_on.is_some_and(|b| registry::reminds(&b.kind))
    }

    async fn remind(&mut self, id: &str, now: f64) -> Result<()> {
        let Some(record) = Approvals::on(&mut self.store).load(id).await? else {
            return Ok(());
        };
        if record.is_settled() || record.state(now) != State::Pending {
            return Ok(());
        }
        // Each surface that can remind and shows its card; none yet: later.
        let cards: Vec<approval::Card> = approval::cards_asked(&self.config, &record)
            .into_iter()
            .filter(|c| c.external_id.is_some() && self.reminds_on(c))
            .collect();
        if cards.is_empty() {
            // Looked at again soon, never later than a reminder's own delay.
            let wait = NOT_SHOWN_YET_SECS.min(self.bridge.approval.remind_after.max(1));
            let later = self.clock.now_secs() + wait;
            self.mem.parked.remind(id, later);
            return Ok(());
        }
        let noted = Approvals::on(&mut self.store)
            .mark_reminded(id, now as u64)
            .await?;
        if !noted {
            return Ok(());
        }
        let fields: Vec<(&str, &[u8])> = vec![
            (crate::fields::outbox::APPROVAL_ID, id.as_bytes()),
            (crate::fields::outbox::APPROVAL_OUTCOME, OUTCOME.as_bytes()),
        ];
        let mut events = Vec::new();
        for card in &cards {
            self.store
                .xadd(&keys::outbox(&card.bridge), &fields)
                .await?;
            tracing::info!(approval = %id, notify = %card.bridge, "approvers reminded");
            events.push(
                self.event(audit::Kind::Reminded, id)
                    .with(audit::field::NOTIFY, card.bridge.as_str()),
            );
        }
        self.audit(&events).await
    }
}
