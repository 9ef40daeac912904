//! The approval repository: every command on `approval:*` keys (records and
//! the notify bridges' maps) and on the pending index, with the Lua beside it.
//! No other module issues them.
//!
//! Invariants:
//! - Creation is create-if-absent ([`CREATE`]): repeating a park after a crash
//!   never overwrites a record a decision may have changed.
//! - Progress is written with set-if-exists ([`SET_IF_EXISTS`]): a step that
//!   comes after the record was settled and deleted never resurrects it.
//! - A decision is one server-side step on one key ([`DECIDE`]): pending, inside
//!   its window, and not settled, or nothing changes; it returns the worker the
//!   record names, read in the same step, so the right worker is woken.
//! - Each notify side claims a record for exactly one notification entry of
//!   its card, the one with the digest the requesting service bound ([`CLAIM`]).
//! - No step spans two records, so the protocol works unchanged on Redis Cluster
//!   (the pending index and the maps are written beside, never inside, a script).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use redis::AsyncCommands;

use super::record::{field, Card, Record, Status};
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;
use crate::topology::Conn;

/// Creates the record unless it exists. Returns whether it was created.
const CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

/// Decides a pending record inside its window. ARGV: verdict, approver, reason,
/// now (fractional seconds), now (whole seconds), the list separator, the card
/// answered (its external id, or empty), the digest the approver saw (or
/// empty), what a quorum counts the approver as (its person, see
/// [`crate::config::Config::counting_key`]), `1` when editors count toward
/// a quorum, and the shared proof the answer came through (`page` for the
/// approval page, whose one Redis password proves every `web:` user; empty for
/// a proof of its own), the requesting bridge's seal, stored with an
/// approval (see [`super::IdKey::seal_decision`]); then, for an approval,
/// what the caller verified against the seals (the approvals, people and
/// proofs counted so far, the quorum, the editors, the deadline: `stale` when
/// the record no longer holds exactly these, so nothing written between the
/// check and this step changes what is counted or toward what), and the seal
/// of the count with this approval added. Returns `superseded` for an answer to an earlier version (a card
/// the record lists as superseded, or a digest it no longer has), `decided`,
/// `counted` (an approval short of the record's quorum, kept in `approvals`,
/// its person in `approval_people`), `counted-again` (this person's approval
/// is counted already, whichever identity gave it), `editor` (under a quorum,
/// a person who edited the message approves it: not counted), `same-proof`
/// (under a quorum, a second approval through the same shared proof: one
/// password cannot stand for two people), or why nothing
/// changed (`missing`, `expired`, `settled`, `already:` and the status as stored); the record's
/// worker; and the approvals so far. One rejection rejects whatever was counted.
const DECIDE: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'worker', 'settled_at', 'quorum', 'approvals', 'superseded', 'message_sha256', 'approval_people', 'editors', 'approval_proofs')
if not f[1] then return {'missing', '', ''} end
local worker = f[3] or ''
local have = f[6] or ''
local expires = tonumber(f[2]) or 0
if expires ~= 0 and tonumber(ARGV[4]) >= expires then return {'expired', '', have} end
-- HMGET, not HEXISTS: the notify outbox's Redis user has no HEXISTS.
if f[4] then return {'settled', '', have} end
local sep = '[^' .. ARGV[6] .. ']+'
if ARGV[7] ~= '' then
  -- The earlier cards of the surface answered on (its proof names it), or
  -- of every surface when the proof does not say.
  local lists = {f[7] or ''}
  local surface = string.match(ARGV[11], '^ingest:(.+)$')
  if surface and redis.call('HGET', KEYS[1], 'notify') ~= surface then
    lists = {redis.call('HGET', KEYS[1], surface .. '.superseded') or ''}
  elseif not surface then
    for b in string.gmatch(redis.call('HGET', KEYS[1], 'also') or '', sep) do
      lists[#lists + 1] = redis.call('HGET', KEYS[1], b .. '.superseded') or ''
    end
  end
  for _, list in ipairs(lists) do
    for card in string.gmatch(list, sep) do
      if card == ARGV[7] then return {'superseded', '', have} end
    end
  end
end
if ARGV[8] ~= '' and ARGV[8] ~= f[8] then return {'superseded', '', have} end
if f[1] ~= 'pending' then return {'already:' .. f[1], worker, have} end
if ARGV[1] == 'approved' and ARGV[17] ~= '' then
  -- Decided only on the state the caller verified against its seals.
  if have ~= ARGV[13] or (f[9] or '') ~= ARGV[14] or (f[11] or '') ~= ARGV[15]
    or (f[5] or '1') ~= ARGV[17] or (f[10] or '') ~= ARGV[18] or (f[2] or '0') ~= ARGV[19] then
    return {'stale', worker, have}
  end
end
local quorum = tonumber(f[5]) or 1
if ARGV[1] == 'approved' and quorum > 1 then
  if ARGV[10] ~= '1' and f[10] then
    for editor in string.gmatch(f[10], sep) do
      if editor == ARGV[9] then return {'editor', worker, have} end
    end
  end
  local people = f[9] or ''
  local n = 0
  for who in string.gmatch(people, sep) do
    n = n + 1
    if who == ARGV[9] then return {'counted-again', worker, have} end
  end
  local proofs = f[11] or ''
  if ARGV[11] ~= '' then
    for p in string.gmatch(proofs, sep) do
      if p == ARGV[11] then return {'same-proof', worker, have} end
    end
    if proofs ~= '' then proofs = proofs .. ARGV[6] end
    proofs = proofs .. ARGV[11]
  end
  if people ~= '' then people = people .. ARGV[6] end
  people = people .. ARGV[9]
  if have ~= '' then have = have .. ARGV[6] end
  have = have .. ARGV[2]
  if n + 1 < quorum then
    redis.call('HSET', KEYS[1], 'approvals', have, 'approval_people', people, 'approval_proofs', proofs, 'count_seal', ARGV[16])
    return {'counted', worker, have}
  end
  local all = string.gsub(have, ARGV[6], ', ')
  redis.call('HSET', KEYS[1], 'status', ARGV[1], 'approvals', have, 'approval_people', people, 'approval_proofs', proofs, 'count_seal', ARGV[16], 'approver', all, 'reason', ARGV[3], 'decided_at', ARGV[5], 'decision_seal', ARGV[12])
  return {'decided', worker, have}
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'approver', ARGV[2], 'reason', ARGV[3], 'decided_at', ARGV[5])
if ARGV[1] == 'approved' then redis.call('HSET', KEYS[1], 'decision_seal', ARGV[12]) end
return {'decided', worker, have}
"#;

/// Replaces the message of a record an approver edited, revoking any decision.
/// ARGV: the digest the editor saw, now (fractional seconds), the list
/// separator, what a quorum counts the editor as (kept in `editors`: under a
/// quorum an editor's own approval does not count), the deadline the editor's
/// side read (a snooze since would leave the new seal over the old deadline:
/// `changed`), the escalation steps and the version seal it read (likewise:
/// a step taken since, or a seal changed, is `changed`), then the field pairs
/// of the new version. Only while the record is
/// pending or approved, inside its window, not settled, its send not started,
/// and still at that digest; otherwise returns why not (`missing`, `settled`,
/// `expired`, `sending`, `changed`, the status). Keeps the agent's version on
/// the first edit, and moves each surface's shown card to its `superseded`;
/// returns `ok` and those cards, as (bridge, external id) pairs in a flat list.
const EDIT: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'settled_at', 'delivery_started', 'message_sha256', 'original_sha256', 'channel_id', 'subject', 'content_preview', 'notify', 'also', 'escalated', 'version_seal')
if not f[1] then return {'missing', {}} end
if f[3] then return {'settled', {}} end
local expires = tonumber(f[2]) or 0
if expires ~= 0 and tonumber(ARGV[2]) >= expires then return {'expired', {}} end
if f[4] then return {'sending', {}} end
if f[1] ~= 'pending' and f[1] ~= 'approved' then return {'already:' .. f[1], {}} end
if f[5] ~= ARGV[1] or (f[2] or '0') ~= ARGV[5] or (f[12] or '0') ~= ARGV[6] or (f[13] or '') ~= ARGV[7] then return {'changed', {}} end
if not f[6] then
  redis.call('HSET', KEYS[1], 'original_sha256', f[5], 'original_channel_id', f[7] or '', 'original_subject', f[8] or '', 'original_preview', f[9] or '')
