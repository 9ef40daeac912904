//! The approval record, typed: what one `approval:{uuid}` hash holds.
//!
//! Invariants:
//! - Field names exist here only ([`field`]); [`Record::from_map`] and
//!   [`Record::to_pairs`] are the only translations between hash and type, and
//!   the Lua in [`super::repo`] names only fields listed in [`field::ALL`].
//! - `expired` is never written. [`State::of`] reads `expires_at` *before*
//!   `status`: past the deadline a record is expired whatever `status` says.
//! - A status that is not one of the three fails closed: it reads as rejected.
//! - Absent optional fields are not written; an empty value reads as absent, so
//!   records written by older versions (which wrote `""`) read the same.

use std::collections::HashMap;

/// The record's field names, the one place they are spelled.
pub mod field {
    pub const STATUS: &str = "status";
    pub const SOURCE: &str = "source";
    pub const AGENT: &str = "agent";
    pub const CHANNEL_ID: &str = "channel_id";
    pub const SUBJECT: &str = "subject";
    pub const REPLY_TO: &str = "reply_to";
    pub const CONTENT_PREVIEW: &str = "content_preview";
    pub const CONTENT_SHA256: &str = "content_sha256";
    pub const MESSAGE_SHA256: &str = "message_sha256";
    pub const CONTENT_BYTES: &str = "content_bytes";
    pub const REQUEST_ID: &str = "request_id";
    pub const CREATED_AT: &str = "created_at";
    pub const EXPIRES_AT: &str = "expires_at";
    pub const STREAM: &str = "stream";
    pub const ENTRY_ID: &str = "entry_id";
    pub const NOTIFY: &str = "notify";
    pub const NOTIFY_CHANNEL: &str = "notify_channel";
    pub const NOTIFY_SHA256: &str = "notify_sha256";
    pub const WORKER: &str = "worker";
    pub const NONCE: &str = "nonce";
    pub const NOTIFIED: &str = "notified";
    pub const NOTIFY_ENTRY: &str = "notify_entry";
    pub const NOTIFY_EXTERNAL_ID: &str = "notify_external_id";
    pub const APPROVER: &str = "approver";
    pub const REASON: &str = "reason";
    pub const DECIDED_AT: &str = "decided_at";
    pub const DELIVERY_STARTED: &str = "delivery_started";
    pub const SETTLED_AT: &str = "settled_at";
    pub const OUTCOME: &str = "outcome";
    pub const OUTCOME_SENT: &str = "outcome_sent";
    pub const QUORUM: &str = "quorum";
    pub const APPROVALS: &str = "approvals";
    /// What a quorum counted each approval as (its person), one per line.
    pub const APPROVAL_PEOPLE: &str = "approval_people";
    /// Who edited the message (as a quorum counts them), one per line.
    pub const EDITORS: &str = "editors";
    /// The shared proofs counted approvals came through (`page`), one per line.
    pub const APPROVAL_PROOFS: &str = "approval_proofs";
    pub const REVISION: &str = "revision";
    pub const EDITED_MESSAGE: &str = "edited_message";
    pub const EDITED_BY: &str = "edited_by";
    pub const EDITED_AT: &str = "edited_at";
    pub const ORIGINAL_SHA256: &str = "original_sha256";
    pub const ORIGINAL_CHANNEL_ID: &str = "original_channel_id";
    pub const ORIGINAL_SUBJECT: &str = "original_subject";
    pub const ORIGINAL_PREVIEW: &str = "original_preview";
    pub const SUPERSEDED: &str = "superseded";
    /// The requesting bridge's seal over an approval (see
    /// [`crate::approval::IdKey::seal_decision`]): only what it sealed is sent.
    pub const DECISION_SEAL: &str = "decision_seal";
    /// The requesting bridge's seal over the version, quorum and deadline
    /// (see [`crate::approval::IdKey::seal_version`]).
    pub const VERSION_SEAL: &str = "version_seal";
    /// The requesting bridge's seal over the count so far
    /// (`approval_people`, `approval_proofs`; see
    /// [`crate::approval::IdKey::seal_count`]).
    pub const COUNT_SEAL: &str = "count_seal";
    /// `1` when the approval asks to run a declared action (its bridge's type
    /// is gated in the registry): approvers judge the card, edits are refused.
    pub const GATED: &str = "gated";
    /// `1` when the agent asked for progress notices (`notices = all`): it
    /// is also told each approval counted short of the quorum.
    pub const PROGRESS: &str = "progress";
    /// How many times the deadline was moved by a "later" (see
    /// [`crate::approval::snooze`]); the last one's author, and the
    /// deadline it set (also `expires_at`, which the version seal covers).
    pub const SNOOZES: &str = "snoozes";
    pub const SNOOZED_BY: &str = "snoozed_by";
    pub const SNOOZED_UNTIL: &str = "snoozed_until";
    /// The nonce of the last snooze request applied, so applying it again
    /// (after a failure further on) moves nothing twice.
    pub const SNOOZE_REQUEST: &str = "snooze_request";
    /// When the requesting outbox asked the card's surface to remind the
    /// approvers (`approval.remind_after`); once per approval.
    pub const REMINDED: &str = "reminded";
    /// The surfaces asked beside `notify` (`approval.also`), one bridge a
    /// line. Each one's card is kept under the card fields prefixed with
    /// `{bridge}.` (see [`card_field`]); `notify`'s own under the plain names.
    pub const ALSO: &str = "also";
    /// How many steps of the escalation ladder (`approval.escalate`) were
    /// taken: each asked its surface (a card in `also`) and let its
    /// approvers answer. Covered by the version seal.
    pub const ESCALATED: &str = "escalated";
    /// `1` once the card's surface could not show it (one of several: the
    /// approval is rejected unshown only when every card is).
    pub const UNSHOWN: &str = "unshown";

