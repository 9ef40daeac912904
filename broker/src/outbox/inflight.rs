//! In-flight marks and the send gate: a send is made by one worker at most,
//! even when a paused worker wakes up after another took its entries over.
//!
//! Every delivery (plain or approved) is marked before its send in the marks
//! hash of its stream (`{<stream>}:in-flight`, [`keys::in_flight_marks`]),
//! field = delivery key:
//!
//! ```text
//! started:{worker}   the worker will send; it has not reached the platform
//! writing:{worker}   the worker passed its gate: the platform may have it
//! ```
//!
//! Invariants:
//! - The gate ([`GATE`]) turns `started:{me}` (or no mark) into
//!   `writing:{me}` in one step right before the platform call (keeps
//!   `writing:{me}`, a retry after this worker's own restart), and refuses
//!   when the mark is another worker's or the entry is no longer this
//!   worker's in its group's pending list. A worker that took the entry over
//!   claimed it and wrote `started:{taker}` first, so a paused worker that
//!   wakes up behind a takeover sends nothing (it is *fenced*), whatever its
//!   lease says and however long it slept; once the taker is done the entry
//!   is no longer pending at all.
//! - An entry read for the first time is not marked before its gate: nobody
//!   was ever handed it, so no earlier attempt can have left a mark (entries
//!   read again, after a crash or a takeover, are).
//! - A run of plain sends or approval cards to one destination from one
//!   stream passes its gate in one step ([`GATE_RUN`], same rules per send),
//!   for senders that deduplicate a retry only: sends queued behind their
//!   destination, or cards marked together for a sender that does not split
//!   messages (its cards never queue). Its first send goes as a send alone would;
//!   the next ones only while the gate is fresh (`Timing::run_fresh`, 200 ms,
//!   by the time since boot, which runs on while the process is stopped);
//!   the rest are taken out of the run's mark ([`UNGATE`]) and pass the gate
//!   again. So a paused worker that wakes begins nothing its gate no longer
//!   covers. A worker that dies in the middle of a run leaves `writing:`
//!   on sends it had not begun, at most a run's length (`deliver::RUN_MAX`):
//!   a taker cannot tell them from begun ones and treats them so (delivered
//!   where the sender finds them, `uncertain` otherwise), as for a single send.
//! - A run's gate writes one mark for the run, not one per send: a field
//!   `{worker}:{unique}` ([`run_mark`]) of the stream's runs hash
//!   ([`keys::in_flight_runs`]), whose value is `writing:{worker}` and the
//!   entry ids it passed. Everything that reads a delivery's mark
//!   before sending (marking, the gate of entries handed out again) reads a
//!   run's mark that lists it as that delivery's `writing:` mark, over a
//!   `started:` of its own ([`marks_by_delivery`] says the same for tests and
//!   tools, but for which of two runs listing one entry counts). Runs are
//!   read only for entries handed out more than once (`XPENDING`'s delivery
//!   count): one handed out once was never another worker's. An operator
//!   who rewinds a group (`XGROUP SETID`) while workers run breaks that, as
//!   it already re-sends every acked entry after the new position. An entry comes out of its run's mark when its own mark would go
//!   ([`CLEAR`]), the mark goes with its run's last send (acked or cleared;
//!   [`RunMarks`]), a worker's own run found after its restart moves to the
//!   deliveries' own marks as they are marked again, a taker takes the entry
//!   out of the other's run once its outcome is recorded, and the trim drops
//!   a run's mark none of whose entries is pending. Why: the gate's write per
//!   send was most of its cost in Redis (`docs/benchmarks.md`).
//! - Marking ([`MARK`]) never overwrites `writing:*`: a send that may have
//!   reached the platform stays known. Seen from another worker it is
//!   [`Prior::Taken`]: that worker may still complete it, so the taker never
//!   sends it again and reports it delivered only when the sender can prove it
//!   (`Sender::delivered_already`), `uncertain` otherwise (a sender that cannot
//!   deduplicate is handed it as a retry, which it reports uncertain itself,
//!   with its details).
//! - `started:*` found when marking means no attempt passed its gate: the send
//!   is made afresh, not as a retry.
//! - A mark is removed only by its own worker ([`CLEAR`]), after the outcome
//!   is recorded (a mark removed before the ack would let a restart send
//!   again), or right after the ack of its entry by the worker that acked it
//!   (in the same round trip: an acked entry is no one's to send).
//! - Marking and the gate also check, in the same step, that the entry is
//!   still this worker's in its group's pending list: a taker claims before
//!   it marks, so a worker that stalled anywhere between reading an entry and
//!   its platform call (a pause, a deferred retry) sends nothing once taken
//!   over, even if the taker has finished and cleared its mark.
//! - The marks of a batch's sends are taken together ([`Unmarked`], one
//!   pipelined round trip, one [`MARK_MANY`] per stream, the same rules per
//!   send as [`MARK`]); no send of the batch starts before its own mark is
//!   answered.
//! - The scripts that read an entry's place name the marks hash, the entry's
//!   stream and (those that read runs) the runs hash; both hashes are tagged
//!   with the stream's name, so all are in one slot on Redis Cluster too. Marks found in the one-hash-per-bridge layout of
//!   earlier versions are moved beside their streams at start
//!   ([`OutboxService::move_legacy_marks`]) before anything is read.

use super::*;