end
local cards = {}
local surfaces = {{f[10] or '', ''}}
for b in string.gmatch(f[11] or '', '[^' .. ARGV[3] .. ']+') do surfaces[#surfaces + 1] = {b, b .. '.'} end
for _, s in ipairs(surfaces) do
  local P = s[2]
  local c = redis.call('HMGET', KEYS[1], P .. 'notify_external_id', P .. 'superseded')
  if c[1] and c[1] ~= '' then
    local list = c[2] or ''
    if list ~= '' then list = list .. ARGV[3] end
    redis.call('HSET', KEYS[1], P .. 'superseded', list .. c[1])
    cards[#cards + 1] = s[1]
    cards[#cards + 1] = c[1]
  end
  redis.call('HDEL', KEYS[1], P .. 'notify_external_id', P .. 'notify_entry', P .. 'notified', P .. 'unshown')
end
redis.call('HDEL', KEYS[1], 'approver', 'reason', 'decided_at', 'approvals', 'approval_people', 'approval_proofs', 'subject', 'decision_seal', 'count_seal')
local editors = redis.call('HGET', KEYS[1], 'editors') or ''
if editors ~= '' then editors = editors .. ARGV[3] end
redis.call('HSET', KEYS[1], 'editors', editors .. ARGV[4])
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok', cards}
"#;

/// Marks the approved send started, only while the record is approved at the
/// digest the requester checked the message against (an edit that landed since
/// wins, and nothing is sent), not settled, and still names this worker (a
/// taker re-points it first, so a worker that stalled finds it taken). ARGV:
/// now, the digest, the worker. Returns whether it marked.
const START_DELIVERY: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'message_sha256', 'settled_at', 'worker')
if f[1] ~= 'approved' or f[2] ~= ARGV[2] or f[3] then return 0 end
if f[4] and f[4] ~= '' and f[4] ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'delivery_started', ARGV[1])
return 1
"#;

/// Notes the card a notify side showed, only while the record still claims
/// the entry that card was shown from. A card whose version an edit replaced
/// while it was being sent is listed as superseded in the same step, so even
/// before its map entry is removed again an answer to it is late. ARGV: the
/// entry, the card's external id, the list separator, the notify bridge (its
/// card's fields are the plain ones when it is `notify`, else prefixed with
/// its name). Returns whether it was noted as the record's card.
const NOTE_SHOWN: &str = r#"
local P = ''
if redis.call('HGET', KEYS[1], 'notify') ~= ARGV[4] then P = ARGV[4] .. '.' end
local f = redis.call('HMGET', KEYS[1], P .. 'notify_entry', P .. 'superseded', 'status')
if not f[3] then return 0 end
if f[1] ~= ARGV[1] then
  local list = f[2] or ''
  if list ~= '' then list = list .. ARGV[3] end
  redis.call('HSET', KEYS[1], P .. 'superseded', list .. ARGV[2])
  return 0
end
redis.call('HSET', KEYS[1], P .. 'notify_external_id', ARGV[2])
return 1
"#;

/// Sets fields only on a record that still exists. Returns whether it existed.
const SET_IF_EXISTS: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"#;

/// Marks a record settled, once: nothing on a record that is gone (the notify
/// side deleted it) or settled already. ARGV: now, outcome, TTL seconds.
const MARK_SETTLED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- HGET, not HEXISTS: the Redis user of the requesting outbox has only HGET.
if redis.call('HGET', KEYS[1], 'settled_at') then return 0 end
redis.call('HSET', KEYS[1], 'settled_at', ARGV[1], 'outcome', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// The notify side's check of a notification entry against its record, and the
/// claim that makes it the only one on this surface. ARGV: this bridge, the
/// entry id, the entry's digest (its card's fields are the plain ones when it is
/// `notify`, else prefixed with its name). Returns `ok`, or why the entry is not the notification: `missing`,
/// `not-ours` (another notify bridge), `settled`, `digest` (not the entry the
/// requesting service wrote), `claimed` (another entry was shown already). The
/// caller reads the record right after it, in the same round trip: a record
/// returned through Lua cost the script three times its own work.
const CLAIM: &str = r#"
local P = ''
local primary = redis.call('HGET', KEYS[1], 'notify')
if not primary then return 'missing' end
if primary ~= ARGV[1] then P = ARGV[1] .. '.' end
local f = redis.call('HMGET', KEYS[1], P .. 'notify', P .. 'notify_sha256', P .. 'notify_entry', 'settled_at')
local answer = 'ok'
if f[1] ~= ARGV[1] then answer = 'not-ours'
elseif f[4] then answer = 'settled'
elseif f[2] ~= ARGV[3] then answer = 'digest'
elseif f[3] and f[3] ~= ARGV[2] then answer = 'claimed'
elseif not f[3] then redis.call('HSET', KEYS[1], P .. 'notify_entry', ARGV[2]) end
return answer
"#;

/// Forgets the notify side's claim of notification entry ARGV[1] when that
/// entry vanished unshown (a flat-stream writer trimmed it while a worker
/// held it), so the notification can be written and claimed again. Not once
/// the card was shown. ARGV[2]: the card's field prefix (empty for the
/// primary card, else `{bridge}.`). Returns 1 when forgotten.
const FORGET_CLAIM: &str = r#"
local P = ARGV[2]
if redis.call('HGET', KEYS[1], P .. 'notify_external_id') then return 0 end
if redis.call('HGET', KEYS[1], P .. 'notify_entry') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], P .. 'notify_entry', P .. 'notified')
return 1
"#;

/// Moves a pending record's deadline (an approver's "later"), only while it is
/// pending, not settled, inside its window and still exactly as the caller
/// read and checked it (deadline and snooze count; `stale` otherwise).
/// ARGV: now (fractional seconds), the deadline read, the count read, the new
/// deadline, the new count, who, the new version seal, the version seal read
/// (an edit since changed what the new seal covers), and the request's nonce
/// (kept: the same request applied again after a failure further on finds
/// it, `again`, and moves nothing twice). Returns `ok`, `again` or why not
/// (`missing`, `settled`, `expired`, `stale`, `already:` and the status).
const SNOOZE: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'settled_at', 'snoozes', 'version_seal', 'snooze_request')
if not f[1] then return 'missing' end
if f[6] and f[6] == ARGV[9] then return 'again' end
if f[3] then return 'settled' end
local expires = tonumber(f[2]) or 0
if expires ~= 0 and tonumber(ARGV[1]) >= expires then return 'expired' end
if f[1] ~= 'pending' then return 'already:' .. f[1] end
if (f[2] or '0') ~= ARGV[2] or (f[4] or '0') ~= ARGV[3] or (f[5] or '') ~= ARGV[8] then return 'stale' end
redis.call('HSET', KEYS[1], 'expires_at', ARGV[4], 'snoozes', ARGV[5], 'snoozed_by', ARGV[6], 'snoozed_until', ARGV[4], 'version_seal', ARGV[7], 'snooze_request', ARGV[9])
return 'ok'
"#;