    /// The fields each card of a record has: the primary card's under these
    /// names, every other card's prefixed with its bridge (see [`card_field`]).
    pub const CARD: &[&str] = &[
        NOTIFY,
        NOTIFY_CHANNEL,
        NOTIFY_SHA256,
        NOTIFIED,
        NOTIFY_ENTRY,
        NOTIFY_EXTERNAL_ID,
        OUTCOME_SENT,
        SUPERSEDED,
        UNSHOWN,
    ];

    /// Card field `name` under `prefix` (empty for the primary card, else
    /// `{bridge}.`, see [`super::Card::prefix`]).
    pub fn card_field(prefix: &str, name: &str) -> String {
        format!("{prefix}{name}")
    }

    /// Every field, in the order `approvals show` lists them.
    pub const ALL: &[&str] = &[
        APPROVAL_PEOPLE,
        APPROVAL_PROOFS,
        EDITORS,
        STATUS,
        SOURCE,
        AGENT,
        CHANNEL_ID,
        SUBJECT,
        REPLY_TO,
        CONTENT_PREVIEW,
        CONTENT_SHA256,
        MESSAGE_SHA256,
        CONTENT_BYTES,
        REQUEST_ID,
        CREATED_AT,
        EXPIRES_AT,
        STREAM,
        ENTRY_ID,
        NOTIFY,
        NOTIFY_CHANNEL,
        NOTIFY_SHA256,
        WORKER,
        NONCE,
        NOTIFIED,
        NOTIFY_ENTRY,
        NOTIFY_EXTERNAL_ID,
        APPROVER,
        REASON,
        DECIDED_AT,
        DELIVERY_STARTED,
        SETTLED_AT,
        OUTCOME,
        OUTCOME_SENT,
        QUORUM,
        APPROVALS,
        REVISION,
        EDITED_MESSAGE,
        EDITED_BY,
        EDITED_AT,
        ORIGINAL_SHA256,
        ORIGINAL_CHANNEL_ID,
        ORIGINAL_SUBJECT,
        ORIGINAL_PREVIEW,
        SUPERSEDED,
        DECISION_SEAL,
        VERSION_SEAL,
        COUNT_SEAL,
        GATED,
        PROGRESS,
        SNOOZES,
        SNOOZED_BY,
        SNOOZED_UNTIL,
        SNOOZE_REQUEST,
        REMINDED,
        ALSO,
        ESCALATED,
        UNSHOWN,
    ];
}