/// Lua helpers for runs' marks (fields of a stream's runs hash,
/// [`keys::in_flight_runs`]: run mark → `writing:{worker}`, a newline, then
/// the entry ids the run's gate passed, each between spaces):
/// - `run_owner(v)`: a run mark's owner line and the position of the
///   newline after it (nil when the value has no newline; the owner may be
///   anything, so callers to whom it matters check it says `writing:`).
/// - `run_ids(v, nl)`: the ids a run mark lists after that newline.
/// - `run_owners(runs, mine, wanted)`: for the entry ids in list `wanted`,
///   whose run lists each (`writing:{worker}`), and which run. Only
///   `writing:` owners count; where two runs list one entry, another
///   worker's wins over `mine` (it may still send). Asked only for entries
///   handed out more than once: one handed out once was never another
///   worker's, and this worker's runs list it only while it is under way.
/// - `run_drop(runs, owner, mark, ids)`: takes `ids` out of run mark `mark`
///   if `owner`'s, and removes the mark once it lists none.
macro_rules! runs_lua {
    () => {
        r#"
local function run_owner(v)
  local nl = string.find(v, '\n', 1, true)
  if not nl then return nil end
  return string.sub(v, 1, nl - 1), nl
end
local function run_ids(v, nl)
  return string.gmatch(string.sub(v, nl + 1), '%S+')
end
local function run_owners(runs, mine, wanted)
  local owners, where = {}, {}
  if #wanted == 0 then return owners, where end
  local set = {}
  for _, id in ipairs(wanted) do set[id] = true end
  local all = redis.call('HGETALL', runs)
  for n = 1, #all, 2 do
    local v = all[n + 1]
    local owner, nl = run_owner(v)
    if owner and string.sub(owner, 1, 8) == 'writing:' then
      local function note(id)
        if owners[id] == nil or owners[id] == mine then
          owners[id], where[id] = owner, all[n]
        end
      end
      if #wanted <= 8 then
        -- A few entries: found by plain search, no id of the run copied.
        for _, id in ipairs(wanted) do
          if string.find(v, ' ' .. id .. ' ', nl, true) then note(id) end
        end
      else
        for id in run_ids(v, nl) do
          if set[id] then note(id) end
        end
      end
    end
  end
  return owners, where
end
local function run_drop(runs, owner, mark, ids)
  local v = redis.call('HGET', runs, mark)
  if not v or string.sub(v, 1, #owner + 1) ~= owner .. '\n' then return end
  local changed = false
  for _, id in ipairs(ids) do
    local at = string.find(v, ' ' .. id .. ' ', 1, true)
    if at then
      v = string.sub(v, 1, at) .. string.sub(v, at + #id + 2)
      changed = true
    end
  end
  if not string.find(v, '\n %S') then
    redis.call('HDEL', runs, mark)
  elseif changed then
    redis.call('HSET', runs, mark, v)
  end
end
"#
    };
}

/// Marks a delivery `started:{worker}` unless some attempt passed its gate,
/// and only while the entry is this worker's in its group's pending list
/// (a taker `XCLAIM`s before it marks, so a worker that stalled before
/// marking finds the entry gone from its hands). KEYS: the in-flight hash, the
/// entry's stream, the runs hash. ARGV: delivery key, worker, group,
/// consumer, entry id. Returns the previous value ('' when none), or
/// `not-mine`.
pub const MARK: &str = concat!(
    runs_lua!(),
    r#"
local p = redis.call('XPENDING', KEYS[2], ARGV[3], ARGV[5], ARGV[5], 1)
if not p[1] or p[1][2] ~= ARGV[4] then return 'not-mine' end
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.sub(v, 1, 8) == 'writing:' then return v end
local writing = 'writing:' .. ARGV[2]
local wanted = {}
if p[1][4] > 1 then wanted = {ARGV[5]} end
local owners, where = run_owners(KEYS[3], writing, wanted)
local run = owners[ARGV[5]]
if run then
  -- Listed by a run that passed its gate: this worker's own (before a
  -- restart) moves to the delivery's own mark, so its retry stays known and
  -- the run's mark goes once all have moved; another's is left to that worker.
  if run == writing then
    redis.call('HSET', KEYS[1], ARGV[1], run)
    run_drop(KEYS[3], run, where[ARGV[5]], {ARGV[5]})
  end
  return run
end
if v and string.sub(v, 1, 8) ~= 'started:' then
  -- A mark of an older version (a time): this worker's attempt may have
  -- reached the platform; it goes on as a retry of its own.
  redis.call('HSET', KEYS[1], ARGV[1], writing)
  return v
end
redis.call('HSET', KEYS[1], ARGV[1], 'started:' .. ARGV[2])
return v or ''
"#
);

/// [`MARK`] for several deliveries of one stream, in one step. KEYS: the
/// in-flight hash, the stream, the runs hash. ARGV: worker, group, consumer,
/// then (delivery key, entry id) pairs. Returns what [`MARK`] would, per pair.
pub const MARK_MANY: &str = concat!(
    runs_lua!(),
    r#"
local out, moved, held, wanted = {}, {}, {}, {}
local writing = 'writing:' .. ARGV[1]
for i = 4, #ARGV, 2 do
  local id = ARGV[i + 1]
  local p = redis.call('XPENDING', KEYS[2], ARGV[2], id, id, 1)
  held[i] = p[1] and p[1][2] == ARGV[3]
  if held[i] and p[1][4] > 1 then wanted[#wanted + 1] = id end
end
local runs, where = run_owners(KEYS[3], writing, wanted)
for i = 4, #ARGV, 2 do
  local key, id = ARGV[i], ARGV[i + 1]
  if not held[i] then
    out[#out + 1] = 'not-mine'
  else
    local v = redis.call('HGET', KEYS[1], key)
    if v and string.sub(v, 1, 8) == 'writing:' then
      out[#out + 1] = v
    elseif runs[id] then
      -- As in MARK: this worker's own run's mark moves to the delivery's.
      if runs[id] == writing then
        redis.call('HSET', KEYS[1], key, writing)
        moved[where[id]] = moved[where[id]] or {}
        table.insert(moved[where[id]], id)
      end
      out[#out + 1] = runs[id]
    elseif v and string.sub(v, 1, 8) ~= 'started:' then
      redis.call('HSET', KEYS[1], key, writing)
      out[#out + 1] = v
    else
      redis.call('HSET', KEYS[1], key, 'started:' .. ARGV[1])
      out[#out + 1] = v or ''
    end
  end
end
for mark, ids in pairs(moved) do run_drop(KEYS[3], writing, mark, ids) end
return out
"#
);

/// The gate right before the platform call. KEYS: the in-flight hash, the
/// entry's stream. ARGV: delivery key, worker, group, consumer, entry id.
/// Returns 1 when this worker may send (the entry still its own in the
/// pending list, the mark now `writing:`; a `writing:` mark of its own is a
/// retry after its restart), 0 when another worker holds the delivery.
pub const GATE: &str = r#"
local p = redis.call('XPENDING', KEYS[2], ARGV[3], ARGV[5], ARGV[5], 1)
if not p[1] or p[1][2] ~= ARGV[4] then return 0 end
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and v ~= 'started:' .. ARGV[2] and v ~= 'writing:' .. ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], 'writing:' .. ARGV[2])
return 1
"#;

/// The gate of a run: [`GATE`] for each delivery of one stream, in one step.
/// KEYS: the in-flight hash, the stream, the runs hash. ARGV: worker, group,
/// consumer, the lowest and the highest entry id of the run, the run's mark
/// (new, [`run_mark`]), then the entry ids (a delivery key is the stream's
/// name, `/`, the id). Returns per id 0 (refused), 1 (passed, and listed in
/// the run's mark) or 2 (passed, and its own mark said `writing:{me}`
/// already, or a run of this worker's listed it, which moves to its own
/// mark as in [`MARK`]: an attempt before may have reached the platform,
/// which no later step may forget; not listed). Whose entries are is read
/// once for the run's range (this consumer's pending entries in it, usually
/// just the run's); one entry at a time only past a range too full to read
/// whole. An entry handed out once (delivery count 1) was never another
/// worker's, so no other run can list it: the runs are read only when an
/// entry was handed out again.
pub const GATE_RUN: &str = concat!(
    runs_lua!(),
    r#"
local started, writing = 'started:' .. ARGV[1], 'writing:' .. ARGV[1]
local n = #ARGV - 6
if n <= 0 then return {} end
local limit = 2 * n + 16
local mine = {}
local range = redis.call('XPENDING', KEYS[2], ARGV[2], ARGV[4], ARGV[5], limit, ARGV[3])
for _, p in ipairs(range) do mine[p[1]] = p[4] end
local whole = #range < limit
-- Sends' own marks: none while a stream only forwards (a run marks
-- itself), so their names are built only when there are some.
local fields, marks = {}, {}
if redis.call('HLEN', KEYS[1]) > 0 then
  for i = 1, n do fields[i] = KEYS[2] .. '/' .. ARGV[6 + i] end
  marks = redis.call('HMGET', KEYS[1], unpack(fields))
end
local counts, wanted = {}, {}
for i = 1, n do
  local v, id = marks[i], ARGV[6 + i]
  if not v or v == started or v == writing then
    local count = mine[id]
    if count == nil and not whole then
      local p = redis.call('XPENDING', KEYS[2], ARGV[2], id, id, 1)
      if p[1] and p[1][2] == ARGV[3] then count = p[1][4] end
    end
    counts[i] = count
    if count and count > 1 and v ~= writing then wanted[#wanted + 1] = id end
  end
end
local runs, where = run_owners(KEYS[3], writing, wanted)
local out, listed, moved = {}, {}, {}
for i = 1, n do
  local ok, v, id, count = 0, marks[i], ARGV[6 + i], counts[i]
  if not v or v == started or v == writing then
    if count then
      if v == writing then
        ok = 2
      elseif count > 1 then
        if not runs[id] then
          ok = 1
        elseif runs[id] == writing then
          ok = 2
          redis.call('HSET', KEYS[1], KEYS[2] .. '/' .. id, writing)
          moved[where[id]] = moved[where[id]] or {}
          table.insert(moved[where[id]], id)
        end
      else
        ok = 1
      end
      if ok == 1 then listed[#listed + 1] = id end
    end
  end
  out[i] = ok
end
for mark, ids in pairs(moved) do run_drop(KEYS[3], writing, mark, ids) end
if #listed > 0 then
  redis.call('HSET', KEYS[3], ARGV[6], writing .. '\n ' .. table.concat(listed, ' ') .. ' ')
end
return out
"#
);

/// Takes entry ids out of this worker's run mark: sends of a run that passed
/// the gate together and were never attempted (nothing reached the
/// platform; a later attempt is no retry). The mark goes once it lists none.
/// KEYS: the runs hash. ARGV: worker, the run's mark, entry ids.
pub const UNGATE: &str = concat!(
    runs_lua!(),
    r#"
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
run_drop(KEYS[1], 'writing:' .. ARGV[1], ARGV[2], ids)
return 0
"#
);

/// Removes the marks of `worker`: of some deliveries (another worker's
/// stay), whole run marks, and single entries from run marks. KEYS: the
/// in-flight hash, the runs hash. ARGV: worker, N, N delivery keys, M, M run
/// marks, then (run mark, entry id) pairs, where run mark `*` is any of the
/// worker's (a taker knows whose run listed an entry, not which). Returns
/// how many fields went.
pub const CLEAR: &str = concat!(
    runs_lua!(),
    r#"
local me = ARGV[1]
local started, writing = 'started:' .. me, 'writing:' .. me
local n = tonumber(ARGV[2])
local gone = 0
if n > 0 then
  local fields, drop = {}, {}
  for i = 3, 2 + n do fields[#fields + 1] = ARGV[i] end
  local marks = redis.call('HMGET', KEYS[1], unpack(fields))
  for k = 1, n do
    if marks[k] == started or marks[k] == writing then drop[#drop + 1] = fields[k] end
  end
  if #drop > 0 then gone = gone + redis.call('HDEL', KEYS[1], unpack(drop)) end
end
local at = 3 + n
local m = tonumber(ARGV[at] or '0')
for i = at + 1, at + m do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v and string.sub(v, 1, #writing + 1) == writing .. '\n' then
    gone = gone + redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
local drops, order = {}, {}
for i = at + m + 1, #ARGV, 2 do
  if not drops[ARGV[i]] then
    drops[ARGV[i]] = {}
    order[#order + 1] = ARGV[i]
  end
  table.insert(drops[ARGV[i]], ARGV[i + 1])
end
for _, mark in ipairs(order) do
  if mark == '*' then
    for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
      run_drop(KEYS[2], writing, f, drops[mark])
    end
  else
    run_drop(KEYS[2], writing, mark, drops[mark])
  end
end
return gone
"#
);

/// Drops a mark whose entry is no longer pending in its group (acked, or
/// gone from the stream): no worker can send it any more, so the mark is a
/// leftover (a crash between the ack and the clear, a card dead-lettered by
/// a taker, an entry trimmed under a worker). A mark of a pending entry
/// stays. KEYS: the in-flight hash, the entry's stream. ARGV: delivery key,
/// group, entry id. Returns 1 when dropped.
pub const TRIM: &str = r#"
local ok, p = pcall(redis.call, 'XPENDING', KEYS[2], ARGV[2], ARGV[3], ARGV[3], 1)
if not ok or p[1] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"#;

/// [`TRIM`] for a run's mark: dropped once none of the entries it lists is
/// pending in its group (a run still under way lists pending entries, so it
/// stays). KEYS: the runs hash, the stream. ARGV: group, the run's mark.
/// Returns 1 when dropped.
pub const TRIM_RUN: &str = concat!(
    runs_lua!(),
    r#"
local v = redis.call('HGET', KEYS[1], ARGV[2])
if not v then return 0 end
local _, nl = run_owner(v)
if nl then
  for id in run_ids(v, nl) do
    local ok, p = pcall(redis.call, 'XPENDING', KEYS[2], ARGV[1], id, id, 1)
    if not ok or p[1] then return 0 end
  end
end
redis.call('HDEL', KEYS[1], ARGV[2])
return 1
"#
);

/// Moves one mark from the old per-bridge hash to its stream's hash, in one
/// step (an older worker still running cannot change it half-way). A mark
/// already in the new hash wins unless the old one says the send may have
/// reached the platform and the new one does not. KEYS: the old hash, the
/// new hash. ARGV: delivery key.
pub const MOVE: &str = r#"
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local sent = string.sub(v, 1, 8) ~= 'started:'
if not cur or (sent and string.sub(cur, 1, 8) == 'started:') then
  redis.call('HSET', KEYS[2], ARGV[1], v)
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"#;

/// The scripts' texts, for tests that run them against a real Redis on marks
/// laid out by hand: some of their paths are reached only under timings a
/// service cannot be steered into (a run listed between marking and the gate).
pub mod scripts {
    pub use super::{CLEAR, GATE, GATE_RUN, MARK, MARK_MANY, MOVE, TRIM, TRIM_RUN, UNGATE};
}

static MOVE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(MOVE));
static TRIM_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(TRIM));
static TRIM_RUN_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(TRIM_RUN));
static MARK_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(MARK));
static GATE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(GATE));
static CLEAR_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(CLEAR));
static MARK_MANY_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(MARK_MANY));
static GATE_RUN_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(GATE_RUN));
static UNGATE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(UNGATE));

/// A send waiting for its in-flight mark, taken with the rest of its batch
/// ([`OutboxService::flush_marks`]): one round trip a batch instead of one a
/// send, during which the loop did nothing else.
pub(super) struct Unmarked {
    /// Its `gate` is set once marked; its `retry` is what the gate starts from.
    pub(super) flight: Flight,
    pub(super) marking: Marking,
    /// Whether an earlier attempt may have left a mark: an entry read for the
    /// first time cannot have one (nobody else was ever handed it), so it
    /// skips marking and is known [`Prior::Unmarked`].
    pub(super) needs_mark: bool,
}

/// What a send waiting for its mark is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marking {
    /// An approval card: a taken-over mark means show it again.
    Card,
    /// A plain delivery, left to the worker that took it over. `current`:
    /// its destination is held for it already; otherwise it starts only if
    /// the destination is free, and waits behind it (marked) if not.
    Plain { current: bool },
}

