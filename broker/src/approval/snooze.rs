//! Snooze: an approver's "later", which moves a pending approval's deadline
//! and decides nothing.
//!
//! Invariants:
//! - Only the requesting bridge's services move a deadline (a snooze is a
//!   request its outbox applies, see [`crate::request`]), and the new one is
//!   sealed with its key: the version seal covers `expires_at` and the number
//!   of snoozes, so a deadline moved by anyone else does not verify and
//!   nothing is approved on that record. The seal is checked before it is
//!   renewed, so a snooze never launders a record changed outside the broker.
//! - Only someone who may answer snoozes: an approver on the requesting
//!   bridge, or a delegate standing in for one (a surface's snooze comes
//!   from a live card of that approval; [`crate::request`] checks it).
//! - Each snooze moves the deadline by at most `approval.max_snooze` seconds,
//!   at most `approval.max_snoozes` times, and only while the approval is
//!   pending and inside its window: an expired approval stays expired, and an
//!   approval that never expires has nothing to snooze.
//! - The move is one server-side step on the record, applied only to the
//!   deadline and count read here (`stale` otherwise, read again), so two
//!   snoozes at once move it twice at most, each within the bounds.
//! - A snooze never counts toward a quorum and is never a decision; it is in
//!   the trail (`snoozed`: by, until, reason), on the card, and, for an agent
//!   that asked for progress, in a `parked` notice with the new deadline.

use super::{delegation, same_secret, Approvals, IdKey, Record, State};
use crate::audit;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::identity::Identity;
use crate::keys;
use crate::store::Store;

/// The outcome entry that asks the notify side to show a snooze on the card.
pub const OUTCOME: &str = "snoozed";

/// A snooze applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snoozed {
    /// The new deadline (unix seconds).
    pub until: u64,
    /// Snoozes so far, this one included, and how many the bridge allows.
    pub count: u32,
    pub max: u32,
}

/// What a snooze asks: by how much (the bridge's `approval.snooze` when
/// `None`), why, and the asking request's nonce (the same request applied
/// twice moves the deadline once).
#[derive(Debug, Clone, Copy)]
pub struct Later<'a> {
    pub seconds: Option<u64>,
    pub reason: &'a str,
    pub request: &'a str,
}

/// A snooze this close to the deadline (by the applying service's clock) is
/// refused: the requesting worker may be settling it as expired already, and
/// the agent must not hear `expired` while the human hears "snoozed".
const MARGIN_SECS: f64 = 2.0;

/// Moves approval `id`'s deadline for `identity`, under the rules above. A
/// refusal is an operator error naming why.
pub async fn snooze(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    id: &str,
    identity: &str,
    later: Later<'_>,
) -> Result<Snoozed> {
    // Another snooze or an edit between the read and the write: read again.
    for _ in 0..3 {
        if let Some(done) = snooze_once(store, config, clock, id, identity, later).await? {
            return Ok(done);
        }
    }
    Err(Error::platform(
        true,
        format!("approval {id} kept changing while it was snoozed; try again"),
    ))
}

