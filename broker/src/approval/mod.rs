//! Approvals: the record, its repository, ids, the frame shown to humans, and
//! the decision rules every surface goes through (`resolve_approval`).
//!
//! # Layout (each module states its invariants)
//!
//! - [`record`]: the typed record and its field names.
//! - [`repo`]: [`Approvals`], the only issuer of `approval:*` commands, and its Lua.
//! - [`id`]: keyed approval ids and canonical digests.
//! - [`frame`]: the plain-text frame around a parked message.
//! - [`view`]: what approvers are shown of one approval, on every surface.
//! - [`snooze`]: an approver's "later", which moves the deadline.
//! - [`delegation`]: answers given for an approver while they are away.
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
//! - With `quorum` above one, an approval is counted once per identity and the
//!   record is approved by the quorum-th distinct approver; one rejection
//!   rejects. The card stays armed while approvals are counted.
//! - Every answer to an existing record is appended to its requesting
//!   bridge's audit trail: counted (`answered`) or ignored, with why.
//! - A decision is followed by an entry on the requesting worker's wake-up
//!   stream (`{bridge}:decisions`, or `{bridge}:decisions:{worker}`), named
//!   by the record and read in the decision's own step; it goes in the same
//!   round trip as the decision's audit events, after them.

pub mod delegation;
pub mod edit;
pub mod frame;
pub mod id;
pub mod record;
pub mod repo;
pub mod snooze;
pub mod view;

pub use frame::*;
pub use id::*;
pub use record::{field, Card, Record, State, Status, Verdict};
pub use repo::{Approvals, Decided};
pub use view::{Shown, View};

use crate::audit;
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
    /// An approval towards a quorum above one: counted (or, `again`, counted
    /// already for this approver), `have` of `need`; nothing is decided yet.
    Counted {
        have: usize,
        need: usize,
        again: bool,
    },
    /// No map entry for that external id: not an answer to a notification.
    Unknown,
    /// The answerer is not on the requesting bridge's approvers list.
    NotAllowed,
    /// Under a quorum, an approval from a person who edited the message: not
    /// counted (the editor proposes, others dispose); the card stays armed.
    EditorNotCounted,
    /// Under a quorum, a second approval through one shared proof (the page's
    /// Redis password): not counted, since one password cannot stand for two
    /// people; the others answer on a surface of their own.
    SharedProofCounted,
    /// Handed to the requesting bridge's outbox, which applies it (a
    /// surface's answer, see [`crate::request`]); its outcome is in the trail.
    Submitted,
    /// Nothing decided, and why ([`Late`]).
    Late(Late),
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
    /// The card answered (its external id on the notify bridge), when the
    /// answer came through one: an answer to a card an edit superseded is late.
    pub card: Option<&'a str>,
    /// The whole-message digest the approver was shown, when the surface knows
    /// it (review, the web page): an answer to a version since edited is late.
    pub seen: Option<&'a str>,
    /// What a quorum counts the approver as (its person); set by [`decide`]
    /// from the config, never by a surface.
    pub counts_as: Option<&'a str>,
    /// Whether an editor's approval counts toward a quorum (set by [`decide`]).
    pub editors_count: bool,
    /// The person this answer counts for as their delegate (set by
    /// [`decide`] from a sealed delegation, never by a surface).
    pub delegate_of: Option<&'a str>,
    /// The shared proof the answer came through (`page`: the approval page's
    /// one Redis password proves all its users; `ingest:NAME`: the surface's
    /// ingest reports everyone on its platform), set by whoever read it from
    /// that channel; under a quorum one such proof counts once, unless the
    /// bridge sets `approval.trust_surfaces`.
    pub proof: Option<&'a str>,
}

