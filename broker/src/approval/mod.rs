//! Approvals: the record, its repository, ids, the frame shown to humans, and
//! the decision rules every surface goes through (`resolve_approval`).
//!
//! # Layout (each module states its invariants)
//!
//! - [`record`]: the typed record and its field names.
//! - [`repo`]: [`Approvals`], the only issuer of `approval:*` commands, and its Lua.
//! - [`id`]: keyed approval ids and canonical digests.
//! - [`frame`]: the plain-text frame around a parked message.
//!
//! Invariants of the decision rules:
//! - A decision changes a record only while it is `pending` and inside its
//!   window, in one server-side step, so two racing answers cannot both win and
//!   a late one changes nothing; a settled record is never decided again.
//! - An answer counts only from an identity on the requesting bridge's
//!   `approval.approvers` (which starts empty: nobody).
//! - `resolve_approval` drops the map entry whether the answer counted or was
//!   late, but not when the answerer is not an approver: a stranger's reaction
//!   must not disarm the card for the real approvers.
//! - A decision is followed by an entry on the deciding worker's wake-up stream
//!   (`{bridge}:decisions`, or `{bridge}:decisions:{worker}`), named by the
//!   record and read in the decision's own step.

pub mod frame;
pub mod id;
pub mod record;
pub mod repo;

pub use frame::*;
pub use id::*;
pub use record::{field, Record, State, Status, Verdict};
pub use repo::Approvals;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// About how many wake-ups a `{bridge}:decisions` stream keeps.
const DECISIONS_KEPT: u64 = 10_000;

/// What became of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The record was pending and in its window: it is now decided.
    Decided,
    /// No map entry for that external id: not an answer to a notification.
    Unknown,
    /// The answerer is not on the requesting bridge's approvers list.
    NotAllowed,
    /// Too late: the record is decided (`approved`/`rejected`), `expired` or `missing`.
    Late(String),
}

/// A human's answer: what, who (a qualified identity such as `discord:1234`,
/// checked against the requesting bridge's `approval.approvers`), why, and
/// when (unix seconds from the answering process's [`Clock`], so a test can
/// answer after a deadline without waiting for it).
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub verdict: Verdict,
    pub approver: &'a str,
    pub reason: &'a str,
    pub at: f64,
}

impl<'a> Answer<'a> {
    /// An answer given now by `clock`.
    pub fn new(clock: &Clock, verdict: Verdict, approver: &'a str, reason: &'a str) -> Answer<'a> {
        Answer {
            verdict,
            approver,
            reason,
            at: clock.now_secs_f64(),
        }
    }
}

/// The protocol's `resolve_approval`: an answer arrived on the notify bridge `source`
/// to the notification it delivered as `external_id`.
pub async fn resolve_approval(
    store: &mut Store,
    config: &Config,
    source: &str,
    external_id: &str,
    answer: Answer<'_>,
) -> Result<Outcome> {
    let Some(id) = Approvals::on(store).map_get(source, external_id).await? else {
        return Ok(Outcome::Unknown);
    };
    let outcome = decide(store, config, &id, answer).await?;
    if outcome != Outcome::NotAllowed {
        Approvals::on(store).map_delete(source, external_id).await?;
    }
    Ok(outcome)
}

/// Decides approval `id` directly (the operator CLI), under the same rules.
pub async fn decide(
    store: &mut Store,
    config: &Config,
    id: &str,
    answer: Answer<'_>,
) -> Result<Outcome> {
    let Some(record) = Approvals::on(store).load(id).await? else {
        return Ok(Outcome::Late("missing".into()));
    };
    let requester = record.source().to_string();
    let allowed = config
        .bridges
        .get(&requester)
        .is_some_and(|b| b.approval.allows(answer.approver));
    if !allowed {
        tracing::warn!(
            approval = id,
            approver = answer.approver,
            "answer from someone not on approval.approvers ignored"
        );
        return Ok(Outcome::NotAllowed);
    }
    apply(store, id, &requester, answer).await
}