/// Takes the next step of the escalation ladder, only while the record is
/// pending, unsettled, inside its window and still exactly as the caller
/// read and checked it (steps taken and version seal; `stale` otherwise),
/// and only for a surface other than `notify`: the step's card is added (its
/// fields prefixed with the bridge, set anew, the bridge appended to `also`
/// unless listed), to be notified by the caller. ARGV: now (fractional seconds), the steps read,
/// the version seal read, the new step count, the new version seal, the
/// surface, its channel, its notification's digest, the list separator.
/// Returns `ok` or why not (`missing`, `settled`, `expired`, `stale`,
/// `asked`, `already:` and the status).
const ESCALATE: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'settled_at', 'expires_at', 'escalated', 'version_seal', 'notify', 'also')
if not f[1] then return 'missing' end
if f[2] then return 'settled' end
local expires = tonumber(f[3]) or 0
if expires ~= 0 and tonumber(ARGV[1]) >= expires then return 'expired' end
if f[1] ~= 'pending' then return 'already:' .. f[1] end
if (f[4] or '0') ~= ARGV[2] or (f[5] or '') ~= ARGV[3] then return 'stale' end
if f[6] == ARGV[6] then return 'asked' end
-- Listed already (written by someone else before the step): its card fields
-- are set anew, the list kept.
local also = f[7] or ''
local listed = false
for b in string.gmatch(also, '[^' .. ARGV[9] .. ']+') do
  if b == ARGV[6] then listed = true end
end
if not listed then
  if also ~= '' then also = also .. ARGV[9] end
  also = also .. ARGV[6]
end
local P = ARGV[6] .. '.'
redis.call('HDEL', KEYS[1], P .. 'notified', P .. 'notify_entry', P .. 'notify_external_id', P .. 'unshown', P .. 'superseded', P .. 'outcome_sent')
redis.call('HSET', KEYS[1], 'escalated', ARGV[4], 'version_seal', ARGV[5], 'also', also, P .. 'notify', ARGV[6], P .. 'notify_channel', ARGV[7], P .. 'notify_sha256', ARGV[8])
return 'ok'
"#;

/// Notes that the approvers were reminded, once: only on a record that
/// exists, is pending and unsettled, and was not reminded yet. ARGV: now.
/// Returns whether it noted (then the reminder is to be written).
const REMIND: &str = r#"
local f = redis.call('HMGET', KEYS[1], 'status', 'settled_at', 'reminded')
if f[1] ~= 'pending' or f[2] or f[3] then return 0 end
redis.call('HSET', KEYS[1], 'reminded', ARGV[1])
return 1
"#;

static REMIND_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REMIND));
static SNOOZE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SNOOZE));
static ESCALATE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ESCALATE));
static FORGET_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FORGET_CLAIM));
static CREATE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CREATE));
static DECIDE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DECIDE));
static SET_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SET_IF_EXISTS));
static CLAIM_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CLAIM));
static SETTLE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(MARK_SETTLED));
static EDIT_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(EDIT));
static SHOWN_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(NOTE_SHOWN));
static START_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(START_DELIVERY));

/// Records handled per pipelined round trip when many are read at once.
const CHUNK: usize = 1000;

/// Chunks in flight when many records are read at once: Redis serves the
/// next while this process decodes the one before.
const AHEAD: usize = 3;

/// A settled record's Redis TTL: a safety net should the notify side never
/// delete it (its bridge removed from the config, say).
pub const SETTLED_TTL_SECS: i64 = 7 * 24 * 3600;

/// What the sweep reads of a parked record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepState {
    /// `None`: the record is gone.
    pub status: Option<Status>,
    pub notified: bool,
    /// Every card it is asked on is shown (`notify_external_id`) or was
    /// refused by its platform (`unshown`).
    pub shown: bool,
}

/// Separates the identities in a record's `approvals` (none contains a newline:
/// the config and the surfaces refuse them).
const APPROVALS_SEPARATOR: &str = "\n";

/// [`DECIDE`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    /// Decided by this answer.
    Decided,
    /// Counted toward the quorum (`again`: counted for this approver already).
    Counted {
        again: bool,
    },
    /// The answerer edited the message, and editors do not count.
    Editor,
    /// The shared proof it came through counted already.
    SameProof,
    /// The state verified before changed meanwhile: read again.
    Stale,
    /// The card or version answered is not the record's current one.
    Superseded,
    Missing,
    Expired,
    Settled,
    /// Decided already, as the record's status says (an unknown status reads
    /// as rejected).
    Already(Status),
}

impl Decided {
    /// Every answer the script gives, as it spells them, and what it means:
    /// the one table the parse and the script test read.
    pub const ANSWERS: &'static [(&'static str, Decided)] = &[
        ("decided", Decided::Decided),
        ("counted", Decided::Counted { again: false }),
        ("counted-again", Decided::Counted { again: true }),
        ("editor", Decided::Editor),
        ("same-proof", Decided::SameProof),
        ("stale", Decided::Stale),
        ("superseded", Decided::Superseded),
        ("missing", Decided::Missing),
        ("expired", Decided::Expired),
        ("settled", Decided::Settled),
    ];

    fn parse(answer: &str) -> Decided {
        match Decided::ANSWERS
            .iter()
            .find(|(spelled, _)| *spelled == answer)
        {
            Some((_, decided)) => *decided,
            // The status as stored, marked so a status forged to read like an
            // answer (`decided`, `stale`) stays a status; anything else fails
            // closed.
            None => Decided::Already(Status::parse(answer.strip_prefix("already:").unwrap_or(""))),
        }
    }
}

/// What [`DECIDE`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub answer: Decided,
    /// The worker to wake (empty when the record is gone or settled).
    pub worker: String,
    /// Who approved so far.
    pub approvals: Vec<String>,
}

/// [`CLAIM`]'s answer: the entry is the record's card, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// This entry is the card (claimed now, or by this entry before).
    Ok,
    /// The record is not asked through this bridge.
    NotOurs,
    /// Settled already.
    Settled,
    /// The entry's digest is not the one the requesting service wrote.
    Digest,
    /// Another entry was taken as the card.
    Claimed,
    /// No such record.
    Missing,
}

impl Claimed {
    fn parse(answer: &str) -> Claimed {
        match answer {
            "ok" => Claimed::Ok,
            "settled" => Claimed::Settled,
            "digest" => Claimed::Digest,
            "claimed" => Claimed::Claimed,
            "missing" => Claimed::Missing,
            // An answer this version does not know is not a claim.
            _ => Claimed::NotOurs,
        }
    }
}

/// A card map entry's value: the approval id and the digest of the version
/// the card shows. The map is written only by the surface that showed the
/// card (its ACL), unlike the record's card fields (every surface of the
/// approval may write those), so it is what an answer to the card is bound
/// to: a card whose record fields were wiped still answers only for the
/// version it shows.
pub fn map_value(id: &str, digest: &str) -> String {
    match digest {
        "" => id.to_string(),
        d => format!("{id} {d}"),
    }
}

/// [`map_value`] read back: (approval id, digest when there is one).
fn parse_map_value(value: &str) -> (String, Option<String>) {
    match value.split_once(' ') {
        Some((id, digest)) => (id.to_string(), Some(digest.to_string())),
        None => (value.to_string(), None),
    }
}

/// [`EDIT`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditAnswer {
    /// Edited; the cards the edit superseded (bridge, external id), those shown.
    Edited {
        superseded_cards: Vec<(String, String)>,
    },
    Missing,
    Settled,
    Expired,
    /// Its send has started: too late to change what is sent.
    Sending,
    /// Another edit landed since the version the editor saw.
    Changed,
    /// Decided in a way no edit reopens (an unknown status reads as rejected).
    Closed(Status),
}

impl EditAnswer {
    fn parse(answer: &str, cards: Vec<String>) -> EditAnswer {
        match answer {
            "ok" => EditAnswer::Edited {
                superseded_cards: cards
                    .chunks_exact(2)
                    .map(|c| (c[0].clone(), c[1].clone()))
                    .collect(),
            },
            "missing" => EditAnswer::Missing,
            "settled" => EditAnswer::Settled,
            "expired" => EditAnswer::Expired,
            "sending" => EditAnswer::Sending,
            "changed" => EditAnswer::Changed,
            // A stored status, marked so a status forged to read `ok` stays one.
            other => {
                EditAnswer::Closed(Status::parse(other.strip_prefix("already:").unwrap_or("")))
            }
        }
    }
}

