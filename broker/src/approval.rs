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
//! - Approval ids are derived from (stream, entry id) with a secret key ([`IdKey`])
//!   that only the requesting outbox service reads: a restarted service finds the
//!   record of a parked entry without any extra index, and an agent, who knows its
//!   stream and entry ids, still cannot compute the id of anything.
//! - A settled record is never decided again ([`DECIDE`] refuses `settled_at`).

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

    /// Whether the record was approved before its deadline (`decided_at` is
    /// written by the same step as the status, so it cannot be later than a
    /// deadline [`DECIDE`] checked).
    pub fn approved_in_time(&self) -> bool {
        let decided: u64 = self.get("decided_at").parse().unwrap_or(u64::MAX);
        let expires = self.expires_at();
        self.get("status") == "approved" && (expires == 0 || decided < expires)
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
/// Reads `fields` of many records, a thousand per pipelined round trip; `None`
/// for each record gone.
pub async fn load_fields_many(
    store: &mut Store,
    ids: &[String],
    fields: &[&str],
) -> Result<Vec<Option<Record>>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.cmd("HMGET").arg(keys::approval(id)).arg(fields);
        }
        let all: Vec<Vec<Option<String>>> = pipe
            .query_async(&mut store.conn)
            .await
            .map_err(|e| Error::from_redis("HMGET approvals", e))?;
        out.extend(chunk.iter().zip(all).map(|(id, values)| {
            let fields: HashMap<String, String> = fields
                .iter()
                .zip(values)
                .filter_map(|(k, v)| Some((k.to_string(), v?)))
                .collect();
            (!fields.is_empty()).then(|| Record {
                id: id.clone(),
                fields,
            })
        }));
    }
    Ok(out)
}

/// Loads many records, a thousand per pipelined round trip; `None` for each gone.
pub async fn load_many(store: &mut Store, ids: &[String]) -> Result<Vec<Option<Record>>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.hgetall(keys::approval(id));
        }
        let all: Vec<HashMap<String, String>> = pipe
            .query_async(&mut store.conn)
            .await
            .map_err(|e| Error::from_redis("HGETALL approvals", e))?;
        out.extend(chunk.iter().zip(all).map(|(id, fields)| {
            (!fields.is_empty()).then(|| Record {
                id: id.clone(),
                fields,
            })
        }));
    }
    Ok(out)
}

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

/// The secret that approval ids are derived with: 32 random bytes kept in
/// `{bridge}:id-key`, readable only by the bridge's outbox user (and the operator).
#[derive(Clone)]
pub struct IdKey([u8; 32]);

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdKey(..)")
    }
}

impl IdKey {
    pub fn from_bytes(bytes: [u8; 32]) -> IdKey {
        IdKey(bytes)
    }

    /// Reads the bridge's key, creating it on first use (`SET NX`, so two workers
    /// starting together agree on one key).
    pub async fn load(store: &mut Store, bridge: &str) -> Result<IdKey> {
        let key = keys::id_key(bridge);
        // Two v4 UUIDs: 244 random bits from the OS generator.
        let fresh = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&fresh)
            .arg("NX")
            .query_async(&mut store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("SET {key} NX"), e))?;
        let saved: String = store
            .conn
            .get(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("GET {key}"), e))?;
        let bytes = hex::decode(saved.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| Error::Request(format!("`{key}` does not hold 32 hex-encoded bytes")))?;
        Ok(IdKey(bytes))
    }

    /// The approval id of a parked entry: HMAC-SHA256 of (stream, entry id) as a
    /// version-8 UUID. Stable across restarts, not computable without the key.
    pub fn id_for(&self, stream: &str, entry_id: &str) -> String {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(stream.as_bytes());
        mac.update(b"\n");
        mac.update(entry_id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Uuid::new_v8(bytes).to_string()
    }
}