/// One surface's card of an approval: where it is asked, and how far its
/// notify side got. The primary card (`approval.notify`) is kept in the
/// record's own fields; the others (`approval.also`) under prefixed names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Card {
    /// The notify bridge that shows it.
    pub bridge: String,
    /// Where on that bridge.
    pub channel: String,
    /// The digest of the one notification entry its notify side will show.
    pub sha256: String,
    /// The notification's entry id in the notify bridge's outbox.
    pub notified: Option<String>,
    /// The notification entry the notify side claimed (the only one it shows).
    pub entry: Option<String>,
    /// The shown card's id on the notify platform.
    pub external_id: Option<String>,
    /// The outcome entry was written to the notify bridge's outbox.
    pub outcome_sent: bool,
    /// Cards of earlier versions on this surface: answers to them no longer count.
    pub superseded: Vec<String>,
    /// Its surface could not show it (see [`field::UNSHOWN`]).
    pub unshown: bool,
    /// Whether it is the primary card (its fields unprefixed).
    pub primary: bool,
}

impl Card {
    /// What its field names start with: nothing for the primary card,
    /// `{bridge}.` for the others (bridge names are plain words, so the
    /// prefixed names cannot collide with the record's own).
    pub fn prefix(&self) -> String {
        if self.primary {
            String::new()
        } else {
            format!("{}.", self.bridge)
        }
    }

    /// Its field `name` (one of [`field::CARD`]).
    pub fn field(&self, name: &str) -> String {
        field::card_field(&self.prefix(), name)
    }

    /// Its fields as stored (absent ones left out).
    fn to_pairs(&self) -> Vec<(String, String)> {
        use field::*;
        let mut pairs = vec![
            (NOTIFY, Some(self.bridge.clone())),
            (NOTIFY_CHANNEL, Some(self.channel.clone())),
            (NOTIFY_SHA256, Some(self.sha256.clone())),
            (NOTIFIED, self.notified.clone()),
            (NOTIFY_ENTRY, self.entry.clone()),
            (NOTIFY_EXTERNAL_ID, self.external_id.clone()),
            (OUTCOME_SENT, self.outcome_sent.then(|| "1".to_string())),
            (SUPERSEDED, Some(self.superseded.join("\n"))),
            (UNSHOWN, self.unshown.then(|| "1".to_string())),
        ];
        pairs
            .drain(..)
            .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| (self.field(k), v)))
            .collect()
    }

    /// Reads card `bridge` (`primary`: the unprefixed one) out of a hash.
    fn from_map(bridge: &str, primary: bool, map: &mut HashMap<String, String>) -> Card {
        use field::*;
        let card = Card {
            bridge: bridge.to_string(),
            primary,
            ..Card::default()
        };
        let mut text = |k: &str| map.remove(&card.field(k)).filter(|v| !v.is_empty());
        let bridge = text(NOTIFY);
        let channel = text(NOTIFY_CHANNEL).unwrap_or_default();
        let sha256 = text(NOTIFY_SHA256).unwrap_or_default();
        let notified = text(NOTIFIED);
        let entry = text(NOTIFY_ENTRY);
        let external_id = text(NOTIFY_EXTERNAL_ID);
        let outcome_sent = text(OUTCOME_SENT).is_some();
        let superseded = text(SUPERSEDED)
            .map(|a| a.lines().map(str::to_string).collect())
            .unwrap_or_default();
        let unshown = text(UNSHOWN).is_some();
        Card {
            bridge: if primary {
                bridge.unwrap_or_default()
            } else {
                card.bridge.clone()
            },
            channel,
            sha256,
            notified,
            entry,
            external_id,
            outcome_sent,
            superseded,
            unshown,
            ..card
        }
    }
}

/// A decision a human can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approved,
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
        }
    }
}

/// The written status: what was decided, if anything (never `expired`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Status {
    #[default]
    Pending,
    Approved,
    Rejected,
}

impl Status {
    /// Anything but the three names reads as rejected (fail closed).
    pub fn parse(s: &str) -> Status {
        match s {
            "pending" => Status::Pending,
            "approved" => Status::Approved,
            _ => Status::Rejected,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Rejected => "rejected",
        }
    }
}