impl<'a> Answer<'a> {
    /// An answer given now by `clock`.
    pub fn new(clock: &Clock, verdict: Verdict, approver: &'a str, reason: &'a str) -> Answer<'a> {
        Answer {
            verdict,
            approver,
            reason,
            at: clock.now_secs_f64(),
            card: None,
            seen: None,
            counts_as: None,
            editors_count: false,
            delegate_of: None,
            proof: None,
        }
    }

    /// The same answer, bound to the digest the approver was shown (an empty
    /// one binds to what `decide` reads, as no digest does).
    pub fn seeing(self, digest: &'a str) -> Answer<'a> {
        Answer {
            seen: (!digest.is_empty()).then_some(digest).or(self.seen),
            ..self
        }
    }

    /// The audit event of this answer on `record`'s trail.
    fn event(&self, record: &Record, kind: audit::Kind) -> audit::Event {
        audit::Event::new(record.source(), kind, &record.id, self.at)
            .with(audit::field::BY, self.approver)
            .with(audit::field::VERDICT, self.verdict.as_str())
            // Bounded: an answer that changes nothing cannot bloat the trail.
            .with(
                audit::field::REASON,
                self.reason.chars().take(2000).collect::<String>(),
            )
            .with(audit::field::FOR, self.delegate_of.unwrap_or(""))
    }
}

/// The cards of `record` its requesting bridge acts on: those on a surface
/// its config still asks on, each with the channel the config names. A
/// record's card fields are writable by every surface that shows one (Redis
/// ACLs do not reach inside a hash), so where a card goes and which bridge
/// is written to come from the config, never from the record; a card of a
/// surface no longer configured is left alone (its bridge's streams are out
/// of this bridge's reach).
pub fn cards_asked(config: &Config, record: &Record) -> Vec<Card> {
    record
        .cards()
        .into_iter()
        .filter_map(|mut card| {
            let channel =
                config.card_channel_at(record.source(), &card.bridge, record.escalated)?;
            card.channel = channel.to_string();
            Some(card)
        })
        .collect()
}

/// Whether `id` is an approval of a bridge that asks through surface
/// `surface`: the only records that surface's services may touch (their ACL
/// follows the ids' tags), so anything else is refused unread.
pub fn asked_through(config: &Config, surface: &str, id: &str) -> bool {
    config.requesters_of(surface).any(|b| is_id_of(id, b))
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
    if !asked_through(config, source, &id) {
        return Ok(Outcome::Unknown);
    }
    let answer = Answer {
        card: Some(external_id),
        ..answer
    };
    let outcome = decide(store, config, &id, answer).await?;
    if disarms(&outcome) {
        Approvals::on(store).map_delete(source, external_id).await?;
    }
    Ok(outcome)
}

/// Why an answer decided nothing because of the record's state. The wire
/// spelling (requests' replies, the audit trail) is the lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Late {
    /// No such record: never parked, or settled and gone.
    Missing,
    /// Past its deadline.
    Expired,
    /// Its outcome is recorded already.
    Settled,
    /// Approved already.
    Approved,
    /// Rejected already.
    Rejected,
    /// The message was edited since the version answered was shown.
    Superseded,
    /// The record was changed outside the broker (a seal does not verify).
    Tampered,
    /// Other answers kept landing between this one's read and its write.
    Busy,
    /// A reason a newer version gave (never fails a reply).
    #[serde(other)]
    Unknown,
}

impl Late {
    pub fn as_str(self) -> &'static str {
        match self {
            Late::Missing => "missing",
            Late::Expired => "expired",
            Late::Settled => "settled",
            Late::Approved => "approved",
            Late::Rejected => "rejected",
            Late::Superseded => "superseded",
            Late::Tampered => "tampered",
            Late::Busy => "busy",
            Late::Unknown => "unknown",
        }
    }

    /// Whether the card stops taking answers: not when the record was
    /// tampered with (it stays answerable once put right) or busy, and not
    /// for an answer bound to another version: an edit disarms the old card
    /// itself, so a card still armed shows the current version, and an
    /// answer naming another digest (a forged button value) must not stop
    /// the real approvers answering on it.
    pub fn disarms(self) -> bool {
        !matches!(self, Late::Tampered | Late::Busy | Late::Superseded)
    }
}

impl std::fmt::Display for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether an answer with this outcome leaves its card unanswerable (its map
/// entry dropped). A counted approval keeps the card armed for the rest of the
/// quorum; a stranger's answer changes nothing; a record changed outside
/// the broker (or busy) stays answerable once it is put right.
pub fn disarms(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Late(late) => late.disarms(),
        other => !matches!(
            other,
            Outcome::NotAllowed
                | Outcome::Counted { .. }
                | Outcome::EditorNotCounted
                | Outcome::SharedProofCounted
                | Outcome::Submitted
        ),
    }
}

