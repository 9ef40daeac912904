//! Approval records (`approval:{uuid}`), the lazy-expiry state machine, and
//! `resolve_approval`.
//!
//! Invariants:
//! - `expired` is never written. [`State::of`] reads `expires_at` *before*
//!   `status`: past the deadline a record is expired whatever `status` says.
//! - A decision changes a record only while it is `pending` and inside its window;
//!   the check and the write are one server-side step on one key ([`DECIDE`]),
//!   so two racing answers cannot both win and a late one changes nothing.
//! - `resolve_approval` drops the map entry whether the answer counted or was late,
//!   but not when the answerer is not an approver: a stranger's reaction must not
//!   disarm the card for the real approvers.
//! - A decision is followed by an entry on the requesting bridge's
//!   `{bridge}:decisions` stream, which wakes its outbox service at once.
//! - Approval ids are derived from (stream, entry id), so a restarted service finds
//!   the record of a parked entry without any extra index.

use std::collections::HashMap;

use redis::AsyncCommands;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// About how many wake-ups a `{bridge}:decisions` stream keeps.
const DECISIONS_KEPT: u64 = 10_000;

/// Characters of content kept in `content_preview` (the protocol's 200).
pub const PREVIEW_CHARS: usize = 200;

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
        match status {
            "pending" => State::Pending,
            "approved" => State::Approved,
            _ => State::Rejected,
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

/// An `approval:{uuid}` hash as read from Redis.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub id: String,
    pub fields: HashMap<String, String>,
}

impl Record {
    pub fn get(&self, field: &str) -> &str {
        self.fields.get(field).map(String::as_str).unwrap_or("")
    }

    pub fn expires_at(&self) -> u64 {
        self.get("expires_at").parse().unwrap_or(0)
    }

    /// The state now (lazy expiry).
    pub fn state(&self, now: f64) -> State {
        State::of(self.get("status"), self.expires_at(), now)
    }

    /// The requesting bridge (the protocol's `source` field of the record).
    pub fn source(&self) -> &str {
        self.get("source")
    }

    /// The agent whose entry this is, if it came from a per-agent stream.
    pub fn agent(&self) -> Option<&str> {
        Some(self.get("agent")).filter(|a| !a.is_empty())
    }
}

/// Reads a record; `None` when it does not exist.
pub async fn load(store: &mut Store, id: &str) -> Result<Option<Record>> {
    let key = keys::approval(id);
    let fields: HashMap<String, String> = store
        .conn
        .hgetall(&key)
        .await
        .map_err(|e| Error::from_redis(&format!("HGETALL {key}"), e))?;
    Ok((!fields.is_empty()).then(|| Record {
        id: id.to_string(),
        fields,
    }))
}

/// The approval id of a parked entry: stable across restarts.
pub fn id_for(stream: &str, entry_id: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::uuid!("1b5a7c0e-6c8f-4c59-9d0e-6f1f3c0b8a21");
    uuid::Uuid::new_v5(&NAMESPACE, format!("{stream}\n{entry_id}").as_bytes()).to_string()
}

/// sha256 of the exact bytes that will be sent, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The first [`PREVIEW_CHARS`] characters.
pub fn preview(content: &str) -> String {
    content.chars().take(PREVIEW_CHARS).collect()
}

/// Creates the record unless it exists. Returns whether it was created.
pub(crate) const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

/// Decides a pending record inside its window. ARGV: status, approver, reason, now.
/// Returns `decided`, or the reason nothing changed.
const DECIDE: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at')
if not f[1] then return 'missing' end
local expires = tonumber(f[2]) or 0
if expires ~= 0 and tonumber(ARGV[4]) >= expires then return 'expired' end
if f[1] ~= 'pending' then return f[1] end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'approver', ARGV[2], 'reason', ARGV[3], 'decided_at', ARGV[5])
return 'decided'
"#;

/// Sets fields only on a record that still exists (never resurrects a settled one).
pub(crate) const SET_IF_EXISTS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

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

/// The protocol's `resolve_approval`: an answer arrived on the notify bridge `source`
/// to the notification it delivered as `external_id`.
///
/// `approver` is a qualified identity (`discord:1234`); it is checked against the
/// requesting bridge's `approval.approvers`.
pub async fn resolve_approval(
    store: &mut Store,
    config: &Config,
    source: &str,
    external_id: &str,
    verdict: Verdict,
    approver: &str,
    reason: &str,
) -> Result<Outcome> {
    let map = keys::approval_map(source);
    let id: Option<String> = store
        .conn
        .hget(&map, external_id)
        .await
        .map_err(|e| Error::from_redis(&format!("HGET {map}"), e))?;
    let Some(id) = id else {
        return Ok(Outcome::Unknown);
    };
    let outcome = decide(store, config, &id, verdict, approver, reason).await?;
    if outcome != Outcome::NotAllowed {
        let _: i64 = store
            .conn
            .hdel(&map, external_id)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {map}"), e))?;
    }
    Ok(outcome)
}