async fn snooze_once(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    id: &str,
    identity: &str,
    later: Later<'_>,
) -> Result<Option<Snoozed>> {
    let (seconds, reason) = (later.seconds, later.reason);
    let Some(record) = Approvals::on(store).load(id).await? else {
        return Err(Error::refused(format!("no approval {id}")));
    };
    let bridge = record.source().to_string();
    let rules = &config.bridge(&bridge)?.approval;
    let now = clock.now_secs_f64();
    let who = Identity::read(identity);
    let refuse = |why: String| Err(Error::refused(why));
    // This very request was applied already, and something after it failed
    // (the trail, a replica's acknowledgement): finish it, moving nothing.
    let again =
        !later.request.is_empty() && record.snooze_request.as_deref() == Some(later.request);
    let next = if again {
        record.clone()
    } else {
        let allowed = rules.allows_at(&who, record.escalated)
            || delegation::acting_for(store, config, &bridge, &who, now, record.created_at)
                .await?
                .is_some();
        let ignored = |why: &str| {
            audit::Event::new(&bridge, audit::Kind::Ignored, id, now)
                .with(audit::field::BY, who.as_str())
                .with(audit::field::WHY, why)
        };
        if !allowed {
            let event = ignored("a snooze from someone who may not answer");
            audit::append(store, config, &[event]).await?;
            return refuse(format!(
                "{who} may not answer approval {id}, so may not snooze it"
            ));
        }
        // Out of bounds: refused, and in the trail like any answer that
        // changed nothing.
        let seconds = seconds.unwrap_or(rules.snooze);
        let state = record.state(now);
        let out_of_bounds = if rules.max_snooze == 0 {
            Some(format!(
                "approvals of bridge `{bridge}` cannot be snoozed (approval.max_snooze = 0)"
            ))
        } else if seconds == 0 || seconds > rules.max_snooze {
            Some(format!(
                "a snooze is between 1 second and approval.max_snooze ({} s) on bridge `{bridge}`",
                rules.max_snooze
            ))
        } else if state != State::Pending {
            Some(format!(
                "approval {id} is {}: nothing to snooze",
                state.as_str()
            ))
        } else if record.expires_at == 0 {
            Some(format!("approval {id} never expires: nothing to snooze"))
        } else if (record.expires_at as f64) - now < MARGIN_SECS {
            Some(format!(
                "approval {id} expires in under {MARGIN_SECS} seconds: too late to snooze"
            ))
        } else if record.snoozes >= rules.max_snoozes {
            Some(format!(
                "approval {id} was snoozed {} times already (approval.max_snoozes = {})",
                record.snoozes, rules.max_snoozes
            ))
        } else {
            None
        };
        if let Some(why) = out_of_bounds {
            audit::append(store, config, &[ignored(&why)]).await?;
            return refuse(why);
        }
        let Some(key) = IdKey::existing(store, &bridge).await? else {
            return Err(Error::internal(format!("bridge `{bridge}` has no id key")));
        };
        let sealed = record
            .version_seal
            .as_deref()
            .is_some_and(|s| same_secret(&key.seal_version(&record), s));
        if !sealed {
            tracing::error!(
                approval = id,
                "a record changed outside the broker (version seal); not snoozed"
            );
            let event = ignored(
                "a snooze of a record changed outside the broker (its version seal does not verify)",
            );
            audit::append(store, config, &[event]).await?;
            return refuse(format!(
                "approval {id} was changed outside the broker; not snoozed"
            ));
        }
        let mut next = record.clone();
        next.expires_at = record.expires_at.saturating_add(seconds);
        next.snoozes = record.snoozes + 1;
        next.snoozed_by = Some(who.to_string());
        next.snoozed_until = Some(next.expires_at);
        next.version_seal = Some(key.seal_version(&next));
        let answer = Approvals::on(store)
            .snooze(&record, &next, now, later.request)
            .await?;
        match answer.as_str() {
            "ok" => next,
            // Applied by this request meanwhile (as above).
            "again" => record.clone(),
            "stale" => return Ok(None),
            "missing" => return refuse(format!("no approval {id}")),
            why => return refuse(format!("approval {id} is {why}: nothing to snooze")),
        }
    };
    tracing::info!(approval = id, by = %who, until = next.expires_at, "approval snoozed");
    let event = audit::Event::new(&bridge, audit::Kind::Snoozed, id, now)
        .with(audit::field::BY, who.as_str())
        .with(audit::field::UNTIL, next.expires_at.to_string())
        .with(audit::field::REASON, reason);
    audit::append(store, config, &[event]).await?;
    // Shown and told only once a failover cannot lose it.
    store.conn.replicated("the snooze").await?;
    show(store, config, &next).await;
    Ok(Some(Snoozed {
        until: next.expires_at,
        count: next.snoozes,
        max: rules.max_snoozes,
    }))
}

/// Puts the snooze on the card (an outcome entry the notify side checks
/// against the record) and tells an agent that asked for progress of its new
/// deadline. Both are informational: a failure is logged, never retried.
async fn show(store: &mut Store, config: &Config, record: &Record) {
    let fields: Vec<(&str, &[u8])> = vec![
        (crate::fields::outbox::APPROVAL_ID, record.id.as_bytes()),
        (crate::fields::outbox::APPROVAL_OUTCOME, OUTCOME.as_bytes()),
    ];
    let asked = super::cards_asked(config, record);
    for card in asked.iter().filter(|c| c.notified.is_some()) {
        if let Err(e) = store.xadd(&keys::outbox(&card.bridge), &fields).await {
            tracing::warn!(approval = %record.id, surface = %card.bridge, error = %e, "the card was not told of the snooze");
        }
    }
    if record.progress {
        let count =
            (record.quorum() > 1).then(|| (record.approvals.len(), record.quorum() as usize));
        let n = crate::entry::Notice::parked(record, count);
        let told = async {
            let inbox = super::notice_inbox(record)?;
            store
                .xadd(&inbox, &n.fields(&record.stream, &record.entry_id))
                .await
        };
        if let Err(e) = told.await {
            tracing::warn!(approval = %record.id, error = %e, "the agent was not told of the snooze");
        }
    }
}