/// Decides approval `id` directly (the operator CLI), under the same rules.
/// Every answer to a record that exists is in its bridge's audit trail,
/// counted or ignored and why.
pub async fn decide(
    store: &mut Store,
    config: &Config,
    id: &str,
    answer: Answer<'_>,
) -> Result<Outcome> {
    let record = Approvals::on(store).load(id).await?;
    decide_on(store, config, id, record, answer).await
}

/// [`decide`] on record `id` as the caller has just read it (`None`: it
/// found none), rather than reading it again: one round trip less between
/// a human's answer and the send. Every check is made on that read; the
/// script refuses the answer as late if the version it binds changed since,
/// and an approval as stale if anything it counts with changed (then the
/// record is read afresh and the answer tried again).
pub async fn decide_on(
    store: &mut Store,
    config: &Config,
    id: &str,
    record: Option<Record>,
    answer: Answer<'_>,
) -> Result<Outcome> {
    let mut read = match record {
        // Read under another id: not this one's read; read again below.
        Some(r) if r.id != id => None,
        r => Some(r),
    };
    // Another decider's count landed between this one's read and its write:
    // read again (a few times; then it is reported as busy).
    for _ in 0..3 {
        let record = match read.take() {
            Some(record) => record,
            None => Approvals::on(store).load(id).await?,
        };
        match decide_once(store, config, record, answer).await? {
            Applied::Stale => continue,
            Applied::Done(outcome) => return Ok(outcome),
        }
    }
    Ok(Outcome::Late(Late::Busy))
}

/// One attempt at a decision: done, or to read again (another decider's
/// count landed between this one's read and its write).
enum Applied {
    Done(Outcome),
    Stale,
}

async fn decide_once(
    store: &mut Store,
    config: &Config,
    record: Option<Record>,
    answer: Answer<'_>,
) -> Result<Applied> {
    let Some(record) = record else {
        return Ok(Applied::Done(Outcome::Late(Late::Missing)));
    };
    // Email addresses compare without case: one person is one identity.
    let approver = crate::identity::Identity::read(answer.approver);
    let allowed = config
        .bridges
        .get(record.source())
        .is_some_and(|b| b.approval.allows_at(&approver, record.escalated));
    // Not an approver: a delegate's answer counts for whom it stands in.
    let delegation = match allowed {
        true => None,
        false => {
            delegation::acting_for(
                store,
                config,
                record.source(),
                &approver,
                answer.at,
                record.created_at,
            )
            .await?
        }
    };
    // One identity answers for one person: having counted (for anyone),
    // it counts for nobody else.
    let counted_before = record
        .approvals
        .iter()
        .any(|a| crate::identity::canonical(a) == crate::identity::canonical(&approver));
    if delegation.is_some() && counted_before {
        let event = Answer {
            approver: &approver,
            ..answer
        }
        .event(&record, audit::Kind::Ignored)
        .with(
            audit::field::WHY,
            "already counted: one identity answers for one person",
        );
        audit::append(store, config, &[event]).await?;
        return Ok(Applied::Done(Outcome::NotAllowed));
    }
    // A quorum counts people: every identity of one person counts as one,
    // and a delegate counts as the delegator.
    let counts_as = match &delegation {
        Some(d) => config.person_key_of(&d.from),
        None => config.counting_key(&approver),
    };
    let rules = config.bridges.get(record.source()).map(|b| &b.approval);
    let editors_count = rules.is_some_and(|a| a.editors_count);
    // A shared password counts once unless the bridge trusts its surfaces.
    let proof = answer
        .proof
        .filter(|_| !rules.is_some_and(|a| a.trust_surfaces));
    // Bound to the version read here when the surface did not say which it
    // showed: an edit landing between this read and the decision wins.
    let answer = Answer {
        approver: &approver,
        seen: answer.seen.or(Some(&record.message_sha256)),
        counts_as: Some(&counts_as),
        editors_count,
        delegate_of: delegation.as_ref().map(|d| d.from.as_str()),
        proof,
        ..answer
    };
    if !allowed && delegation.is_none() {
        tracing::warn!(
            approval = %record.id,
            approver = answer.approver,
            "answer from someone not on approval.approvers ignored"
        );
        let event = answer
            .event(&record, audit::Kind::Ignored)
            .with(audit::field::WHY, "not an approver");
        audit::append(store, config, &[event]).await?;
        return Ok(Applied::Done(Outcome::NotAllowed));
    }
    apply(store, config, &record, answer).await
}