/// What a record reads as now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Approved,
    Rejected,
    Expired,
}

impl State {
    /// Lazy expiry: the deadline is checked first, then the written status.
    /// A record whose status is unreadable fails closed (rejected).
    pub fn of(status: &str, expires_at: u64, now: f64) -> State {
        if expires_at != 0 && now >= expires_at as f64 {
            return State::Expired;
        }
        match Status::parse(status) {
            Status::Pending => State::Pending,
            Status::Approved => State::Approved,
            Status::Rejected => State::Rejected,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Rejected => "rejected",
            State::Expired => "expired",
        }
    }
}

/// An `approval:{uuid}` hash. The first group of fields is written once, when
/// the entry is parked; the rest record progress, each by one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub id: String,
    pub status: Status,
    /// The requesting bridge (the protocol's `source`).
    pub source: String,
    /// The agent whose per-agent stream the entry came from.
    pub agent: Option<String>,
    pub channel_id: String,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    pub content_preview: String,
    /// The content's own digest, as records parked before 2026-12-07 hold it
    /// (kept in step by an edit there). Not written on new records: nothing
    /// reads it, `message_sha256` binds the content with the rest, and it
    /// cost one size class of the record's memory.
    pub content_sha256: Option<String>,
    /// The whole-message digest an approved entry is checked against before it is sent.
    pub message_sha256: String,
    pub content_bytes: u64,
    pub request_id: Option<String>,
    pub created_at: u64,
    /// Unix seconds; 0 never expires.
    pub expires_at: u64,
    pub stream: String,
    pub entry_id: String,
    /// The notify bridge, and where on it the request is shown.
    pub notify: String,
    pub notify_channel: String,
    /// The digest of the one notification entry the notify side will show.
    pub notify_sha256: String,
    /// The outbox worker whose wake-up stream a decision goes to.
    pub worker: String,
    /// Unguessable and single-use: notify bridges build reply tokens from it.
    pub nonce: String,

    /// The notification's entry id in the notify bridge's outbox.
    pub notified: Option<String>,
    /// The notification entry the notify side claimed (the only one it shows).
    pub notify_entry: Option<String>,
    /// The shown notification's id on the notify platform.
    pub notify_external_id: Option<String>,
    pub approver: Option<String>,
    pub reason: Option<String>,
    pub decided_at: Option<u64>,
    pub delivery_started: Option<u64>,
    pub settled_at: Option<u64>,
    pub outcome: Option<String>,
    /// The outcome entry was written to the notify bridge's outbox.
    pub outcome_sent: bool,
    /// Distinct approvers needed (`approval.quorum` when parked; absent reads as 1).
    pub quorum: u32,
    /// Who approved so far, in order (one line each in the hash).
    pub approvals: Vec<String>,

    /// Edits so far (0: the agent's message as written). The message fields
    /// above (`channel_id`, `subject`, `content_*`, `message_sha256`) are always
    /// the version that will be sent; an edit keeps the agent's beside them.
    pub revision: u32,
    /// The edited message ([`super::edit::EditedMessage`], JSON).
    pub edited_message: Option<String>,
    pub edited_by: Option<String>,
    pub edited_at: Option<u64>,
    /// The agent's version, kept by the first edit.
    pub original_sha256: Option<String>,
    pub original_channel_id: Option<String>,
    pub original_subject: Option<String>,
    pub original_preview: Option<String>,
    /// Cards of earlier versions (external ids on the notify bridge): answers
    /// to them no longer count.
    pub superseded: Vec<String>,
    /// The requesting bridge's seal over the approval, once approved.
    pub decision_seal: Option<String>,
    /// The requesting bridge's seal over what decides the approval.
    pub version_seal: Option<String>,
    /// Under a quorum: the people counted so far, and the shared proofs
    /// they came through, as stored (one per line).
    pub approval_people: String,
    pub approval_proofs: String,
    /// Who edited, as a quorum counts them (`editors`, one a line): their own
    /// approvals do not count toward a quorum unless the config says so.
    pub editors: String,
    /// The requesting bridge's seal over those two.
    pub count_seal: Option<String>,
    /// Whether the approval asks to run a declared action, as written at park
    /// time; `None` on records written before the field existed.
    pub gated: Option<bool>,
    /// See [`field::PROGRESS`].
    pub progress: bool,
    /// Snoozes so far (see [`field::SNOOZES`]).
    pub snoozes: u32,
    pub snoozed_by: Option<String>,
    pub snoozed_until: Option<u64>,
    /// See [`field::SNOOZE_REQUEST`].
    pub snooze_request: Option<String>,
    /// See [`field::REMINDED`].
    pub reminded: Option<u64>,
    /// The cards asked beside the primary one (`approval.also`, then the
    /// escalation steps taken), in order.
    pub also: Vec<Card>,
    /// See [`field::ESCALATED`].
    pub escalated: u32,
    /// The primary card's [`field::UNSHOWN`].
    pub unshown: bool,
}