/// Rejects a pending approval whose request could not be shown to anyone (the
/// notify platform refused it): failing closed at once, and telling the agent
/// why, instead of waiting for a deadline that may never come. The approver is
/// `broker:{notify bridge}`, which no config can name.
pub async fn reject_unshown(
    store: &mut Store,
    clock: &Clock,
    record: &Record,
    notify: &str,
    reason: &str,
) -> Result<Outcome> {
    let reason = format!("the approval request could not be shown to approvers: {reason}");
    let approver = format!("broker:{notify}");
    let answer = Answer::new(clock, Verdict::Rejected, &approver, &reason);
    apply(store, &record.id, record.source(), answer).await
}

/// Writes a decision (pending and in time only) and wakes the requester.
async fn apply(store: &mut Store, id: &str, requester: &str, given: Answer<'_>) -> Result<Outcome> {
    let Answer {
        verdict,
        approver,
        reason,
        at,
    } = given;
    let (answer, worker) = Approvals::on(store)
        .decide(id, verdict, approver, reason, at)
        .await?;
    let late = answer != "decided";
    if late && answer != "approved" && answer != "rejected" {
        tracing::info!(approval = id, state = %answer, "late answer ignored");
        return Ok(Outcome::Late(answer));
    }
    if !late {
        tracing::info!(
            approval = id,
            approver,
            verdict = verdict.as_str(),
            "approval decided"
        );
    }
    // Wake the requesting worker (the one the record names, read in the same step
    // as the decision). If this is lost (the decider died in between, or the cap
    // trimmed it unread), answering again through the CLI wakes it again, a
    // restart re-reads every record, and the sweep's round robin reaches it.
    let stream = keys::decisions_for(requester, &worker);
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("MAXLEN")
        .arg("~")
        .arg(DECISIONS_KEPT)
        .arg("*")
        .arg("approval_id")
        .arg(id)
        .arg("status")
        // The record's status: a late answer re-wakes with what was decided.
        .arg(if late {
            answer.as_str()
        } else {
            verdict.as_str()
        })
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("XADD {stream}"), e))?;
    if late {
        // Decided but not yet settled: the requester is woken again, in case the
        // first wake-up was lost (a decider that died between its two steps).
        tracing::info!(approval = id, state = %answer, "late answer ignored; requester woken again");
        return Ok(Outcome::Late(answer));
    }
    Ok(Outcome::Decided)
}

/// Ids of every approval record, by `SCAN` (operator use only).
pub async fn list_ids(store: &mut Store) -> Result<Vec<String>> {
    Approvals::on(store).scan_ids().await
}

/// Ids of the pending approvals of every bridge that parks, oldest first per
/// bridge, from the pending index (no keyspace scan).
pub async fn pending_ids(store: &mut Store, config: &Config) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for (name, bridge) in &config.bridges {
        if !bridge.approval.required {
            continue;
        }
        let some = Approvals::on(store).pending(name).await?;
        ids.extend(some);
    }
    Ok(ids)
}

/// Finds the one pending approval whose id starts with `prefix` (a whole id is
/// taken as it is, so a settled record can still be shown).
pub async fn find_by_prefix(store: &mut Store, config: &Config, prefix: &str) -> Result<String> {
    if is_id(prefix) {
        return Ok(prefix.to_string());
    }
    let mut matching: Vec<String> = pending_ids(store, config)
        .await?
        .into_iter()
        .filter(|id| id.starts_with(prefix))
        .collect();
    matching.sort();
    matching.dedup();
    match matching.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::Request(format!("no approval matches `{prefix}`"))),
        many => Err(Error::Request(format!(
            "`{prefix}` is ambiguous: it matches {} approvals ({})",
            many.len(),
            many.join(", ")
        ))),
    }
}