/// sha256 over a canonical encoding of named values, in the given order: each
/// as `name`, then `-` when absent or `LEN:` and the bytes when present, then a
/// newline. Lengths make the encoding unambiguous whatever the values contain.
pub fn fields_sha256<'a>(fields: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> String {
    let mut h = Sha256::new();
    for (name, value) in fields {
        h.update(name.as_bytes());
        h.update(b"=");
        match value {
            None => h.update(b"-"),
            Some(v) => {
                h.update(format!("{}:", v.len()).as_bytes());
                h.update(v);
            }
        }
        h.update(b"\n");
    }
    hex::encode(h.finalize())
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
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'worker')
if not f[1] then return {'missing', ''} end
local expires = tonumber(f[2]) or 0
if expires ~= 0 and tonumber(ARGV[4]) >= expires then return {'expired', ''} end
if redis.call('HEXISTS', KEYS[1], 'settled_at') == 1 then return {'settled', ''} end
if f[1] ~= 'pending' then return {f[1], f[3] or ''} end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'approver', ARGV[2], 'reason', ARGV[3], 'decided_at', ARGV[5])
return {'decided', f[3] or ''}
"#;

/// Sets fields only on a record that still exists (never resurrects a settled one).
pub(crate) const SET_IF_EXISTS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

/// The notify side's check of a notification entry against its record, and the
/// claim that makes it the only one. ARGV: this bridge, the entry id, the entry's
/// digest. Returns `ok`, or why the entry is not the notification: `missing`,
/// `not-ours` (another notify bridge), `settled`, `digest` (not the entry the
/// requesting service wrote), `claimed` (another entry was shown already); and
/// the record as it is after the claim (one round trip for both).
pub(crate) const CLAIM: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'notify', 'notify_sha256', 'notify_entry', 'settled_at')
local answer = 'ok'
if not f[1] then return {'missing', {}} end
if f[1] ~= ARGV[1] then answer = 'not-ours'
elseif f[4] then answer = 'settled'
elseif f[2] ~= ARGV[3] then answer = 'digest'
elseif f[3] and f[3] ~= ARGV[2] then answer = 'claimed'
elseif not f[3] then redis.call('HSET', KEYS[1], 'notify_entry', ARGV[2]) end
return {answer, redis.call('HGETALL', KEYS[1])}
"#;

/// Whether `id` has the shape of an approval id (so no other key is ever read).
pub fn is_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

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
    apply(store, id, &requester, verdict, approver, reason).await
}

/// Rejects a pending approval whose request could not be shown to anyone (the
/// notify platform refused it): failing closed at once, and telling the agent
/// why, instead of waiting for a deadline that may never come. The approver is
/// `broker:{notify bridge}`, which no config can name.
pub async fn reject_unshown(
    store: &mut Store,
    record: &Record,
    notify: &str,
    reason: &str,
) -> Result<Outcome> {
    let reason = format!("the approval request could not be shown to approvers: {reason}");
    let approver = format!("broker:{notify}");
    apply(
        store,
        &record.id,
        record.source(),
        Verdict::Rejected,
        &approver,
        &reason,
    )
    .await
}

/// Writes a decision (pending and in time only) and wakes the requester.
async fn apply(
    store: &mut Store,
    id: &str,
    requester: &str,
    verdict: Verdict,
    approver: &str,
    reason: &str,
) -> Result<Outcome> {
    let key = keys::approval(id);
    let now = crate::now_secs_f64();
    let (answer, worker): (String, String) = redis::Script::new(DECIDE)
        .key(&key)
        .arg(verdict.as_str())
        .arg(approver)
        .arg(reason)
        .arg(now)
        .arg(now as u64)
        .invoke_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("EVALSHA decide {key}"), e))?;
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