impl Record {
    /// Reads a hash as a record. Unknown fields are ignored.
    pub fn from_map(id: &str, mut map: HashMap<String, String>) -> Record {
        use field::*;
        let also: Vec<Card> = map
            .remove(ALSO)
            .unwrap_or_default()
            .lines()
            .filter(|b| !b.is_empty())
            .map(|b| Card::from_map(b, false, &mut map))
            .collect();
        let mut text = |k: &str| map.remove(k).filter(|v| !v.is_empty());
        let number = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        Record {
            id: id.to_string(),
            status: Status::parse(&text(STATUS).unwrap_or_default()),
            source: text(SOURCE).unwrap_or_default(),
            agent: text(AGENT),
            channel_id: text(CHANNEL_ID).unwrap_or_default(),
            subject: text(SUBJECT),
            reply_to: text(REPLY_TO),
            content_preview: text(CONTENT_PREVIEW).unwrap_or_default(),
            content_sha256: text(CONTENT_SHA256),
            message_sha256: text(MESSAGE_SHA256).unwrap_or_default(),
            content_bytes: number(text(CONTENT_BYTES)).unwrap_or(0),
            request_id: text(REQUEST_ID),
            created_at: number(text(CREATED_AT)).unwrap_or(0),
            expires_at: number(text(EXPIRES_AT)).unwrap_or(0),
            stream: text(STREAM).unwrap_or_default(),
            entry_id: text(ENTRY_ID).unwrap_or_default(),
            notify: text(NOTIFY).unwrap_or_default(),
            notify_channel: text(NOTIFY_CHANNEL).unwrap_or_default(),
            notify_sha256: text(NOTIFY_SHA256).unwrap_or_default(),
            worker: text(WORKER).unwrap_or_default(),
            nonce: text(NONCE).unwrap_or_default(),
            notified: text(NOTIFIED),
            notify_entry: text(NOTIFY_ENTRY),
            notify_external_id: text(NOTIFY_EXTERNAL_ID),
            approver: text(APPROVER),
            reason: text(REASON),
            decided_at: number(text(DECIDED_AT)),
            delivery_started: number(text(DELIVERY_STARTED)),
            settled_at: number(text(SETTLED_AT)),
            outcome: text(OUTCOME),
            outcome_sent: text(OUTCOME_SENT).is_some(),
            quorum: number(text(QUORUM)).map_or(1, |q| q.clamp(1, u32::MAX as u64) as u32),
            approvals: text(APPROVALS)
                .map(|a| a.lines().map(str::to_string).collect())
                .unwrap_or_default(),
            revision: number(text(REVISION)).map_or(0, |r| r.min(u32::MAX as u64) as u32),
            edited_message: text(EDITED_MESSAGE),
            edited_by: text(EDITED_BY),
            edited_at: number(text(EDITED_AT)),
            original_sha256: text(ORIGINAL_SHA256),
            original_channel_id: text(ORIGINAL_CHANNEL_ID),
            original_subject: text(ORIGINAL_SUBJECT),
            original_preview: text(ORIGINAL_PREVIEW),
            superseded: text(SUPERSEDED)
                .map(|a| a.lines().map(str::to_string).collect())
                .unwrap_or_default(),
            decision_seal: text(DECISION_SEAL),
            version_seal: text(VERSION_SEAL),
            approval_people: text(APPROVAL_PEOPLE).unwrap_or_default(),
            approval_proofs: text(APPROVAL_PROOFS).unwrap_or_default(),
            editors: text(EDITORS).unwrap_or_default(),
            count_seal: text(COUNT_SEAL),
            gated: text(GATED).map(|g| g != "0"),
            progress: text(PROGRESS).is_some_and(|p| p == "1"),
            snoozes: number(text(SNOOZES)).map_or(0, |n| n.min(u32::MAX as u64) as u32),
            snoozed_by: text(SNOOZED_BY),
            snoozed_until: number(text(SNOOZED_UNTIL)),
            snooze_request: text(SNOOZE_REQUEST),
            reminded: number(text(REMINDED)),
            escalated: number(text(ESCALATED)).map_or(0, |n| n.min(u32::MAX as u64) as u32),
            unshown: text(UNSHOWN).is_some(),
            also,
        }
    }