/// The notify side's claim of a record for one notification entry.
#[derive(Debug, Clone)]
pub struct Claim {
    pub answer: Claimed,
    /// The record after the claim; `None` when it does not exist.
    pub record: Option<Record>,
}

/// A notification's claim request: the record, the entry, the entry's digest.
pub struct ClaimRequest<'a> {
    pub id: &'a str,
    pub entry_id: &'a str,
    pub digest: &'a str,
}

/// The repository over one connection.
pub struct Approvals<'a> {
    store: &'a mut Store,
}

/// Puts `records` in their requesting bridges' pending indexes, and in their
/// agents' with their sizes (what the parking limits count).
fn index_all<'a>(pipe: &mut redis::Pipeline, records: impl IntoIterator<Item = &'a Record>) {
    // One command per index key, whatever the number of records: on a
    // cluster each key is its own slot, so commands alternating between keys
    // would be one round trip each.
    let mut zsets: BTreeMap<String, Vec<(u64, &str)>> = BTreeMap::new();
    let mut sizes: BTreeMap<String, Vec<(&str, u64)>> = BTreeMap::new();
    for r in records {
        let at = (r.created_at, r.id.as_str());
        zsets.entry(keys::pending(&r.source)).or_default().push(at);
        if let Some(agent) = &r.agent {
            zsets
                .entry(keys::agent_pending(&r.source, agent))
                .or_default()
                .push(at);
            sizes
                .entry(keys::agent_pending_bytes(&r.source, agent))
                .or_default()
                .push((r.id.as_str(), r.content_bytes));
        }
    }
    for (key, members) in zsets {
        pipe.zadd_multiple(key, &members).ignore();
    }
    for (key, fields) in sizes {
        pipe.cmd("HSET").arg(key).arg(&fields).ignore();
    }
}

/// Bytes as text, kept as they are when they are UTF-8 (nearly always: only a
/// forger writes anything else), with replacement characters otherwise.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `read` of each [`CHUNK`] of `ids`, each chunk's answers given to `each` in
/// the order of `ids`. One chunk is read in place; more are read [`AHEAD`] at
/// a time, each in a task of its own on a clone of the connection
/// (multiplexed), so Redis's work, the connection's parsing and the decoding
/// overlap instead of taking turns, and only the chunks in flight are held.
/// On an error the reads still in flight finish on their own and are
/// dropped; a read that panicked panics here.
async fn chunked<T, F>(
    conn: &Conn,
    ids: &[String],
    read: impl Fn(Conn, Vec<String>) -> F,
    mut each: impl FnMut(Vec<T>),
) -> Result<()>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<Vec<T>>> + Send + 'static,
{
    // An empty pipeline is a client error in redis-rs: nothing to read is
    // nothing read.
    if ids.is_empty() {
        return Ok(());
    }
    if ids.len() <= CHUNK {
        each(read(conn.clone(), ids.to_vec()).await?);
        return Ok(());
    }
    let mut chunks = ids.chunks(CHUNK);
    let mut in_flight = std::collections::VecDeque::new();
    loop {
        while in_flight.len() < AHEAD {
            let Some(chunk) = chunks.next() else { break };
            in_flight.push_back(tokio::spawn(read(conn.clone(), chunk.to_vec())));
        }
        let Some(next) = in_flight.pop_front() else {
            return Ok(());
        };
        let part = match next.await {
            Ok(part) => part?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => return Err(Error::internal(format!("a chunked read stopped: {e}"))),
        };
        each(part);
    }
}

/// Redis's answers to a chunk's pipeline, one per id, or an error: records
/// are paired with ids by position, so one answer missing would put every
/// later record under the wrong id.
fn one_each<A>(chunk: &[String], all: Vec<A>) -> Result<Vec<A>> {
    match all.len() == chunk.len() {
        true => Ok(all),
        false => Err(Error::internal(format!(
            "{} answers to a read of {} records",
            all.len(),
            chunk.len()
        ))),
    }
}

/// `fields` of each record of `chunk` (the rest left at their defaults),
/// in one round trip, in order; `None` for each gone.
async fn fields_chunk<F: AsRef<str> + redis::ToRedisArgs>(
    conn: &mut Conn,
    chunk: &[String],
    fields: &[F],
) -> Result<Vec<Option<Record>>> {
    let mut pipe = redis::pipe();
    for id in chunk {
        pipe.cmd("HMGET").arg(keys::approval(id)).arg(fields);
    }
    let all: Vec<Vec<RawField>> = pipe
        .query_async(conn)
        .await
        .map_err(|e| Error::from_redis("HMGET approvals", e))?;
    let all = one_each(chunk, all)?;
    Ok(chunk
        .iter()
        .zip(all)
        .map(|(id, values)| {
            let map: HashMap<String, String> = fields
                .iter()
                .zip(values)
                .filter_map(|(k, v)| Some((k.as_ref().to_string(), lossy(v?))))
                .collect();
            record_or_none(id, map)
        })
        .collect())
}

fn record_or_none(id: &str, map: HashMap<String, String>) -> Option<Record> {
    (!map.is_empty()).then(|| Record::from_map(id, map))
}

/// A record's hash as Redis holds it: bytes, which a forger need not make UTF-8.
type RawHash = HashMap<Vec<u8>, Vec<u8>>;
/// One field of it.
type RawField = Option<Vec<u8>>;

/// A whole record read as bytes, unless its `source` is not the bridge its id
/// is tagged with: whoever could write that field could otherwise send the
/// record's decisions and audit events where no service has rights, and stop
/// it. Bytes that are not UTF-8 (which only a forger writes) are read with
/// replacement characters: every check on them then fails, and nothing stops.
fn whole_record(id: &str, raw: RawHash) -> Option<Record> {
    let map: HashMap<String, String> = raw.into_iter().map(|(k, v)| (lossy(k), lossy(v))).collect();
    let record = record_or_none(id, map)?;
    if super::is_id_of(id, record.source()) {
        Some(record)
    } else {
        tracing::warn!(
            approval = id,
            source = record.source(),
            "a record whose source is not the bridge its id belongs to; ignored"
        );
        None
    }
}

impl<'a> Approvals<'a> {
    pub fn on(store: &'a mut Store) -> Approvals<'a> {
        Approvals { store }
    }

    /// Reads a record; `None` when it does not exist.
    pub async fn load(&mut self, id: &str) -> Result<Option<Record>> {
        let key = keys::approval(id);
        let map: RawHash = self
            .store
            .conn
            .hgetall(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("HGETALL {key}"), e))?;
        Ok(whole_record(id, map))
    }