/// Tells an agent that asked for progress (`notices = all`) how many
/// approvals its parked entry has now: a `parked` notice with `approvals`.
/// Who approved is not told (that is for the trail).
async fn tell_counted(store: &mut Store, record: &Record, have: usize, need: usize) -> Result<()> {
    let n = crate::entry::Notice::parked(record, Some((have, need)));
    let inbox = notice_inbox(record)?;
    store
        .xadd(&inbox, &n.fields(&record.stream, &record.entry_id))
        .await?;
    Ok(())
}

/// The inbox of the agent whose outbox the record's entry is in: taken from
/// the record's stream, which must be an outbox of its bridge (see
/// [`view::origin`]), not from its `agent` field, so a writer of the record
/// cannot send an approval's progress to another agent by naming it alone.
pub(crate) fn notice_inbox(record: &Record) -> Result<String> {
    let agent = view::origin(record).map_err(Error::internal)?;
    Ok(crate::keys::inbox_for(agent.as_deref(), record.source()))
}

/// A count of approvals as the record stores it: who approved, the people
/// they count as, the shared proofs they came through (each one a line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub approvals: String,
    pub people: String,
    pub proofs: String,
}

impl Tally {
    /// The count `record` holds.
    pub fn of(record: &Record) -> Tally {
        Tally {
            approvals: record.approvals.join("\n"),
            people: record.approval_people.clone(),
            proofs: record.approval_proofs.clone(),
        }
    }

    fn is_empty(&self) -> bool {
        self.approvals.is_empty() && self.people.is_empty() && self.proofs.is_empty()
    }
}

/// What an approval was verified against, for the script to check it still
/// holds when it decides (`stale` otherwise: a write between the check and
/// the script must not change what is counted or what it is counted toward),
/// and the seal of the count once this approval is added.
#[derive(Debug, Clone, Default)]
pub struct Count {
    pub tally: Tally,
    /// `quorum`, `editors` and `expires_at` as verified; empty when nothing was.
    pub quorum: String,
    pub editors: String,
    pub expires_at: String,
    pub next_seal: String,
}

/// Rejects a pending approval whose request could not be shown to anyone (the
/// notify platform refused it): failing closed at once, and telling the agent
/// why, instead of waiting for a deadline that may never come. The approver is
/// `broker:{notify bridge}`, which no config can name. An approval asked on
/// several surfaces is rejected only once none of them could show its card:
/// each failure is audited (`unshown`) and noted on its card, and while one
/// card is shown or on its way the approval stays asked.
pub async fn reject_unshown(
    store: &mut Store,
    config: &Config,
    clock: &Clock,
    record: &Record,
    notify: &str,
    reason: &str,
) -> Result<Outcome> {
    if !record.also.is_empty() {
        if let Some(card) = record.card(notify) {
            Approvals::on(store).mark_unshown(&record.id, &card).await?;
        }
        let event = audit::Event::new(
            record.source(),
            audit::Kind::Unshown,
            &record.id,
            clock.now_secs_f64(),
        )
        .with(audit::field::NOTIFY, notify)
        .with(
            audit::field::REASON,
            reason.chars().take(2000).collect::<String>(),
        );
        audit::append(store, config, &[event]).await?;
        let now = Approvals::on(store).load(&record.id).await?;
        let others = now.as_ref().is_some_and(|r| {
            cards_asked(config, r)
                .iter()
                .any(|c| !c.unshown && c.bridge != notify)
        });
        if others {
            tracing::warn!(approval = %record.id, surface = notify, reason, "one surface could not show its card; the others are asked");
            return Ok(Outcome::Late(Late::Busy));
        }
    }
    let reason = format!("the approval request could not be shown to approvers: {reason}");
    let approver = crate::identity::Identity::broker(notify);
    let answer = Answer::new(clock, Verdict::Rejected, &approver, &reason);
    Ok(match apply(store, config, record, answer).await? {
        Applied::Done(outcome) => outcome,
        // Decided meanwhile by someone else: nothing left to reject.
        Applied::Stale => Outcome::Late(Late::Busy),
    })
}