/// Decides approval `id` directly (the operator CLI), under the same rules.
pub async fn decide(
    store: &mut Store,
    config: &Config,
    id: &str,
    verdict: Verdict,
    approver: &str,
    reason: &str,
) -> Result<Outcome> {
    let Some(record) = load(store, id).await? else {
        return Ok(Outcome::Late("missing".into()));
    };
    let requester = record.source().to_string();
    let allowed = config
        .bridges
        .get(&requester)
        .is_some_and(|b| b.approval.allows(approver));
    if !allowed {
        tracing::warn!(
            approval = id,
            approver,
            "answer from someone not on approval.approvers ignored"
        );
        return Ok(Outcome::NotAllowed);
    }
    let key = keys::approval(id);
    let now = crate::now_secs_f64();
    let answer: String = redis::Script::new(DECIDE)
        .key(&key)
        .arg(verdict.as_str())
        .arg(approver)
        .arg(reason)
        .arg(now)
        .arg(now as u64)
        .invoke_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("EVALSHA decide {key}"), e))?;
    if answer != "decided" {
        tracing::info!(approval = id, state = %answer, "late answer ignored");
        return Ok(Outcome::Late(answer));
    }
    tracing::info!(
        approval = id,
        approver,
        verdict = verdict.as_str(),
        "approval decided"
    );
    // Wake the requesting outbox service; if this is lost it still sees the decision
    // at its next sweep.
    // Capped: a wake-up trimmed before it was read is covered by that sweep too.
    let stream = keys::decisions(&requester);
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("MAXLEN")
        .arg("~")
        .arg(DECISIONS_KEPT)
        .arg("*")
        .arg("approval_id")
        .arg(id)
        .arg("status")
        .arg(verdict.as_str())
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("XADD {stream}"), e))?;
    Ok(Outcome::Decided)
}

/// Ids of every approval record, by `SCAN` (operator use only).
pub async fn list_ids(store: &mut Store) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut iter: redis::AsyncIter<String> = store
        .conn
        .scan_match(format!("{}*", keys::APPROVAL_PREFIX))
        .await
        .map_err(|e| Error::from_redis("SCAN", e))?;
    while let Some(key) = iter.next_item().await {
        let key = key?;
        if let Some(id) = keys::approval_id_of(&key) {
            ids.push(id.to_string());
        }
    }
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// Finds the one approval whose id starts with `prefix`.
pub async fn find_by_prefix(store: &mut Store, prefix: &str) -> Result<String> {
    let matching: Vec<String> = list_ids(store)
        .await?
        .into_iter()
        .filter(|id| id.starts_with(prefix))
        .collect();
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

/// Record fields copied onto notification and outcome entries, as
/// (entry field, record field): what a notify bridge needs to show an approval
/// without reading the record (which its user may not be allowed to).
pub const SUMMARY_FIELDS: &[(&str, &str)] = &[
    ("approval_source", "source"),
    ("approval_agent", "agent"),
    ("approval_channel", "channel_id"),
    ("approval_sha256", "content_sha256"),
    ("approval_expires_at", "expires_at"),
    ("approval_bytes", "content_bytes"),
];

/// The [`SUMMARY_FIELDS`] of a record, as entry fields.
pub fn summary(record: &Record) -> Vec<(&'static str, &[u8])> {
    SUMMARY_FIELDS
        .iter()
        .map(|(entry, field)| (*entry, record.get(field).as_bytes()))
        .collect()
}

/// Removes skin tones and presentation selectors, so 👍🏽 counts as 👍.
pub fn normalize_emoji(emoji: &str) -> String {
    emoji
        .chars()
        .filter(|c| !matches!(*c, '\u{FE0E}' | '\u{FE0F}' | '\u{1F3FB}'..='\u{1F3FF}'))
        .collect()
}

/// How to answer, for surfaces that react (console, Discord).
pub const REACT_HINT: &str = "react ✅ to approve or ❌ to reject";

/// Renders the human-readable approval request. `limit` is the most bytes the
/// notify platform shows; if the full text does not fit, the content is cut at a
/// character boundary and the text says how many bytes are hidden and how to see them.
pub fn render_notification(
    record: &Record,
    content: &str,
    how_to_answer: &str,
    limit: Option<usize>,
) -> String {
    let deadline = match record.expires_at() {
        0 => "never expires".to_string(),
        t => format!("expires at {t} (unix seconds)"),
    };
    let who = record.agent().unwrap_or("an agent on the shared outbox");
    let head = format!(
        "Approval requested [{id}]\n{who} wants to send via `{bridge}` to `{dest}`\nsha256 {sha} ({bytes} bytes), {deadline}\nTo decide: {how_to_answer}, or run `cowboy approvals approve|reject {short}`\n---\n",
        id = record.id,
        bridge = record.source(),
        dest = record.get("channel_id"),
        sha = record.get("content_sha256"),
        bytes = content.len(),
        short = &record.id[..8.min(record.id.len())],
    );
    let full = format!("{head}{content}");
    match limit {
        Some(limit) if full.len() > limit => {
            let tail_note = |hidden: usize| {
                format!(
                    "\n--- {hidden} of {} bytes hidden; see all: cowboy approvals show {}",
                    content.len(),
                    record.id
                )
            };
            // Reserve room for the note at its widest, then cut on a char boundary.
            let room = limit.saturating_sub(head.len() + tail_note(content.len()).len());
            let mut cut = room.min(content.len());
            while !content.is_char_boundary(cut) {
                cut -= 1;
            }
            format!(
                "{head}{}{}",
                &content[..cut],
                tail_note(content.len() - cut)
            )
        }
        _ => full,
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
    fn ids_are_stable_per_entry() {
        assert_eq!(id_for("a:outbox", "1-0"), id_for("a:outbox", "1-0"));
        assert_ne!(id_for("a:outbox", "1-0"), id_for("b:outbox", "1-0"));
    }

    #[test]
    fn truncated_notification_says_what_is_hidden() {
        let record = Record {
            id: "0123456789".into(),
            fields: HashMap::from([("content_sha256".into(), "ab".into())]),
        };
        let content = "é".repeat(2000);
        let text = render_notification(&record, &content, REACT_HINT, Some(1000));
        assert!(text.len() <= 1000, "{}", text.len());
        assert!(text.contains("bytes hidden; see all: cowboy approvals show 0123456789"));
        let full = render_notification(&record, "short", REACT_HINT, Some(1000));
        assert!(full.ends_with("short"));
    }
}