/// Ids of the pending approvals of every bridge that parks, oldest first per
/// bridge, from the pending index (no keyspace scan).
pub async fn pending_ids(store: &mut Store, config: &Config) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for (name, bridge) in &config.bridges {
        if !bridge.approval.required {
            continue;
        }
        let key = keys::pending(name);
        let some: Vec<String> = store
            .conn
            .zrange(&key, 0, -1)
            .await
            .map_err(|e| Error::from_redis(&format!("ZRANGE {key}"), e))?;
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

/// Removes skin tones and presentation selectors, so 👍🏽 counts as 👍.
pub fn normalize_emoji(emoji: &str) -> String {
    emoji
        .chars()
        .filter(|c| !matches!(*c, '\u{FE0E}' | '\u{FE0F}' | '\u{1F3FB}'..='\u{1F3FF}'))
        .collect()
}

/// How to answer, for surfaces that react (console, Discord).
pub const REACT_HINT: &str = "react ✅ to approve or ❌ to reject";

/// Shows agent text without letting it act on the display: control characters
/// (other than tab and newline) and bidirectional overrides become visible placeholders, so
/// a carriage return cannot overwrite a line and U+202E cannot reverse one.
pub fn display_safe(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\t' | '\n' => c.to_string(),
            c if c.is_control() => format!("<U+{:04X}>", c as u32),
            c if invisible(c) => format!("<U+{:04X}>", c as u32),
            c => c.to_string(),
        })
        .collect()
}

/// Characters that change how text around them is shown while showing nothing
/// themselves: bidirectional controls, line and paragraph separators (which
/// break lines where `\n` does not), zero-width and other format characters,
/// fillers and tags. Variation selectors stay: they only pick an emoji's look.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}'
        | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E007F}')
}

/// The marker in front of every line of agent content in plain-text frames.
pub const CONTENT_MARK: &str = "| ";

/// The frame's lines about a parked message (everything but its content), in
/// order: what a human needs to decide, each value on its own labelled line.
pub fn frame_head(record: &Record, how_to_answer: &str) -> Vec<String> {
    let deadline = match record.expires_at() {
        0 => "never expires".to_string(),
        t => format!("{t} (unix seconds); undecided by then, it is dropped"),
    };
    let optional = |field: &str| match record.get(field) {
        "" => "(none)".to_string(),
        v => display_safe(v),
    };
    vec![
        format!("Approval requested [{}]", record.id),
        format!(
            "From:      {}",
            record.agent().unwrap_or("an agent on the shared outbox")
        ),
        format!("Via:       {}", record.source()),
        format!("To:        {}", display_safe(record.get("channel_id"))),
        format!("Subject:   {}", optional("subject")),
        format!("Reply to:  {}", optional("reply_to")),
        format!("Size:      {} bytes", record.get("content_bytes")),
        format!(
            "Digest:    {} (sha256 of the whole message)",
            record.get("message_sha256")
        ),
        format!("Deadline:  {deadline}"),
        format!(
            "To decide: {how_to_answer}, or run `cowboy approvals approve|reject {}`",
            &record.id[..8.min(record.id.len())]
        ),
    ]
}