/// What marking a delivery found before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Prior {
    /// No mark at all (a first attempt, or a mark lost with Redis's data).
    Unmarked,
    /// An attempt was marked and never passed its gate: nothing reached the platform.
    NotSent,
    /// This worker's own earlier attempt (before a restart) may have.
    MineMayHaveSent,
    /// Another worker's attempt may have, and it may still complete it.
    Taken(String),
    /// The entry is no longer this worker's (taken over): nothing to do.
    NotMine,
}

impl Prior {
    fn parse(previous: &str, me: &str) -> Prior {
        if previous.is_empty() {
            return Prior::Unmarked;
        }
        if previous.starts_with("started:") {
            return Prior::NotSent;
        }
        if previous == "not-mine" {
            return Prior::NotMine;
        }
        match previous.strip_prefix("writing:") {
            Some(w) if w == me => Prior::MineMayHaveSent,
            Some(w) => Prior::Taken(w.to_string()),
            // A mark of an older version (a time, left by a crash): an attempt
            // may have been made; a retry, as that version treated it.
            None => Prior::MineMayHaveSent,
        }
    }
}

/// Whether a send may go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Gate {
    /// Sent only if this worker's `started:` mark still stands.
    Mine(String),
    /// Another worker may still complete it: never sent again.
    Taken(String),
    /// An approval card another worker may have shown: shown again as a
    /// retry, since its absence cannot be proven and an approval nobody is
    /// asked about waits for nothing. Both cards answer the same approval.
    Repeat(String),
}