    /// The hash's fields, in [`field::ALL`] order; absent ones left out.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        use field::*;
        let some = |k: &'static str, v: &Option<String>| v.clone().map(|v| (k, v));
        let num = |k: &'static str, v: Option<u64>| v.map(|v| (k, v.to_string()));
        let text = |k: &'static str, v: &str| Some((k, v.to_string()));
        [
            text(STATUS, self.status.as_str()),
            text(SOURCE, &self.source),
            some(AGENT, &self.agent),
            text(CHANNEL_ID, &self.channel_id),
            some(SUBJECT, &self.subject),
            some(REPLY_TO, &self.reply_to),
            text(CONTENT_PREVIEW, &self.content_preview),
            some(CONTENT_SHA256, &self.content_sha256),
            text(MESSAGE_SHA256, &self.message_sha256),
            num(CONTENT_BYTES, Some(self.content_bytes)),
            some(REQUEST_ID, &self.request_id),
            num(CREATED_AT, Some(self.created_at)),
            num(EXPIRES_AT, Some(self.expires_at)),
            text(STREAM, &self.stream),
            text(ENTRY_ID, &self.entry_id),
            text(NOTIFY, &self.notify),
            text(NOTIFY_CHANNEL, &self.notify_channel),
            text(NOTIFY_SHA256, &self.notify_sha256),
            text(WORKER, &self.worker),
            text(NONCE, &self.nonce),
            some(NOTIFIED, &self.notified),
            some(NOTIFY_ENTRY, &self.notify_entry),
            some(NOTIFY_EXTERNAL_ID, &self.notify_external_id),
            some(APPROVER, &self.approver),
            some(REASON, &self.reason),
            num(DECIDED_AT, self.decided_at),
            num(DELIVERY_STARTED, self.delivery_started),
            num(SETTLED_AT, self.settled_at),
            some(OUTCOME, &self.outcome),
            self.outcome_sent.then(|| (OUTCOME_SENT, "1".to_string())),
            (self.quorum > 1).then(|| (QUORUM, self.quorum.to_string())),
            text(APPROVALS, &self.approvals.join("\n")),
            (self.revision > 0).then(|| (REVISION, self.revision.to_string())),
            some(EDITED_MESSAGE, &self.edited_message),
            some(EDITED_BY, &self.edited_by),
            num(EDITED_AT, self.edited_at),
            some(ORIGINAL_SHA256, &self.original_sha256),
            some(ORIGINAL_CHANNEL_ID, &self.original_channel_id),
            some(ORIGINAL_SUBJECT, &self.original_subject),
            some(ORIGINAL_PREVIEW, &self.original_preview),
            text(SUPERSEDED, &self.superseded.join("\n")),
            some(DECISION_SEAL, &self.decision_seal),
            some(VERSION_SEAL, &self.version_seal),
            text(APPROVAL_PEOPLE, &self.approval_people),
            text(APPROVAL_PROOFS, &self.approval_proofs),
            text(EDITORS, &self.editors),
            some(COUNT_SEAL, &self.count_seal),
            self.gated
                .map(|g| (GATED, if g { "1" } else { "0" }.to_string())),
            self.progress.then(|| (PROGRESS, "1".to_string())),
            (self.snoozes > 0).then(|| (SNOOZES, self.snoozes.to_string())),
            some(SNOOZED_BY, &self.snoozed_by),
            num(SNOOZED_UNTIL, self.snoozed_until),
            some(SNOOZE_REQUEST, &self.snooze_request),
            num(REMINDED, self.reminded),
            text(
                ALSO,
                &self
                    .also
                    .iter()
                    .map(|c| c.bridge.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            (self.escalated > 0).then(|| (ESCALATED, self.escalated.to_string())),
            self.unshown.then(|| (UNSHOWN, "1".to_string())),
        ]
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.also.iter().flat_map(Card::to_pairs))
        .collect()
    }