/// Writes a decision (pending and in time only), records the answer in the
/// audit trail, and wakes the requester when the status changed.
async fn apply(
    store: &mut Store,
    config: &Config,
    record: &Record,
    given: Answer<'_>,
) -> Result<Applied> {
    let id = record.id.as_str();
    let Answer {
        verdict,
        approver,
        reason,
        at,
        ..
    } = given;
    // An approval carries the requesting bridge's seal over the version it
    // approves; the outbox sends nothing it did not seal (see
    // `IdKey::seal_decision`). Only that bridge's services and the
    // administrator read the key.
    // Before that, the record must still be what the bridge sealed when it
    // parked or edited it (version, quorum, deadline): a password that can
    // write records must not swap the message or the quorum under a human's
    // answer to the genuine card.
    // Under a quorum the count so far is sealed as well, and the script
    // counts only from the state verified here (`stale` otherwise).
    let mut count = Count::default();
    let seal = match (verdict, given.seen) {
        (Verdict::Approved, Some(seen)) => {
            let key = IdKey::existing(store, record.source()).await?;
            let tally = Tally::of(record);
            let version = (record.message_sha256.as_str(), record.revision);
            let counted = match (&key, &record.count_seal) {
                (Some(k), Some(s)) => same_secret(&k.seal_count(id, version, &tally), s),
                _ => tally.is_empty(),
            };
            let sealed = match (&key, &record.version_seal) {
                (Some(k), Some(s)) => same_secret(&k.seal_version(record), s),
                _ => false,
            };
            if let Some(k) = &key {
                let join = |list: &str, item: &str| match (list.is_empty(), item.is_empty()) {
                    (_, true) => list.to_string(),
                    (true, false) => item.to_string(),
                    (false, false) => format!("{list}\n{item}"),
                };
                let next = Tally {
                    approvals: join(&tally.approvals, approver),
                    people: join(&tally.people, given.counts_as.unwrap_or(approver)),
                    proofs: join(&tally.proofs, given.proof.unwrap_or("")),
                };
                count = Count {
                    next_seal: k.seal_count(id, version, &next),
                    tally,
                    quorum: record.quorum.to_string(),
                    editors: record.editors.clone(),
                    expires_at: record.expires_at.to_string(),
                };
            }
            if !(counted && sealed) {
                let which = if sealed { "count" } else { "version" };
                tracing::error!(
                    approval = id,
                    approver,
                    "a record changed outside the broker ({which} seal); nothing decided"
                );
                let event = given.event(record, audit::Kind::Ignored).with(
                    audit::field::WHY,
                    format!("the record was changed outside the broker (its {which} seal does not verify): nothing decided"),
                );
                audit::append(store, config, &[event]).await?;
                return Ok(Applied::Done(Outcome::Late(Late::Tampered)));
            }
            key.map(|k| k.seal_decision(id, seen)).unwrap_or_default()
        }
        _ => String::new(),
    };
    // Announced before it is made: a decider that dies between deciding and
    // its wake-up below has still told the requester to read the record
    // again (at its next sweep), which it otherwise would only by chance.
    wake(store, record.source(), &record.worker, id, Wake::Changed).await?;
    let d = Approvals::on(store)
        .decide(id, &given, &seal, &count)
        .await?;
    if d.answer == Decided::Stale {
        return Ok(Applied::Stale); // read again by `decide`
    }
    let need = record.quorum() as usize;
    // Under a quorum of one the approvals are not listed: the answer is the one.
    let have = match (need, &d.answer, verdict) {
        (1, Decided::Decided, Verdict::Approved) => 1,
        _ => d.approvals.len(),
    };
    let count = format!("{have}/{need}");
    let ignored = |why: &str| {
        given
            .event(record, audit::Kind::Ignored)
            .with(audit::field::WHY, why)
    };
    let (events, outcome, woken) = match d.answer {
        Decided::Decided => {
            tracing::info!(
                approval = id,
                approver,
                verdict = verdict.as_str(),
                "approval decided"
            );
            let answered = given.event(record, audit::Kind::Answered).with(
                audit::field::COUNT,
                if verdict == Verdict::Approved {
                    count
                } else {
                    String::new()
                },
            );
            let by = match verdict {
                Verdict::Approved if need > 1 => d.approvals.join(", "),
                _ => approver.to_string(),
            };
            let decided = audit::Event::new(record.source(), audit::Kind::Decided, id, at)
                .with(audit::field::VERDICT, verdict.as_str())
                .with(audit::field::BY, by)
                .with(audit::field::REASON, reason)
                .with(audit::field::DIGEST, &record.message_sha256)
                .with(
                    audit::field::WAITED,
                    format!("{:.3}", (at - record.created_at as f64).max(0.0)),
                )
                .with(audit::field::STEP, record.escalated.to_string());
            (
                vec![answered, decided],
                Outcome::Decided,
                Some(verdict.as_str()),
            )
        }
        Decided::Counted { again } => {
            tracing::info!(
                approval = id,
                approver,
                have = d.approvals.len(),
                need,
                again,
                "approval counted"
            );
            let event = match again {
                true => ignored("already counted for this approver"),
                false => given
                    .event(record, audit::Kind::Answered)
                    .with(audit::field::COUNT, count),
            };
            let outcome = Outcome::Counted {
                have: d.approvals.len(),
                need,
                again,
            };
            (vec![event], outcome, None)
        }
        // Decided but not yet settled: the requester is woken again, in case the
        // first wake-up was lost (a decider that died between its two steps).
        // A status that is neither reads as rejected (fails closed).
        Decided::Already(status) => {
            let (late, state) = match status {
                Status::Approved => (Late::Approved, "approved"),
                _ => (Late::Rejected, "rejected"),
            };
            tracing::info!(
                approval = id,
                state,
                "late answer ignored; requester woken again"
            );
            let event = ignored(&format!("late: already {state}"));
            (vec![event], Outcome::Late(late), Some(state))
        }
        Decided::SameProof => {
            tracing::info!(
                approval = id,
                approver,
                "a second approval through one service password not counted"
            );
            let event = ignored("under a quorum one service password counts once (the page's proves every web: user, a surface's ingest every identity on its platform); set approval.trust_surfaces to count them apart");
            (vec![event], Outcome::SharedProofCounted, None)
        }
        Decided::Editor => {
            tracing::info!(approval = id, approver, "an editor's approval not counted");
            let event =
                ignored("edited this message: under a quorum the editor's approval does not count");
            (vec![event], Outcome::EditorNotCounted, None)
        }
        Decided::Superseded => {
            tracing::info!(approval = id, "answer to an edited version ignored");
            let event = ignored("late: the message was edited since this version was shown");
            (vec![event], Outcome::Late(Late::Superseded), None)
        }
        Decided::Stale => return Ok(Applied::Stale),
        late @ (Decided::Missing | Decided::Expired | Decided::Settled) => {
            let late = match late {
                Decided::Missing => Late::Missing,
                Decided::Expired => Late::Expired,
                _ => Late::Settled,
            };
            tracing::info!(approval = id, state = %late, "late answer ignored");
            let event = ignored(&format!("late: {late}"));
            (vec![event], Outcome::Late(late), None)
        }
    };
    // Wake the requesting worker (the one the record names, read in the same
    // step as the decision), right after the trail in the same round trip
    // (on a Cluster, the wake-up's run follows the trail's answer). If
    // the wake-up is lost (the decider died in between), the announcement
    // above has the requester's next sweep read the record; if the cap
    // trimmed both unread, answering again through the CLI wakes it again, a
    // restart re-reads every record, and the blind slice reaches it in the end.
    let wake = woken.map(|status| wake_cmd(record.source(), &d.worker, id, Wake::Decided(status)));
    audit::append_then(store, config, &events, wake).await?;
    // After the trail: the count is what matters; telling the agent is
    // informational, and a failure to is logged, not retried.
    if let Outcome::Counted {
        have,
        need,
        again: false,
    } = &outcome
    {
        if record.progress {
            if let Err(e) = tell_counted(store, record, *have, *need).await {
                tracing::warn!(approval = %record.id, error = %e, "the agent was not told of the count");
            }
        }
    }
    // Told to the human only once a failover cannot lose it (after its audit
    // event and wake-up, so a shortfall retried finds it decided, not undone).
    store.conn.replicated("the decision").await?;
    Ok(Applied::Done(outcome))
}