/// Where a flight's entry sits: what the gate checks it still holds.
#[derive(Debug, Clone)]
pub(super) struct Holder {
    pub(super) stream: String,
    pub(super) group: String,
    pub(super) consumer: String,
    pub(super) entry_id: String,
}

/// The gate of one flight, on its own connection (run inside the send task).
pub(super) async fn pass(
    conn: &mut crate::store::Conn,
    holder: &Holder,
    delivery_key: &str,
    worker: &str,
) -> std::result::Result<bool, SendError> {
    let passed: i64 = GATE_SCRIPT
        .key(keys::in_flight_marks(&holder.stream))
        .key(&holder.stream)
        .arg(delivery_key)
        .arg(worker)
        .arg(&holder.group)
        .arg(&holder.consumer)
        .arg(&holder.entry_id)
        .invoke_async(conn)
        .await
        .map_err(|e| SendError::Transient(format!("the send gate could not be checked: {e}")))?;
    Ok(passed == 1)
}

/// What the gate of a run said of one of its sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RunGate {
    /// Another worker holds it, or the entry is no longer this worker's.
    Refused,
    /// It may go; nothing was at the platform before.
    Passed,
    /// It may go, as the retry it already was (`writing:{me}` before, its
    /// own or moved there from an older run of this worker's): a run that
    /// does not attempt it leaves that mark.
    PassedAgain,
}