    /// Loads many records, a thousand per pipelined round trip; `None` for each gone.
    pub async fn load_many(&mut self, ids: &[String]) -> Result<Vec<Option<Record>>> {
        let mut out = Vec::with_capacity(ids.len());
        let read = |mut conn: Conn, chunk: Vec<String>| async move {
            let mut pipe = redis::pipe();
            for id in &chunk {
                pipe.hgetall(keys::approval(id));
            }
            let all: Vec<RawHash> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::from_redis("HGETALL approvals", e))?;
            let all = one_each(&chunk, all)?;
            Ok(chunk
                .iter()
                .zip(all)
                .map(|(id, map)| whole_record(id, map))
                .collect())
        };
        chunked(&self.store.conn, ids, read, |part| out.extend(part)).await?;
        Ok(out)
    }

    /// Reads only `fields` of many records (the rest left at their defaults), a
    /// thousand per round trip; `None` for each gone. Values are read as bytes
    /// and decoded lossily, as [`whole_record`] does: one value that is not
    /// UTF-8 (any surface can write a record) must not fail the other 999, nor
    /// a recovery.
    pub async fn load_fields_many(
        &mut self,
        ids: &[String],
        fields: &[&str],
    ) -> Result<Vec<Option<Record>>> {
        // Read in turn: recovery reads a page's records (one chunk) with it,
        // and a restart measured no faster with its reads in a task of their
        // own; the page's queue keeps its records all the same.
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            out.extend(fields_chunk(&mut self.store.conn, chunk, fields).await?);
        }
        Ok(out)
    }

    /// [`Self::load_fields_many`] handing each record to `each` with its id,
    /// in the order of `ids`, without holding them all: a list of many
    /// approvals holds a line for each, not a record. On an error, `each`
    /// may have had the records of the chunks before it.
    pub async fn fields_of_each(
        &mut self,
        ids: &[String],
        fields: &[&str],
        mut each: impl FnMut(&str, Option<Record>),
    ) -> Result<()> {
        let fields: Arc<[String]> = fields.iter().map(|f| f.to_string()).collect();
        let read = move |mut conn: Conn, chunk: Vec<String>| {
            let fields = fields.clone();
            async move {
                let records = fields_chunk(&mut conn, &chunk, &fields).await?;
                Ok(chunk.into_iter().zip(records).collect::<Vec<_>>())
            }
        };
        chunked(&self.store.conn, ids, read, |part| {
            for (id, r) in part {
                each(&id, r);
            }
        })
        .await
    }

    /// Creates each record unless it exists and puts it in its requesting
    /// bridge's pending index, all in one round trip. Returns, per record,
    /// whether it was created.
    pub async fn create_many(&mut self, records: &[Record]) -> Result<Vec<bool>> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let invocations: Vec<_> = records
            .iter()
            .map(|r| {
                let mut inv = CREATE_SCRIPT.key(keys::approval(&r.id));
                for (k, v) in r.to_pairs() {
                    inv.arg(k).arg(v);
                }
                inv
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&CREATE_SCRIPT).ignore();
        // Every record before any index entry: the index is repaired from
        // the records, never the other way.
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        index_all(&mut pipe, records);
        let created: Vec<i64> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("EVALSHA create approvals", e))?;
        Ok(created.into_iter().map(|c| c == 1).collect())
    }

    /// Puts unsettled records in their requesting bridges' pending index again
    /// (after a crash between creating and indexing; the index is a cache of
    /// the records, repaired from them).
    pub async fn index(&mut self, records: &[&Record]) -> Result<()> {
        let mut pipe = redis::pipe();
        let unsettled: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| !r.is_settled())
            .collect();
        index_all(&mut pipe, unsettled.iter().copied());
        if !unsettled.is_empty() {
            let _: () = pipe
                .query_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis("ZADD pending", e))?;
        }
        Ok(())
    }

    /// Every id in pending index `key`, oldest first.
    async fn index_ids(&mut self, key: &str) -> Result<Vec<String>> {
        self.store
            .conn
            .zrange(key, 0, -1)
            .await
            .map_err(|e| Error::from_redis(&format!("ZRANGE {key}"), e))
    }

    /// The pending index of requesting bridge `bridge`, oldest first. Ids
    /// without the bridge's tag (parked before ids carried one) are left out:
    /// no service of the bridge can reach their records any more.
    pub async fn pending(&mut self, bridge: &str) -> Result<Vec<String>> {
        let key = keys::pending(bridge);
        let ids = self.index_ids(&key).await?;
        Ok(ids
            .into_iter()
            .filter(|id| super::is_id_of(id, bridge))
            .collect())
    }

    /// The oldest `n` of bridge `bridge`'s pending index (as [`Self::pending`]).
    pub async fn pending_oldest(&mut self, bridge: &str, n: usize) -> Result<Vec<String>> {
        let key = keys::pending(bridge);
        let ids: Vec<String> = self
            .store
            .conn
            .zrange(&key, 0, n.saturating_sub(1) as isize)
            .await
            .map_err(|e| Error::from_redis(&format!("ZRANGE {key}"), e))?;
        Ok(ids
            .into_iter()
            .filter(|id| super::is_id_of(id, bridge))
            .collect())
    }

    /// How many approvals bridge `bridge` has parked.
    pub async fn pending_count(&mut self, bridge: &str) -> Result<usize> {
        let key = keys::pending(bridge);
        self.store
            .conn
            .zcard(&key)
            .await
            .map_err(|e| Error::from_redis(&format!("ZCARD {key}"), e))
    }

    /// How many approvals bridge `bridge` has parked, and each of `agents`.
    pub async fn parked_counts(
        &mut self,
        bridge: &str,
        agents: &[&str],
    ) -> Result<(usize, Vec<usize>)> {
        let mut pipe = redis::pipe();
        pipe.zcard(keys::pending(bridge));
        for a in agents {
            pipe.zcard(keys::agent_pending(bridge, a));
        }
        let mut counts: Vec<usize> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("ZCARD pending", e))?;
        let all = counts.remove(0);
        Ok((all, counts))
    }

    /// The content bytes each of `agents`' pending approvals on `bridge` hold in all.
    pub async fn parked_bytes(&mut self, bridge: &str, agents: &[&str]) -> Result<Vec<u64>> {
        // redis-rs refuses an empty pipeline ("empty command"): a batch from
        // the flat stream alone names no agent.
        if agents.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for a in agents {
            pipe.hvals(keys::agent_pending_bytes(bridge, a));
        }
        let sizes: Vec<Vec<u64>> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("HVALS pending bytes", e))?;
        Ok(sizes.into_iter().map(|s| s.into_iter().sum()).collect())
    }

    /// Drops from `agent`'s pending index the ids whose records are gone (a
    /// crash between a record's deletion and its unindexing leaves them), so a
    /// count at its limit is a true one. Returns the count left.
    pub async fn prune_agent(&mut self, bridge: &str, agent: &str) -> Result<usize> {
        let key = keys::agent_pending(bridge, agent);
        let ids = self.index_ids(&key).await?;
        let mut left = 0;
        for chunk in ids.chunks(CHUNK) {
            // An untagged id (parked before ids carried the bridge's tag) is
            // out of this service's reach: counted as gone, never read.
            let mut pipe = redis::pipe();
            let tagged = chunk.iter().filter(|id| super::is_id_of(id, bridge));
            for id in tagged.clone() {
                pipe.exists(keys::approval(id));
            }
            // An empty pipeline is a client error in redis-rs.
            let mut found: Vec<bool> = if tagged.count() == 0 {
                Vec::new()
            } else {
                pipe.query_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis("EXISTS approvals", e))?
            };
            found.reverse();
            let exists: Vec<bool> = chunk
                .iter()
                .map(|id| super::is_id_of(id, bridge) && found.pop().unwrap_or(false))
                .collect();
            let gone: Vec<&String> = chunk
                .iter()
                .zip(&exists)
                .filter(|(_, e)| !**e)
                .map(|(id, _)| id)
                .collect();
            left += chunk.len() - gone.len();
            if !gone.is_empty() {
                let _: () = redis::pipe()
                    .zrem(&key, &gone)
                    .ignore()
                    .hdel(keys::agent_pending_bytes(bridge, agent), &gone)
                    .ignore()
                    .query_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis(&format!("ZREM {key}"), e))?;
            }
        }
        Ok(left)
    }

    /// Drops from `bridge`'s pending indexes (its own and its `agents'`) the
    /// ids without its tag: parked before ids carried one, out of every
    /// service's reach, and not to be counted against the parking limits.
    /// Returns how many were dropped. Run once at start-up.
    pub async fn drop_untagged(&mut self, bridge: &str, agents: &[&str]) -> Result<usize> {
        let mut dropped = 0;
        let indexes = std::iter::once(keys::pending(bridge))
            .chain(agents.iter().map(|a| keys::agent_pending(bridge, a)));
        for key in indexes {
            let ids = self.index_ids(&key).await?;
            let old: Vec<&String> = ids
                .iter()
                .filter(|id| !super::is_id_of(id, bridge))
                .collect();
            if !old.is_empty() {
                let n: usize = self
                    .store
                    .conn
                    .zrem(&key, &old)
                    .await
                    .map_err(|e| Error::from_redis(&format!("ZREM {key}"), e))?;
                dropped += n;
            }
        }
        Ok(dropped)
    }

    /// Ids of every approval record, by `SCAN` on every master (tests and
    /// tools: operators list from the pending index).
    pub async fn scan_ids(&mut self) -> Result<Vec<String>> {
        let pattern = format!("{}*", keys::APPROVAL_PREFIX);
        let mut ids = Vec::new();
        for key in self.store.conn.keys_matching(&pattern).await? {
            if let Some(id) = keys::approval_id_of(&key) {
                ids.push(id.to_string());
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// Sets fields of a record unless it is gone; returns whether it existed.
    async fn set(&mut self, id: &str, fields: &[(&str, &str)]) -> Result<bool> {
        let key = keys::approval(id);
        let set: i64 = SET_SCRIPT
            .key(&key)
            .arg(fields)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA set {key}"), e))?;
        Ok(set == 1)
    }

    /// Binds the digest of the one notification `card`'s notify side will show.
    pub async fn bind_notification(&mut self, id: &str, card: &Card, digest: &str) -> Result<bool> {
        self.set(id, &[(card.field(field::NOTIFY_SHA256).as_str(), digest)])
            .await
    }

    /// Remembers the notification entry written for a record.
    /// See [`FORGET_CLAIM`]. Returns whether the claim was forgotten.
    pub async fn forget_claim(&mut self, id: &str, card: &Card, entry: &str) -> Result<bool> {
        let key = keys::approval(id);
        let n: i64 = FORGET_SCRIPT
            .key(&key)
            .arg(entry)
            .arg(card.prefix())
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA forget claim {key}"), e))?;
        Ok(n == 1)
    }

    pub async fn mark_notified(
        &mut self,
        id: &str,
        card: &Card,
        notification: &str,
    ) -> Result<bool> {
        self.set(id, &[(card.field(field::NOTIFIED).as_str(), notification)])
            .await
    }

    /// [`Self::mark_notified`] for many records in one round trip:
    /// (approval id, card, notification entry id).
    pub async fn mark_notified_many(&mut self, notified: &[(&str, &Card, &str)]) -> Result<()> {
        let invocations: Vec<_> = notified
            .iter()
            .map(|(id, card, entry)| {
                let mut inv = SET_SCRIPT.key(keys::approval(id));
                inv.arg(card.field(field::NOTIFIED)).arg(*entry);
                inv
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&SET_SCRIPT).ignore();
        for inv in &invocations {
            pipe.invoke_script(inv).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("EVALSHA notified", e))?;
        Ok(())
    }

    /// Points a record at the worker that now holds its entry.
    pub async fn set_worker(&mut self, id: &str, worker: &str) -> Result<bool> {
        self.set(id, &[(field::WORKER, worker)]).await
    }

    /// Notes that the approved send of the version with `digest` started (a
    /// later attempt is a retry); `false` when the record is no longer approved
    /// at that digest (see [`START_DELIVERY`]).
    pub async fn mark_delivery_started(
        &mut self,
        id: &str,
        now: u64,
        digest: &str,
        worker: &str,
    ) -> Result<bool> {
        let key = keys::approval(id);
        let marked: i64 = START_SCRIPT
            .key(&key)
            .arg(now)
            .arg(digest)
            .arg(worker)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA start {key}"), e))?;
        Ok(marked == 1)
    }

    /// Replaces an approval's message with an approver's edit (see [`EDIT`]).
    /// Returns `ok` or why not, and the superseded cards (bridge, external id).
    pub async fn edit(
        &mut self,
        id: &str,
        seen: &str,
        now: f64,
        editor_counts_as: &str,
        (expires_at, escalated, seal): (u64, u32, &str),
        fields: &[(String, String)],
    ) -> Result<EditAnswer> {
        let key = keys::approval(id);
        let mut inv = EDIT_SCRIPT.key(&key);
        inv.arg(seen)
            .arg(now)
            .arg(APPROVALS_SEPARATOR)
            .arg(editor_counts_as)
            .arg(expires_at)
            .arg(escalated)
            .arg(seal);
        for (k, v) in fields {
            inv.arg(k).arg(v);
        }
        let (answer, cards): (String, Vec<String>) =
            inv.invoke_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("EVALSHA edit {key}"), e))?;
        Ok(EditAnswer::parse(&answer, cards))
    }

    /// Moves a pending record's deadline (see [`SNOOZE`]): `ok` or why not.
    pub async fn snooze(
        &mut self,
        read: &Record,
        next: &Record,
        now: f64,
        request: &str,
    ) -> Result<String> {
        let key = keys::approval(&read.id);
        SNOOZE_SCRIPT
            .key(&key)
            .arg(now)
            .arg(read.expires_at)
            .arg(read.snoozes)
            .arg(next.expires_at)
            .arg(next.snoozes)
            .arg(next.snoozed_by.as_deref().unwrap_or(""))
            .arg(next.version_seal.as_deref().unwrap_or(""))
            .arg(read.version_seal.as_deref().unwrap_or(""))
            .arg(request)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA snooze {key}"), e))
    }

    /// Takes the next escalation step on `read` as `next` (see [`ESCALATE`];
    /// `card`: the step's, as `next` lists it last): `ok` or why not.
    pub async fn escalate(
        &mut self,
        read: &Record,
        next: &Record,
        card: &Card,
        now: f64,
    ) -> Result<String> {
        let key = keys::approval(&read.id);
        ESCALATE_SCRIPT
            .key(&key)
            .arg(now)
            .arg(read.escalated)
            .arg(read.version_seal.as_deref().unwrap_or(""))
            .arg(next.escalated)
            .arg(next.version_seal.as_deref().unwrap_or(""))
            .arg(&card.bridge)
            .arg(&card.channel)
            .arg(&card.sha256)
            .arg(APPROVALS_SEPARATOR)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA escalate {key}"), e))
    }

    /// Notes the reminder of a pending approval, once (see [`REMIND`]).
    pub async fn mark_reminded(&mut self, id: &str, now: u64) -> Result<bool> {
        let key = keys::approval(id);
        let noted: i64 = REMIND_SCRIPT
            .key(&key)
            .arg(now)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA remind {key}"), e))?;
        Ok(noted == 1)
    }

    /// Forgets that a send started: it was deferred, not attempted.
    pub async fn clear_delivery_started(&mut self, id: &str) -> Result<()> {
        let key = keys::approval(id);
        let _: i64 = self
            .store
            .conn
            .hdel(&key, field::DELIVERY_STARTED)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {key}"), e))?;
        Ok(())
    }

    /// Notes that `card`'s surface could not show it.
    pub async fn mark_unshown(&mut self, id: &str, card: &Card) -> Result<bool> {
        self.set(id, &[(card.field(field::UNSHOWN).as_str(), "1")])
            .await
    }

    /// Notes that the outcome entry was written to `card`'s notify bridge.
    pub async fn mark_outcome_sent(&mut self, id: &str, card: &Card) -> Result<bool> {
        self.set(id, &[(card.field(field::OUTCOME_SENT).as_str(), "1")])
            .await
    }

    /// Decides a record (see [`DECIDE`]).
    pub async fn decide(
        &mut self,
        id: &str,
        a: &super::Answer<'_>,
        seal: &str,
        count: &super::Count,
    ) -> Result<Decision> {
        let (verdict, approver, reason, now) = (a.verdict, a.approver, a.reason, a.at);
        let key = keys::approval(id);
        let (answer, worker, approvals): (Vec<u8>, Vec<u8>, Vec<u8>) = DECIDE_SCRIPT
            .key(&key)
            .arg(verdict.as_str())
            .arg(approver)
            .arg(reason)
            .arg(now)
            .arg(now as u64)
            .arg(APPROVALS_SEPARATOR)
            .arg(a.card.unwrap_or(""))
            .arg(a.seen.unwrap_or(""))
            .arg(a.counts_as.unwrap_or(approver))
            .arg(if a.editors_count { "1" } else { "0" })
            .arg(a.proof.unwrap_or(""))
            .arg(seal)
            .arg(&count.tally.approvals)
            .arg(&count.tally.people)
            .arg(&count.tally.proofs)
            .arg(&count.next_seal)
            .arg(&count.quorum)
            .arg(&count.editors)
            .arg(&count.expires_at)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA decide {key}"), e))?;
        // Bytes: a forged worker name or list that is not UTF-8 stops nothing.
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        let approvals = text(approvals);
        Ok(Decision {
            answer: Decided::parse(&text(answer)),
            worker: text(worker),
            approvals: approvals
                .split(APPROVALS_SEPARATOR)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    /// Marks a record settled with its outcome, with [`SETTLED_TTL_SECS`] (see
    /// [`MARK_SETTLED`]). Returns whether this call settled it.
    pub async fn mark_settled(&mut self, id: &str, outcome: &str, now: u64) -> Result<bool> {
        let key = keys::approval(id);
        let set: i64 = SETTLE_SCRIPT
            .key(&key)
            .arg(now)
            .arg(outcome)
            .arg(SETTLED_TTL_SECS)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA settle {key}"), e))?;
        Ok(set == 1)
    }

    /// The requesting side's last step: out of the pending index, the map
    /// entries of `cards` (those it asked, see [`super::cards_asked`])
    /// dropped, and the record deleted unless the notify side owns it now.
    pub async fn close(&mut self, record: &Record, cards: &[Card], delete: bool) -> Result<()> {
        let key = keys::approval(&record.id);
        let mut pipe = redis::pipe();
        pipe.zrem(keys::pending(&record.source), &record.id)
            .ignore();
        if let Some(agent) = &record.agent {
            pipe.zrem(keys::agent_pending(&record.source, agent), &record.id)
                .ignore();
            pipe.hdel(keys::agent_pending_bytes(&record.source, agent), &record.id)
                .ignore();
        }
        for card in cards {
            if let Some(external) = &card.external_id {
                pipe.hdel(keys::approval_map(&card.bridge), external)
                    .ignore();
            }
        }
        if delete {
            pipe.del(&key).ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        Ok(())
    }

    /// A record that vanished: out of `bridge`'s pending index (and its
    /// agent's, when known).
    pub async fn unindex(&mut self, bridge: &str, agent: Option<&str>, id: &str) -> Result<()> {
        let key = keys::pending(bridge);
        let mut pipe = redis::pipe();
        pipe.zrem(&key, id).ignore();
        if let Some(agent) = agent {
            pipe.zrem(keys::agent_pending(bridge, agent), id).ignore();
            pipe.hdel(keys::agent_pending_bytes(bridge, agent), id)
                .ignore();
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("ZREM {key}"), e))?;
        Ok(())
    }

    /// The notify side's last step: its card's map entry deleted, and the
    /// record with it when it is the approval's only card. A record asked on
    /// several surfaces is left to its TTL (set when it settled): each
    /// surface's outcome is shown from it, in whatever order they come.
    pub async fn delete_shown(&mut self, record: &Record, card: &Card) -> Result<()> {
        let key = keys::approval(&record.id);
        let mut pipe = redis::pipe();
        if record.also.is_empty() {
            pipe.del(&key).ignore();
        }
        if let Some(external) = &card.external_id {
            pipe.hdel(keys::approval_map(&card.bridge), external)
                .ignore();
        }
        if pipe.cmd_iter().next().is_none() {
            return Ok(()); // nothing to drop (an empty pipeline is an error)
        }
        let _: () = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("DEL {key}"), e))?;
        Ok(())
    }

    /// Claims records for notification entries of notify bridge `bridge`, in one
    /// round trip (see [`CLAIM`]).
    pub async fn claim_many(
        &mut self,
        bridge: &str,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Claim>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let invocations: Vec<_> = requests
            .iter()
            .map(|r| {
                let mut inv = CLAIM_SCRIPT.key(keys::approval(r.id));
                inv.arg(bridge).arg(r.entry_id).arg(r.digest);
                inv
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&CLAIM_SCRIPT).ignore();
        for (inv, r) in invocations.iter().zip(requests) {
            pipe.invoke_script(inv);
            // The record as it is after the claim (a writer between the two
            // could as well have written just after both).
            pipe.hgetall(keys::approval(r.id));
        }
        let failed = |e: redis::RedisError| Error::from_redis("EVALSHA claim notifications", e);
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(failed)?;
        if replies.len() != requests.len() * 2 {
            return Err(Error::internal(format!(
                "claiming {} notifications answered {} replies",
                requests.len(),
                replies.len()
            )));
        }
        let mut replies = replies.into_iter();
        let mut claims = Vec::with_capacity(requests.len());
        for (r, (answer, map)) in requests.iter().zip(std::iter::from_fn(|| {
            Some((replies.next()?, replies.next()?))
        })) {
            let answer: String = redis::from_redis_value(answer).map_err(|e| failed(e.into()))?;
            let map: RawHash = redis::from_redis_value(map).map_err(|e| failed(e.into()))?;
            claims.push(Claim {
                answer: Claimed::parse(&answer),
                record: whole_record(r.id, map),
            });
        }
        Ok(claims)
    }

    /// Records cards shown by notify bridge `bridge` in one round trip: each
    /// card's map entry and the record's note of it (see [`NOTE_SHOWN`]), plus
    /// `then` (the caller's acks, so a card is recorded and its entry acked
    /// together). A card whose record is gone, or no longer claims the entry it
    /// was shown from (edited meanwhile), keeps no answerable card: its map
    /// entry is removed again. `shown`: (approval id, entry id, external id,
    /// the digest of the version the card shows; see [`map_value`]). Returns,
    /// for each, whether its card was recorded.
    pub async fn record_shown(
        &mut self,
        bridge: &str,
        shown: &[(&str, &str, &str, &str)],
        then: impl FnOnce(&mut redis::Pipeline),
    ) -> Result<Vec<bool>> {
        let map = keys::approval_map(bridge);
        let notes: Vec<_> = shown
            .iter()
            .map(|(id, entry, external, _)| {
                let mut note = SHOWN_SCRIPT.key(keys::approval(id));
                note.arg(*entry)
                    .arg(*external)
                    .arg(APPROVALS_SEPARATOR)
                    .arg(bridge);
                note
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&SHOWN_SCRIPT).ignore();
        // Every map entry (one command) before the notes: on a cluster the
        // notes, each on its own record, then go side by side.
        let entries: Vec<(&str, String)> = shown
            .iter()
            .map(|(id, _, ext, digest)| (*ext, map_value(id, digest)))
            .collect();
        if !entries.is_empty() {
            // HSET with many fields (the crate's `hset_multiple` is HMSET,
            // which the ACL users are not granted).
            pipe.cmd("HSET").arg(&map).arg(&entries).ignore();
        }
        for note in &notes {
            pipe.invoke_script(note);
        }
        then(&mut pipe);
        let kept: Vec<i64> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("HSET {map}"), e))?;
        let kept: Vec<bool> = kept.into_iter().map(|k| k != 0).collect();
        let gone: Vec<&str> = shown
            .iter()
            .zip(&kept)
            .filter(|(_, k)| !**k)
            .map(|((_, _, external, _), _)| *external)
            .collect();
        if !gone.is_empty() {
            let _: i64 = self
                .store
                .conn
                .hdel(&map, gone)
                .await
                .map_err(|e| Error::from_redis(&format!("HDEL {map}"), e))?;
        }
        Ok(kept)
    }

    /// The approval id behind a card notify bridge `bridge` showed.
    pub async fn map_get(&mut self, bridge: &str, external_id: &str) -> Result<Option<String>> {
        Ok(self.map_shown(bridge, external_id).await?.map(|(id, _)| id))
    }

    /// The approval id behind a card notify bridge `bridge` showed, and the
    /// digest of the version it shows (none for a card recorded by an older
    /// version).
    pub async fn map_shown(
        &mut self,
        bridge: &str,
        external_id: &str,
    ) -> Result<Option<(String, Option<String>)>> {
        let map = keys::approval_map(bridge);
        let value: Option<String> = self
            .store
            .conn
            .hget(&map, external_id)
            .await
            .map_err(|e| Error::from_redis(&format!("HGET {map}"), e))?;
        Ok(value.map(|v| parse_map_value(&v)))
    }

    /// Whether `external_id` is a live card of notify bridge `bridge`.
    pub async fn map_has(&mut self, bridge: &str, external_id: &str) -> Result<bool> {
        let map = keys::approval_map(bridge);
        self.store
            .conn
            .hexists(&map, external_id)
            .await
            .map_err(|e| Error::from_redis(&format!("HEXISTS {map}"), e))
    }

    /// Every live card of surface `bridge`: (external id, approval id).
    pub async fn map_entries(&mut self, bridge: &str) -> Result<Vec<(String, String)>> {
        let map = keys::approval_map(bridge);
        let all: Vec<(String, String)> = self
            .store
            .conn
            .hgetall(&map)
            .await
            .map_err(|e| Error::from_redis(&format!("HGETALL {map}"), e))?;
        Ok(all
            .into_iter()
            .map(|(card, v)| (card, parse_map_value(&v).0))
            .collect())
    }

    /// Disarms a card: answers to it are no longer looked up.
    pub async fn map_delete(&mut self, bridge: &str, external_id: &str) -> Result<()> {
        let map = keys::approval_map(bridge);
        let _: i64 = self
            .store
            .conn
            .hdel(&map, external_id)
            .await
            .map_err(|e| Error::from_redis(&format!("HDEL {map}"), e))?;
        Ok(())
    }

    /// What the sweep needs of each parked record, in one round trip.
    /// `surfaces`: the other surfaces the bridge may ask on (`also` and the
    /// escalation steps): a record is shown when each card it lists of
    /// these is.
    pub async fn sweep_read(
        &mut self,
        ids: &[String],
        surfaces: &[&str],
    ) -> Result<Vec<SweepState>> {
        if ids.is_empty() {
            return Ok(Vec::new()); // redis-rs refuses an empty pipeline
        }
        let mut pipe = redis::pipe();
        let mut names = vec![
            field::STATUS.to_string(),
            field::NOTIFIED.to_string(),
            field::NOTIFY_EXTERNAL_ID.to_string(),
            field::ALSO.to_string(),
        ];
        names.push(field::UNSHOWN.to_string());
        for b in surfaces {
            let prefix = format!("{b}.");
            names.push(field::card_field(&prefix, field::NOTIFY_EXTERNAL_ID));
            names.push(field::card_field(&prefix, field::UNSHOWN));
        }
        for id in ids {
            pipe.cmd("HMGET").arg(keys::approval(id)).arg(&names);
        }
        // Bytes: a forged field that is not UTF-8 reads as an unknown status.
        let states: Vec<Vec<RawField>> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("HMGET approval (sweep)", e))?;
        Ok(states
            .into_iter()
            .map(|f| {
                let at = |i: usize| f.get(i).cloned().flatten();
                let also = at(3).map(|a| String::from_utf8_lossy(&a).into_owned());
                // Each card listed (and still asked) is shown, or was
                // refused by its platform (nothing more to do for it).
                let others_done = also.unwrap_or_default().lines().all(|b| {
                    match surfaces.iter().position(|s| *s == b) {
                        Some(i) => at(5 + 2 * i).is_some() || at(6 + 2 * i).is_some(),
                        None => true,
                    }
                });
                SweepState {
                    status: at(0).map(|s| Status::parse(&String::from_utf8_lossy(&s))),
                    notified: at(1).is_some(),
                    shown: (at(2).is_some() || at(4).is_some()) && others_done,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Lua spells field names itself: each one it names must be a field.
    #[test]
    fn the_scripts_name_only_record_fields() {
        for script in [
            CREATE,
            DECIDE,
            SET_IF_EXISTS,
            CLAIM,
            MARK_SETTLED,
            EDIT,
            START_DELIVERY,
            NOTE_SHOWN,
            FORGET_CLAIM,
            SNOOZE,
            REMIND,
            ESCALATE,
        ] {
            // Comments may hold apostrophes: only code is read.
            let code: String = script
                .lines()
                .map(|l| l.split("--").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let quotes = code.matches('\'').count();
            assert_eq!(quotes % 2, 0, "unbalanced quotes in a script:\n{code}");
            for quoted in code.split('\'').skip(1).step_by(2) {
                let is_command = quoted.chars().all(|c| c.is_ascii_uppercase());
                let is_number = quoted.chars().all(|c| c.is_ascii_digit());
                let others = [
                    "ok", "not-ours", "digest", "claimed", "sending", "changed", "pending",
                    "approved", "again", "stale", "asked", "expired", "settled", "missing",
                ];
                let is_answer =
                    Decided::ANSWERS.iter().any(|(a, _)| *a == quoted) || others.contains(&quoted);
                // A pattern piece such as `[^`, not a name.
                let is_pattern = !quoted
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
                if is_pattern && !is_answer {
                    continue;
                }
                assert!(
                    is_command || is_number || is_answer || field::ALL.contains(&quoted),
                    "`{quoted}` in a script is not a record field"
                );
            }
        }
    }

    /// The edit script's answers are typed; a status forged to read `ok` is
    /// a closed record, not an edit.
    #[test]
    fn edit_answers_are_typed_and_a_forged_status_edits_nothing() {
        assert_eq!(
            EditAnswer::parse("ok", vec!["desk".into(), "card".into()]),
            EditAnswer::Edited {
                superseded_cards: vec![("desk".into(), "card".into())]
            }
        );
        assert_eq!(
            EditAnswer::parse("sending", Vec::new()),
            EditAnswer::Sending
        );
        for forged in ["already:ok", "already:rejected", "ok-ish"] {
            assert_eq!(
                EditAnswer::parse(forged, Vec::new()),
                EditAnswer::Closed(Status::Rejected),
                "{forged}"
            );
        }
    }

    /// Every answer of the decision script reads as its own variant; a status
    /// the broker never writes reads as rejected (fails closed).
    #[test]
    fn decision_answers_are_typed_and_forged_statuses_fail_closed() {
        for (answer, decided) in Decided::ANSWERS {
            assert_eq!(Decided::parse(answer), *decided, "{answer}");
            assert!(!matches!(decided, Decided::Already(_)), "{answer}");
        }
        assert_eq!(
            Decided::parse("already:approved"),
            Decided::Already(Status::Approved)
        );
        assert_eq!(
            Decided::parse("already:rejected"),
            Decided::Already(Status::Rejected)
        );
        for forged in [
            "already:forged",
            "already:decided",
            "already:stale",
            "approved",
            "?",
        ] {
            assert_eq!(
                Decided::parse(forged),
                Decided::Already(Status::Rejected),
                "{forged}"
            );
        }
    }

    /// A late reason keeps its wire spelling, and one from a newer version
    /// never fails a reply.
    #[test]
    fn late_reasons_keep_their_wire_spelling() {
        use super::super::Late;
        for late in [Late::Missing, Late::Superseded, Late::Busy, Late::Tampered] {
            let json = serde_json::to_string(&late).unwrap();
            assert_eq!(json, format!("\"{late}\""));
            assert_eq!(serde_json::from_str::<Late>(&json).unwrap(), late);
        }
        assert_eq!(
            serde_json::from_str::<Late>("\"newer\"").unwrap(),
            Late::Unknown
        );
    }
}