/// What a wake-up tells the requesting worker (its decisions stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake<'a> {
    /// Decided as this status: the entry is settled at once.
    Decided(&'a str),
    /// This surface showed its card: no longer watched for it.
    Shown(&'a str),
    /// About to change (a decision or an edit under way): the record is
    /// read again at the next two sweeps, whatever the change turns out to be.
    Changed,
}

/// The `XADD` that wakes worker `worker` of bridge `requester` about
/// approval `id` (capped: see [`DECISIONS_KEPT`]).
pub fn wake_cmd(requester: &str, worker: &str, id: &str, what: Wake) -> redis::Cmd {
    use crate::fields::decisions::{APPROVAL_ID, SHOWN, STATUS};
    let mut cmd = redis::cmd("XADD");
    cmd.arg(keys::decisions_for(requester, worker))
        .arg("MAXLEN")
        .arg("~")
        .arg(DECISIONS_KEPT)
        .arg("*")
        .arg(APPROVAL_ID)
        .arg(id);
    match what {
        Wake::Decided(status) => cmd.arg(STATUS).arg(status),
        Wake::Shown(surface) => cmd.arg(SHOWN).arg(surface),
        Wake::Changed => &mut cmd,
    };
    cmd
}

/// Wakes worker `worker` of bridge `requester` about approval `id`.
pub async fn wake(
    store: &mut Store,
    requester: &str,
    worker: &str,
    id: &str,
    what: Wake<'_>,
) -> Result<()> {
    let _: String = wake_cmd(requester, worker, id, what)
        .query_async(&mut store.conn)
        .await
        .map_err(|e| {
            let stream = keys::decisions_for(requester, worker);
            Error::from_redis(&format!("XADD {stream}"), e)
        })?;
    Ok(())
}

/// The card approvers were shown for `record`, as the notify bridge got it
/// (the frame, with what the approval binds: for a declared action the exact
/// command and the bridge's findings), while its notification entry is kept.
/// Surfaces show this for a declared action, never the agent's raw fields,
/// whose order and text the agent chose. The first card (of those its
/// bridge asks on, see [`cards_asked`]) whose notification is still kept
/// and is the one its card's digest binds, with a notification's fields.
pub async fn shown_card(
    store: &mut Store,
    config: &Config,
    record: &Record,
) -> Result<Option<String>> {
    for card in cards_asked(config, record) {
        let Some(entry_id) = card.entry.as_ref().or(card.notified.as_ref()) else {
            continue;
        };
        let entry = store.entry(&keys::outbox(&card.bridge), entry_id).await?;
        let ours = entry.filter(|e| is_card_of(e, &record.id, &card));
        if let Some(content) = ours.and_then(|e| notification_text(record, |name| e.text(name))) {
            return Ok(Some(content));
        }
    }
    Ok(None)
}

/// Whether `entry` is the notification of approval `id` that `card` binds:
/// its id, a notification's fields, and the card's digest.
pub fn is_card_of(entry: &crate::store::Entry, id: &str, card: &Card) -> bool {
    is_notification_of(entry, id, &card.sha256)
}

/// Whether `entry` is a notification of approval `id` with digest `digest`.
pub fn is_notification_of(entry: &crate::store::Entry, id: &str, digest: &str) -> bool {
    entry.text(crate::fields::outbox::APPROVAL_ID) == Some(id)
        && is_notification_layout(entry.fields.iter().map(|(k, _)| k.as_str()))
        && entry_sha256(&entry.fields) == digest
}

/// Ids of every approval record, by `SCAN` on every master (tests and
/// tools: operators list from the pending index).
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
        [] => Err(Error::refused(format!("no approval matches `{prefix}`"))),
        many => Err(Error::refused(format!(
            "`{prefix}` is ambiguous: it matches {} approvals ({})",
            many.len(),
            many.join(", ")
        ))),
    }
}