/// A delivery key's stream and entry id; one that is not a delivery key is a
/// bug here, not bad input.
fn split_delivery(delivery_key: &str) -> Result<(&str, &str)> {
    keys::split_delivery(delivery_key).ok_or_else(|| {
        Error::internal(format!(
            "`{delivery_key}` is not a delivery key (stream/entry)"
        ))
    })
}

/// A new run's mark: a field of its stream's runs hash
/// ([`keys::in_flight_runs`]), unique to this run.
pub(super) fn run_mark(worker: &str) -> String {
    format!("{worker}:{}", uuid::Uuid::new_v4().simple())
}

/// The runs whose marks this worker wrote and has not removed yet: which run
/// lists each of its sends, and how many of each run's sends are unsettled.
/// A run's mark goes with the mark of its last send (acked or cleared); one
/// forgotten here (an error, a fence) is a leftover the trim drops once
/// none of its entries is pending.
#[derive(Default)]
pub(super) struct RunMarks {
    of: HashMap<String, Arc<str>>,
    left: HashMap<Arc<str>, usize>,
}

/// What settling a send did to the mark of its run.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// It was in no run this worker knows of.
    Unlisted,
    /// Others of its run are unsettled: its entry comes out of the mark.
    Listed(Arc<str>),
    /// It was its run's last: the mark goes.
    Last(Arc<str>),
}

impl RunMarks {
    /// Notes the sends (delivery keys) a run's mark `mark` lists.
    pub fn listed(&mut self, mark: &str, delivery_keys: impl IntoIterator<Item = String>) {
        let mark: Arc<str> = mark.into();
        let mut n = 0;
        for key in delivery_keys {
            // A send is in one run at a time (it is scheduled once); were it
            // still in another, that one no longer waits for it.
            if let Some(old) = self.of.insert(key, mark.clone()) {
                self.release(&old);
            }
            n += 1;
        }
        if n > 0 {
            *self.left.entry(mark).or_default() += n;
        }
    }

    /// A send's mark goes: what that does to its run's.
    pub fn settle(&mut self, delivery_key: &str) -> Settled {
        let Some(run) = self.of.remove(delivery_key) else {
            return Settled::Unlisted;
        };
        match self.release(&run) {
            true => Settled::Last(run),
            false => Settled::Listed(run),
        }
    }

    /// One send of `run` fewer; whether it was the last.
    fn release(&mut self, run: &Arc<str>) -> bool {
        match self.left.get_mut(run) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.left.remove(run);
                true
            }
            None => false,
        }
    }
}

/// The marks of one stream's deliveries as a taker reads them, by delivery
/// key: a delivery's own `writing:` mark, else the `writing:` of a run that
/// lists it, else its own mark. `marks` and `runs` are the stream's marks
/// and runs hashes as stored ([`keys::in_flight_marks`],
/// [`keys::in_flight_runs`]); of two runs listing one entry, the first by
/// name counts here (the scripts prefer another worker's to their own).
pub fn marks_by_delivery(
    stream: &str,
    marks: &HashMap<String, String>,
    runs: &HashMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> =
        marks.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut listed: BTreeMap<String, &str> = BTreeMap::new();
    let runs: BTreeMap<&String, &String> = runs.iter().collect();
    for value in runs.values() {
        let Some((owner, ids)) = value
            .split_once('\n')
            .filter(|(owner, _)| owner.starts_with("writing:"))
        else {
            continue;
        };
        for id in ids.split_whitespace() {
            listed
                .entry(keys::delivery_key(stream, id))
                .or_insert(owner);
        }
    }
    for (key, owner) in listed {
        if out.get(&key).is_none_or(|v| !v.starts_with("writing:")) {
            out.insert(key, owner.to_string());
        }
    }
    out
}

/// The gate of a run of sends from one stream (`holder`'s, whose entry id
/// is not used), by entry id: what it said of each. Those it passed as
/// [`RunGate::Passed`] are listed in the new run mark `mark`.
pub(super) async fn pass_run(
    conn: &mut crate::store::Conn,
    holder: &Holder,
    mark: &str,
    ids: &[&str],
    worker: &str,
) -> std::result::Result<Vec<RunGate>, SendError> {
    let by_id = |id: &&&str| crate::store::id_order(id);
    let (Some(lowest), Some(highest)) =
        (ids.iter().min_by_key(by_id), ids.iter().max_by_key(by_id))
    else {
        return Ok(Vec::new());
    };
    let mut inv = GATE_RUN_SCRIPT.key(keys::in_flight_marks(&holder.stream));
    inv.key(&holder.stream)
        .key(keys::in_flight_runs(&holder.stream))
        .arg(worker)
        .arg(&holder.group)
        .arg(&holder.consumer)
        .arg(*lowest)
        .arg(*highest)
        .arg(mark)
        .arg(ids);
    let passed: Vec<i64> = inv
        .invoke_async(conn)
        .await
        .map_err(|e| SendError::Transient(format!("the send gate could not be checked: {e}")))?;
    Ok(passed
        .into_iter()
        .map(|p| match p {
            1 => RunGate::Passed,
            2 => RunGate::PassedAgain,
            _ => RunGate::Refused,
        })
        .collect())
}

/// Takes a run's sends that were never attempted out of its mark `mark`
/// (see [`UNGATE`]), by entry id.
pub(super) async fn ungate(
    conn: &mut crate::store::Conn,
    stream: &str,
    mark: &str,
    ids: &[&str],
    worker: &str,
) -> std::result::Result<(), SendError> {
    if ids.is_empty() {
        return Ok(());
    }
    let _: i64 = UNGATE_SCRIPT
        .key(keys::in_flight_runs(stream))
        .arg(worker)
        .arg(mark)
        .arg(ids)
        .invoke_async(conn)
        .await
        .map_err(|e| {
            SendError::Transient(format!("the run's unsent marks could not be reset: {e}"))
        })?;
    Ok(())
}