    /// Every card of the approval: the primary one (`notify`), then those
    /// asked beside it.
    pub fn cards(&self) -> Vec<Card> {
        let primary = Card {
            bridge: self.notify.clone(),
            channel: self.notify_channel.clone(),
            sha256: self.notify_sha256.clone(),
            notified: self.notified.clone(),
            entry: self.notify_entry.clone(),
            external_id: self.notify_external_id.clone(),
            outcome_sent: self.outcome_sent,
            superseded: self.superseded.clone(),
            unshown: self.unshown,
            primary: true,
        };
        std::iter::once(primary)
            .chain(self.also.iter().cloned())
            .collect()
    }

    /// "escalated 1 step: asked on desk, hall" once a step of the ladder
    /// was taken (every surface the approval is asked on).
    pub fn escalation(&self) -> Option<String> {
        let surfaces: Vec<String> = self.cards().into_iter().map(|c| c.bridge).collect();
        (self.escalated > 0).then(|| {
            format!(
                "escalated {} step{}: asked on {}",
                self.escalated,
                if self.escalated == 1 { "" } else { "s" },
                surfaces.join(", ")
            )
        })
    }

    /// Binds `card`'s notification digest (the one entry its notify side shows).
    pub fn bind_card(&mut self, card: &Card, digest: String) {
        if card.primary {
            self.notify_sha256 = digest;
        } else if let Some(c) = self.also.iter_mut().find(|c| c.bridge == card.bridge) {
            c.sha256 = digest;
        }
    }

    /// The card surface `bridge` shows, if it shows one.
    pub fn card(&self, bridge: &str) -> Option<Card> {
        self.cards().into_iter().find(|c| c.bridge == bridge)
    }

    /// The state now (lazy expiry).
    pub fn state(&self, now: f64) -> State {
        State::of(self.status.as_str(), self.expires_at, now)
    }

    /// Whether the approval asks to run a declared action: as written at park
    /// time, or as its bridge's type is in the registry. The record can only
    /// add gating, never take it away: a writer of the record (the notify
    /// side's outbox may write some fields) must not turn an action's card
    /// into an editable message. A bridge no longer configured reads as
    /// gated, the careful way.
    pub fn is_gated(&self, config: &crate::config::Config) -> bool {
        let by_type = config
            .bridges
            .get(&self.source)
            .is_none_or(|b| registry::is_gated(&b.kind));
        by_type || self.gated == Some(true)
    }

    /// Whether the record was approved before its deadline (`decided_at` is
    /// written by the same step as the status, so it cannot be later than a
    /// deadline the decision checked).
    pub fn approved_in_time(&self) -> bool {
        let decided = self.decided_at.unwrap_or(u64::MAX);
        self.status == Status::Approved && (self.expires_at == 0 || decided < self.expires_at)
    }

    /// The requesting bridge (the protocol's `source` field of the record).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Drops who edited, and the agent's version's digest, from a record
    /// whose `revision` (which the bridge seals) says it was never edited: a
    /// writer of an unedited record must not get a card or a view to claim an
    /// edit, an endorsement the approvers did not see.
    pub fn forget_edit_unless_edited(&mut self) {
        if self.revision == 0 {
            self.edited_by = None;
            self.original_sha256 = None;
        }
    }