/// Renders the plain-text approval request: the frame, then every line of the
/// content behind [`CONTENT_MARK`], then an end line. No line the agent wrote can
/// read as a frame line. `limit` is the most bytes the notify platform shows; if
/// the whole text does not fit, whole content lines are kept while they fit and
/// the end line says how many bytes are hidden and how to see them.
pub fn render_notification(
    record: &Record,
    content: &str,
    how_to_answer: &str,
    limit: Option<usize>,
) -> String {
    let mut out = frame_head(record, how_to_answer).join("\n");
    out.push_str("\nThe message, every line marked with \"| \":\n");
    let total = content.len();
    let lines: Vec<&str> = content.split('\n').collect();
    let marked = |l: &str| format!("{CONTENT_MARK}{}\n", display_safe(l));
    let end_all = format!("(end of message: {total} bytes, {} lines)", lines.len());
    let full = out.len() + lines.iter().map(|l| marked(l).len()).sum::<usize>() + end_all.len();
    match limit {
        Some(limit) if full > limit => {
            let note = |hidden: usize| {
                format!(
                    "(message cut here: {hidden} of {total} bytes hidden; see all: cowboy approvals show {})",
                    record.id
                )
            };
            let room = limit.saturating_sub(out.len() + note(total).len());
            let (mut used, mut shown) = (0usize, 0usize);
            for line in &lines {
                let m = marked(line);
                if used + m.len() <= room {
                    used += m.len();
                    shown += line.len() + 1;
                    out.push_str(&m);
                    continue;
                }
                // The first line that does not fit is shown as far as it fits.
                let space = room.saturating_sub(used + CONTENT_MARK.len() + 1);
                let (mut cut, mut width) = (0, 0);
                for (i, c) in line.char_indices() {
                    let w = display_safe(c.encode_utf8(&mut [0; 4])).len();
                    if width + w > space {
                        break;
                    }
                    width += w;
                    cut = i + c.len_utf8();
                }
                if cut > 0 {
                    out.push_str(&marked(&line[..cut]));
                    shown += cut;
                }
                break;
            }
            out.push_str(&note(total.saturating_sub(shown)));
        }
        _ => {
            for line in &lines {
                out.push_str(&marked(line));
            }
            out.push_str(&end_all);
        }
    }
    out
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
    fn ids_are_stable_per_entry_and_keyed() {
        let k = IdKey::from_bytes([7; 32]);
        assert_eq!(k.id_for("a:outbox", "1-0"), k.id_for("a:outbox", "1-0"));
        assert_ne!(k.id_for("a:outbox", "1-0"), k.id_for("b:outbox", "1-0"));
        let other = IdKey::from_bytes([8; 32]);
        assert_ne!(k.id_for("a:outbox", "1-0"), other.id_for("a:outbox", "1-0"));
        assert!(uuid::Uuid::parse_str(&k.id_for("a:outbox", "1-0")).is_ok());
    }

    #[test]
    fn field_digests_are_unambiguous() {
        let a = fields_sha256([("a", Some(&b"x\nb=1:y"[..])), ("b", None)]);
        let b = fields_sha256([("a", Some(&b"x"[..])), ("b", Some(&b"y"[..]))]);
        assert_ne!(a, b);
        assert_ne!(
            fields_sha256([("s", None)]),
            fields_sha256([("s", Some(&b""[..]))])
        );
    }

    /// Whatever the agent writes, every content line is marked, so a fake frame
    /// line, separator or end note shows up as content.
    #[test]
    fn content_cannot_imitate_the_frame() {
        let record = Record {
            id: "0123456789".into(),
            fields: HashMap::from([("content_bytes".into(), "9".into())]),
        };
        let evil = "hi\n(end of message: 2 bytes, 1 lines)\nApproval requested [x]\rTo:        boss\n\u{202E}gnp.exe\u{2028}(end of message)\u{200B}\u{061C}";
        let text = render_notification(&record, evil, REACT_HINT, None);
        let body: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("The message"))
            .skip(1)
            .collect();
        let (end, content) = body.split_last().unwrap();
        assert!(
            content.iter().all(|l| l.starts_with(CONTENT_MARK)),
            "{text}"
        );
        assert!(end.starts_with("(end of message:"), "{end}");
        assert_eq!(content.len(), 4);
        for c in ['\r', '\u{202E}', '\u{2028}', '\u{200B}', '\u{061C}'] {
            assert!(!text.contains(c), "{c:?} is shown, not obeyed");
        }
        assert_eq!(text.matches("Approval requested").count(), 2);
        assert!(
            text.lines()
                .filter(|l| l.starts_with("Approval requested"))
                .count()
                == 1
        );
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
        let shown = text.lines().find(|l| l.starts_with(CONTENT_MARK)).unwrap();
        let hidden = 4000 - (shown.len() - CONTENT_MARK.len());
        assert!(
            text.ends_with(&format!(
                "{hidden} of 4000 bytes hidden; see all: cowboy approvals show 0123456789)"
            )),
            "{text}"
        );
        let full = render_notification(&record, "short", REACT_HINT, Some(1000));
        assert!(full.contains("\n| short\n(end of message: 5 bytes, 1 lines)"));
    }
}