impl<S: Sender> OutboxService<S> {
    /// Marks a delivery this worker is about to send (entry `entry_id` of
    /// stream `stream`); returns what was there.
    pub(super) async fn mark_in_flight(
        &mut self,
        stream: &str,
        entry_id: &str,
        delivery_key: &str,
    ) -> Result<Prior> {
        let mut priors = self.mark_many(&[(stream, entry_id, delivery_key)]).await?;
        priors
            .pop()
            .ok_or_else(|| Error::internal("marking a delivery answered nothing"))
    }

    /// Marks deliveries `(stream, entry id, delivery key)` in one round trip.
    async fn mark_many(&mut self, marks: &[(&str, &str, &str)]) -> Result<Vec<Prior>> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        if let [(stream, entry_id, delivery_key)] = marks {
            let key = keys::in_flight_marks(stream);
            // Alone: EVALSHA, loading the script only when Redis lacks it
            // (a pipeline would send the whole script every time).
            let previous: String = MARK_SCRIPT
                .key(&key)
                .key(*stream)
                .key(keys::in_flight_runs(stream))
                .arg(*delivery_key)
                .arg(&self.worker)
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(*entry_id)
                .invoke_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("EVALSHA mark {key}"), e))?;
            return Ok(vec![Prior::parse(&previous, &self.worker)]);
        }
        // One script per stream for all its marks (its hash is in the
        // stream's slot), all in one pipeline; answers put back in order.
        let mut streams: Vec<&str> = Vec::new();
        for (stream, _, _) in marks {
            if !streams.contains(stream) {
                streams.push(stream);
            }
        }
        let invocations: Vec<_> = streams
            .iter()
            .map(|stream| {
                let mut inv = MARK_MANY_SCRIPT.key(keys::in_flight_marks(stream));
                inv.key(*stream)
                    .key(keys::in_flight_runs(stream))
                    .arg(&self.worker)
                    .arg(&self.group)
                    .arg(&self.consumer);
                for (s, entry_id, delivery_key) in marks {
                    if s == stream {
                        inv.arg(*delivery_key).arg(*entry_id);
                    }
                }
                inv
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&MARK_MANY_SCRIPT).ignore();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        let answers: Vec<Vec<String>> = pipe
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis("EVALSHA mark (in-flight marks)", e))?;
        let mut answers: Vec<std::vec::IntoIter<String>> =
            answers.into_iter().map(Vec::into_iter).collect();
        marks
            .iter()
            .map(|(stream, _, _)| {
                let at = streams.iter().position(|s| s == stream).unwrap_or(0);
                answers
                    .get_mut(at)
                    .and_then(Iterator::next)
                    .map(|p| Prior::parse(&p, &self.worker))
                    .ok_or_else(|| Error::internal("marking a batch answered too little"))
            })
            .collect()
    }

    /// Takes the marks of the sends queued since the last call, together,
    /// and starts each as its mark allows (see [`Unmarked`]).
    pub(super) async fn flush_marks(&mut self) -> Result<()> {
        // Releasing a destination can queue the next send to it: go on
        // until none is left.
        while !self.mem.to_mark.is_empty() {
            let queued = std::mem::take(&mut self.mem.to_mark);
            let streams: Vec<String> = queued
                .iter()
                .map(|u| self.sources[u.flight.source].key.clone())
                .collect();
            let marks: Vec<(&str, &str, &str)> = queued
                .iter()
                .zip(&streams)
                .filter(|(u, _)| u.needs_mark)
                .map(|(u, stream)| {
                    let f = &u.flight;
                    (stream.as_str(), f.entry.id.as_str(), f.key.as_str())
                })
                .collect();
            let priors = match self.mark_many(&marks).await {
                Ok(p) => {
                    let mut found = p.into_iter();
                    queued
                        .iter()
                        .map(|u| match u.needs_mark {
                            true => found.next().unwrap_or(Prior::NotMine),
                            false => Prior::Unmarked,
                        })
                        .collect::<Vec<_>>()
                }
                Err(e) => {
                    // Kept (a resumed one holds its destination): the error's
                    // drain marks them again, or forgets them with the holds.
                    drop(marks);
                    self.mem.to_mark = queued;
                    return Err(e);
                }
            };
            let mut cards = Vec::new();
            for (u, prior) in queued.into_iter().zip(priors) {
                cards.extend(self.start_marked(u, prior).await?);
            }
            self.launch_cards(cards);
        }
        Ok(())
    }

    /// Starts a marked send, or returns a card to start with the others of
    /// its batch ([`OutboxService::launch_cards`]).
    async fn start_marked(&mut self, u: Unmarked, prior: Prior) -> Result<Option<Flight>> {
        let mut flight = u.flight;
        let channel = flight.message.channel_id.clone();
        let u_retry = flight.retry;
        if prior == Prior::NotMine {
            if let Purpose::Notification { record, .. } = &flight.purpose {
                tracing::warn!(approval = %record.id, "card not shown: the notification was taken over by another worker");
                self.mem.sched.end(&flight.key);
                return Ok(None);
            }
            tracing::warn!(entry = %flight.entry.id, "not sent: the entry was taken over by another worker");
            // The taker delivers it; what waited behind it here goes on.
            if let Marking::Plain { current: true } = u.marking {
                self.start_next(&channel).await?;
            }
            return Ok(None);
        }
        (flight.gate, flight.retry) = match prior {
            // Another worker may have shown it and may still: a card cannot be
            // proven absent, and an unasked approval helps nobody, so it is
            // shown again (a retry, deduplicated where the sender can). Two
            // cards of one approval answer the same approval.
            Prior::Taken(by) if u.marking == Marking::Card => (Gate::Repeat(by), true),
            prior => self.gate_for(prior, flight.retry),
        };
        match u.marking {
            // Shown beside the loop; scheduled until its outcome is recorded.
            Marking::Card if self.runs_cards() && flight.runs() => return Ok(Some(flight)),
            Marking::Card => self.dispatch(flight),
            Marking::Plain { current: true } => self.take_off(flight),
            Marking::Plain { current: false } if self.mem.sched.is_busy(&channel) => {
                // Behind an earlier delivery to the same destination, in
                // flight or waiting for a retry: order per destination is
                // kept. Its own mark waits with it, so it starts without
                // another round trip; one another worker may still complete
                // waits unmarked and is asked again when its turn comes.
                let (key, lane) = (flight.key.clone(), flight.lane());
                let job = match flight.gate {
                    Gate::Mine(_) => Job::Flight(Box::new(flight)),
                    _ => flight.into_job(u_retry),
                };
                self.mem.sched.queue_behind(&channel, &lane, key, job);
            }
            Marking::Plain { current: false } => {
                self.mem.sched.hold(&channel);
                self.take_off(flight);
            }
        }
        Ok(None)
    }

    /// Drops the marks left behind for entries no longer pending (see
    /// [`TRIM`]), so the marks hashes do not grow with every crash.
    /// Returns how many went.
    pub(super) async fn trim_marks(&mut self) -> Result<usize> {
        // Only outbox streams carry deliveries (decisions are never sent).
        let streams: Vec<String> = self
            .sources
            .iter()
            .filter(|s| matches!(s.kind, Kind::Flat | Kind::Agent))
            .map(|s| s.key.clone())
            .collect();
        let mut dropped = 0;
        for stream in &streams {
            // Runs' marks: one under way lists pending entries, so it stays.
            let key = keys::in_flight_runs(stream);
            let runs: Vec<String> = self
                .store
                .conn
                .hkeys(&key)
                .await
                .map_err(|e| Error::from_redis(&format!("HKEYS {key}"), e))?;
            for run in runs {
                let n: i64 = TRIM_RUN_SCRIPT
                    .key(&key)
                    .key(stream)
                    .arg(&self.group)
                    .arg(&run)
                    .invoke_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis(&format!("EVALSHA trim {key}"), e))?;
                dropped += n as usize;
            }
            let key = keys::in_flight_marks(stream);
            let marks: Vec<String> = self
                .store
                .conn
                .hkeys(&key)
                .await
                .map_err(|e| Error::from_redis(&format!("HKEYS {key}"), e))?;
            for mark in marks {
                let Some((of, entry_id)) = keys::split_delivery(&mark) else {
                    continue;
                };
                // Waiting behind its destination, marked: pending, so kept;
                // not asked about one round trip at a time.
                if of != stream || self.mem.sched.is_scheduled(&mark) {
                    continue;
                }
                let n: i64 = TRIM_SCRIPT
                    .key(&key)
                    .key(stream)
                    .arg(&mark)
                    .arg(&self.group)
                    .arg(entry_id)
                    .invoke_async(&mut self.store.conn)
                    .await
                    .map_err(|e| Error::from_redis(&format!("EVALSHA trim {key}"), e))?;
                dropped += n as usize;
            }
        }
        if dropped > 0 {
            tracing::info!(
                dropped,
                "in-flight marks of entries no longer pending dropped"
            );
        }
        Ok(dropped)
    }

    /// Removes this worker's marks of `delivery_keys` (one script a stream):
    /// their own, and their entries from the marks of the runs that listed
    /// them (a run's mark goes with its last send's).
    pub(super) async fn clear_in_flight(&mut self, delivery_keys: &[&str]) -> Result<()> {
        self.clear_marks(delivery_keys, false).await
    }

    /// [`Self::clear_in_flight`] for entries acked already: no one can send
    /// them any more, so their runs' marks need not be rewritten without
    /// them (a run's mark still goes with its last send's).
    pub(super) async fn clear_acked_in_flight(&mut self, delivery_keys: &[&str]) -> Result<()> {
        self.clear_marks(delivery_keys, true).await
    }

    async fn clear_marks(&mut self, delivery_keys: &[&str], acked: bool) -> Result<()> {
        #[derive(Default)]
        struct Clear<'a> {
            keys: Vec<&'a str>,
            runs_gone: Vec<Arc<str>>,
            from_runs: Vec<(Arc<str>, &'a str)>,
        }
        let mut by_stream: Vec<(&str, Clear)> = Vec::new();
        for key in delivery_keys {
            let (stream, entry_id) = split_delivery(key)?;
            let at = match by_stream.iter().position(|(s, _)| *s == stream) {
                Some(at) => at,
                None => {
                    by_stream.push((stream, Clear::default()));
                    by_stream.len() - 1
                }
            };
            let clear = &mut by_stream[at].1;
            clear.keys.push(key);
            match self.mem.runs.settle(key) {
                Settled::Unlisted => {}
                Settled::Listed(_) if acked => {}
                Settled::Listed(run) => clear.from_runs.push((run, entry_id)),
                Settled::Last(run) => clear.runs_gone.push(run),
            }
        }
        for (stream, clear) in by_stream {
            let key = keys::in_flight_marks(stream);
            let mut inv = CLEAR_SCRIPT.key(&key);
            inv.key(keys::in_flight_runs(stream))
                .arg(&self.worker)
                .arg(clear.keys.len())
                .arg(&clear.keys)
                .arg(clear.runs_gone.len());
            for run in &clear.runs_gone {
                inv.arg(&**run);
            }
            for (run, entry_id) in &clear.from_runs {
                inv.arg(&**run).arg(*entry_id);
            }
            let _: i64 = inv
                .invoke_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("EVALSHA clear {key}"), e))?;
        }
        Ok(())
    }

    /// The run marks that go with the acks of `delivery_keys` (their runs'
    /// last unsettled sends): removed in the same round trip as the acks.
    pub(super) fn runs_acked<'a>(
        &mut self,
        delivery_keys: impl IntoIterator<Item = &'a str>,
    ) -> Vec<Arc<str>> {
        delivery_keys
            .into_iter()
            .filter_map(|key| match self.mem.runs.settle(key) {
                Settled::Last(run) => Some(run),
                // An acked entry is no one's to send: the rest of its run's
                // mark may still list it.
                Settled::Listed(_) | Settled::Unlisted => None,
            })
            .collect()
    }

    /// Moves the marks an earlier version kept in one hash per bridge
    /// ([`keys::legacy_in_flight`]) beside their streams, before this worker
    /// reads anything: a `writing:` mark must still be found, or a send that
    /// may have reached the platform would be made again. Each mark moves in
    /// one script ([`MOVE`]), so a crash half-way only leaves work for the
    /// next start. Marks of streams this bridge no longer reads stay where
    /// they are (nothing can send them; the service may not touch their
    /// streams' hashes). Only one server ever held the old layout.
    pub(super) async fn move_legacy_marks(&mut self) -> Result<()> {
        let old = keys::legacy_in_flight(&self.name);
        let marks: Vec<String> = self
            .store
            .conn
            .hkeys(&old)
            .await
            .map_err(|e| Error::from_redis(&format!("HKEYS {old}"), e))?;
        let mut moved = 0;
        for delivery_key in &marks {
            let Some(stream) = keys::stream_of_delivery(delivery_key) else {
                continue;
            };
            let read = self
                .sources
                .iter()
                .any(|s| s.key == stream && matches!(s.kind, Kind::Flat | Kind::Agent));
            let new = keys::in_flight_marks(stream);
            if !read || !self.store.conn.same_slot(&old, &new) {
                continue;
            }
            let _: i64 = MOVE_SCRIPT
                .key(&old)
                .key(&new)
                .arg(delivery_key)
                .invoke_async(&mut self.store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("EVALSHA move {old}"), e))?;
            moved += 1;
        }
        if moved > 0 {
            tracing::info!(bridge = %self.name, moved, "in-flight marks moved beside their streams");
        }
        Ok(())
    }

    /// Removes another worker's mark of a delivery this worker took over, once
    /// its outcome is recorded, and takes its entry out of that worker's
    /// runs' marks (the other's gate was passed already, so it only ever
    /// clears its own).
    pub(super) async fn forget_taken_mark(
        &mut self,
        gate: &Gate,
        delivery_key: &str,
    ) -> Result<()> {
        let (Gate::Taken(by) | Gate::Repeat(by)) = gate else {
            return Ok(());
        };
        // Only the mark it saw: anything written since is someone's news.
        let (stream, entry_id) = split_delivery(delivery_key)?;
        let key = keys::in_flight_marks(stream);
        let _: i64 = CLEAR_SCRIPT
            .key(&key)
            .key(keys::in_flight_runs(stream))
            .arg(by)
            .arg(1)
            .arg(delivery_key)
            .arg(0)
            .arg("*")
            .arg(entry_id)
            .invoke_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("EVALSHA clear {key}"), e))?;
        Ok(())
    }

    /// The gate and `retry` of a delivery from what marking it found: a send a
    /// previous attempt may have made is a retry (the sender deduplicates or
    /// reports it uncertain); one another worker may still make is not sent.
    /// `unmarked_retry` is what to assume when no mark was found.
    pub(super) fn gate_for(&self, prior: Prior, unmarked_retry: bool) -> (Gate, bool) {
        match prior {
            Prior::Unmarked => (Gate::Mine(self.worker.clone()), unmarked_retry),
            // Deduplicating senders are told of every re-delivery anyway.
            Prior::NotSent => (
                Gate::Mine(self.worker.clone()),
                unmarked_retry && S::DEDUPLICATES,
            ),
            Prior::MineMayHaveSent => (Gate::Mine(self.worker.clone()), true),
            Prior::Taken(by) => (Gate::Taken(by), true),
            // Never dispatched: callers stop at `NotMine`.
            Prior::NotMine => (Gate::Taken("another worker".into()), true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{marks_by_delivery, Prior, RunMarks, Settled};
    use std::collections::HashMap;

    #[test]
    fn a_runs_mark_goes_with_its_last_send() {
        let mut runs = RunMarks::default();
        runs.listed("a:1", ["s/1-0".to_string(), "s/2-0".to_string()]);
        assert_eq!(runs.settle("s/9-0"), Settled::Unlisted);
        assert_eq!(runs.settle("s/1-0"), Settled::Listed("a:1".into()));
        assert_eq!(runs.settle("s/1-0"), Settled::Unlisted, "settled once");
        assert_eq!(runs.settle("s/2-0"), Settled::Last("a:1".into()));
        assert_eq!(runs.settle("s/2-0"), Settled::Unlisted);
    }

    #[test]
    fn a_send_listed_again_no_longer_holds_its_old_run() {
        let mut runs = RunMarks::default();
        runs.listed("a:1", ["s/1-0".to_string(), "s/2-0".to_string()]);
        runs.listed("a:2", ["s/2-0".to_string()]);
        assert_eq!(runs.settle("s/1-0"), Settled::Last("a:1".into()));
        assert_eq!(runs.settle("s/2-0"), Settled::Last("a:2".into()));
        runs.listed("a:3", Vec::new());
        runs.listed("a:4", ["s/3-0".to_string()]);
        assert_eq!(runs.settle("s/3-0"), Settled::Last("a:4".into()));
    }

    #[test]
    fn a_taker_reads_a_runs_mark_as_each_sends_own() {
        let hash = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let marks = hash(&[
            ("s/1-0", "started:a"),
            ("s/2-0", "writing:b"),
            ("s/4-0", "started:a"),
            ("s/5-0", "1796170000"),
        ]);
        let runs = hash(&[
            ("a:x", "writing:a\n 1-0 2-0 3-0 5-0 "),
            ("z:y", "started:z\n 4-0 "),
        ]);
        let seen = marks_by_delivery("s", &marks, &runs);
        let want: Vec<(&str, &str)> = vec![
            ("s/1-0", "writing:a"),
            ("s/2-0", "writing:b"),
            ("s/3-0", "writing:a"),
            ("s/4-0", "started:a"),
            ("s/5-0", "writing:a"),
        ];
        let seen: Vec<(&str, &str)> = seen.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn what_a_mark_says_about_earlier_attempts() {
        assert_eq!(Prior::parse("", "a"), Prior::Unmarked);
        assert_eq!(Prior::parse("started:b", "a"), Prior::NotSent);
        assert_eq!(Prior::parse("writing:a", "a"), Prior::MineMayHaveSent);
        assert_eq!(Prior::parse("writing:b", "a"), Prior::Taken("b".into()));
        assert_eq!(Prior::parse("1796170000", "a"), Prior::MineMayHaveSent);
        assert_eq!(Prior::parse("not-mine", "a"), Prior::NotMine);
    }
}