    /// The agent whose entry this is, if it came from a per-agent stream.
    pub fn agent(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    pub fn is_settled(&self) -> bool {
        self.settled_at.is_some()
    }

    pub fn approver(&self) -> &str {
        self.approver.as_deref().unwrap_or("")
    }

    pub fn reason(&self) -> &str {
        self.reason.as_deref().unwrap_or("")
    }

    /// The quorum, at least 1.
    pub fn quorum(&self) -> u32 {
        self.quorum.max(1)
    }

    /// "1 of 2 approvals" while a quorum above one is being gathered.
    pub fn progress(&self) -> Option<String> {
        (self.quorum() > 1).then(|| {
            let have = self.approvals.len();
            let who = match have {
                0 => String::new(),
                _ => format!(" ({})", self.approvals.join(", ")),
            };
            format!("{have} of {} approvals{who}", self.quorum())
        })
    }

    pub fn request_id(&self) -> &str {
        self.request_id.as_deref().unwrap_or("")
    }

    /// "snoozed by X until T" once a "later" moved the deadline (`T` as the
    /// caller writes times; the deadline itself, which the seal covers).
    pub fn snoozed(&self, when: impl Fn(u64) -> String) -> Option<String> {
        self.snoozed_until?;
        let until = self.expires_at;
        Some(format!(
            "snoozed by {} until {} (snooze {})",
            self.snoozed_by.as_deref().unwrap_or("an approver"),
            when(until),
            self.snoozes
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_read_before_status() {
        assert_eq!(State::of("approved", 100, 100.0), State::Expired);
        assert_eq!(State::of("approved", 100, 99.9), State::Approved);
        assert_eq!(State::of("pending", 0, 1e12), State::Pending);
        assert_eq!(State::of("garbage", 0, 0.0), State::Rejected);
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = Record {
            id: "x".into(),
            status: Status::Approved,
            source: "desk".into(),
            agent: Some("ann".into()),
            channel_id: "ops".into(),
            content_bytes: 9,
            created_at: 5,
            expires_at: 7,
            notified: Some("1-0".into()),
            decided_at: Some(6),
            outcome_sent: true,
            quorum: 2,
            approvals: vec!["console:a".into(), "console:b".into()],
            ..Record::default()
        };
        let map: HashMap<String, String> = r
            .to_pairs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert!(
            !map.contains_key(field::SUBJECT),
            "absent fields are not written"
        );
        assert_eq!(Record::from_map("x", map), r);
        assert!(r.approved_in_time());
    }

    /// Each more surface's card is kept under its own prefixed fields, and
    /// reads back as written, after the primary one.
    #[test]
    fn cards_of_several_surfaces_read_back_apart() {
        let r = Record {
            id: "x".into(),
            notify: "desk".into(),
            notify_channel: "ops".into(),
            notify_external_id: Some("7".into()),
            quorum: 1,
            also: vec![Card {
                bridge: "mail".into(),
                channel: "ann@example.org".into(),
                sha256: "ab".into(),
                notified: Some("2-0".into()),
                superseded: vec!["<a@x>".into(), "<b@x>".into()],
                ..Card::default()
            }],
            ..Record::default()
        };
        let map: HashMap<String, String> = r.to_pairs().into_iter().collect();
        assert_eq!(map.get("also").map(String::as_str), Some("mail"));
        assert_eq!(map.get("mail.notified").map(String::as_str), Some("2-0"));
        assert!(!map.contains_key("mail.notify_external_id"));
        let back = Record::from_map("x", map);
        assert_eq!(back, r);
        let cards = back.cards();
        assert_eq!(cards.len(), 2);
        assert!(cards[0].primary && cards[0].field(field::NOTIFIED) == "notified");
        assert_eq!(cards[1].field(field::NOTIFIED), "mail.notified");
        assert_eq!(back.card("mail").unwrap().superseded.len(), 2);
        assert_eq!(back.card("desk").unwrap().external_id.as_deref(), Some("7"));
    }

    #[test]
    fn empty_values_of_older_records_read_as_absent() {
        let map = HashMap::from([
            (field::AGENT.to_string(), String::new()),
            (field::STATUS.to_string(), "pending".to_string()),
        ]);
        let r = Record::from_map("x", map);
        assert_eq!(r.agent(), None);
        assert_eq!(r.status, Status::Pending);
    }
}
