//! The audit trail: what happened to every approval and gated delivery, kept
//! after the records are gone, so "who approved this message to that address,
//! when, and was it exactly what went out?" has an answer.
//!
//! One stream per requesting bridge, `{bridge}:audit` ([`keys::audit`]). Each
//! entry is one event ([`Kind`]) of one approval, with the fields of [`field`].
//!
//! Invariants:
//! - Append only. Services may run `XADD` (through the [`APPEND`] script) on
//!   the streams they write and no other command on them (no reads, trims or
//!   deletes; `EVAL` needs whole key rights, so the commands are the limit);
//!   agents hold nothing on them. The operator and the web page read them.
//! - Nothing is removed with a record. The one removal is the trim by `MINID`
//!   that every append carries: entries more than `audit.retention_days` older
//!   than the appended event go.
//! - An event is appended after the step it records took effect, so a crash
//!   between the two can lose a line but never records a step that did not
//!   happen.
//! - Field names are spelled here only, and values are plain text: agent text
//!   in them (a reason, a destination) is shown through `display_safe`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::approval::display_safe;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::keys;
use crate::store::Store;

/// The field names of an audit entry.
pub mod field {
    pub const EVENT: &str = "event";
    pub const APPROVAL_ID: &str = "approval_id";
    /// Unix seconds (fractional) by the clock of the process that appended it.
    pub const AT: &str = "at";
    pub const AGENT: &str = "agent";
    /// Who answered, edited or reconciled (a qualified identity).
    pub const BY: &str = "by";
    pub const VERDICT: &str = "verdict";
    pub const REASON: &str = "reason";
    /// Why an answer was ignored.
    pub const WHY: &str = "why";
    /// The whole-message digest the event concerns.
    pub const DIGEST: &str = "digest";
    /// An edit's digest before it.
    pub const OLD_DIGEST: &str = "old_digest";
    pub const DESTINATION: &str = "destination";
    pub const STREAM: &str = "stream";
    pub const ENTRY_ID: &str = "entry_id";
    pub const NOTIFY: &str = "notify";
    pub const EXTERNAL_ID: &str = "external_id";
    pub const OUTCOME: &str = "outcome";
    pub const EVIDENCE: &str = "evidence";
    /// Approvals counted so far, as `have/need`.
    pub const COUNT: &str = "count";
    /// The escalation steps taken when an approval was decided (0: none).
    pub const STEP: &str = "step";
    /// An uncertain delivery's id (see [`crate::deliveries`]).
    pub const DELIVERY: &str = "delivery";
    /// Seconds from parking to the decision.
    pub const WAITED: &str = "waited";
    /// The approval a reconciled delivery was put back as.
    pub const NEXT_APPROVAL: &str = "next_approval";
    /// The person an answer counted for, as their delegate.
    pub const FOR: &str = "for";
    /// A delegation's delegate (a person) and its end (unix seconds; 0: ended).
    pub const DELEGATE: &str = "delegate";
    pub const UNTIL: &str = "until";
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Parked for approval: agent, stream, entry, destination, digest.
    Parked,
    /// Shown on the notify bridge: notify, external id.
    Notified,
    /// An answer that counted: by, verdict, reason, count.
    Answered,
    /// An answer that changed nothing: by, verdict, why.
    Ignored,
    /// Edited by an approver: by, old digest, digest, destination.
    Edited,
    /// The record's status changed: verdict, by (every approver), reason.
    Decided,
    /// No decision in time.
    Expired,
    /// Sent: external id, digest.
    Delivered,
    /// Not sent: reason.
    Failed,
    /// Maybe sent, no answer from the platform: reason, delivery.
    Uncertain,
    /// An uncertain delivery settled by an operator: outcome, evidence, by.
    Reconciled,
    /// An approver's answers handed to a delegate until a time (or taken
    /// back): by, delegate, until. No approval id.
    Delegated,
    /// The deadline moved by an approver's "later": by, until, reason.
    Snoozed,
    /// The approvers reminded on the card's surface (`approval.remind_after`).
    Reminded,
    /// One surface of several could not show its card (the others are
    /// asked still): notify, reason.
    Unshown,
    /// A step of the escalation ladder taken: count (the step), notify (its
    /// surface), after (its seconds since parking).
    Escalated,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Parked => "parked",
            Kind::Notified => "notified",
            Kind::Answered => "answered",
            Kind::Ignored => "ignored",
            Kind::Edited => "edited",
            Kind::Decided => "decided",
            Kind::Expired => "expired",
            Kind::Delivered => "delivered",
            Kind::Failed => "failed",
            Kind::Uncertain => "uncertain",
            Kind::Reconciled => "reconciled",
            Kind::Delegated => "delegated",
            Kind::Snoozed => "snoozed",
            Kind::Reminded => "reminded",
            Kind::Unshown => "unshown",
            Kind::Escalated => "escalated",
        }
    }
}

/// One event to append to a bridge's trail.
#[derive(Debug, Clone)]
pub struct Event {
    /// The requesting bridge, whose trail this goes to.
    pub bridge: String,
    pub kind: Kind,
    /// Empty for a delivery that had no approval (see [`field::DELIVERY`]).
    pub approval_id: String,
    pub at: f64,
    pub fields: Vec<(&'static str, String)>,
}

impl Event {
    pub fn new(bridge: &str, kind: Kind, approval_id: &str, at: f64) -> Event {
        Event {
            bridge: bridge.to_string(),
            kind,
            approval_id: approval_id.to_string(),
            at,
            fields: Vec::new(),
        }
    }

    /// Adds a field; an empty value is left out.
    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Event {
        let value = value.into();
        if !value.is_empty() {
            self.fields.push((name, value));
        }
        self
    }

    /// Adds a field when there is a value.
    pub fn with_opt(self, name: &'static str, value: Option<&str>) -> Event {
        match value {
            Some(v) => self.with(name, v),
            None => self,
        }
    }

    /// Queues the append (with its trim) on `pipe`, after `pipe` loads
    /// [`APPEND`] (see [`prepare`]).
    pub fn add_to(&self, pipe: &mut redis::Pipeline, retention_days: u64) {
        add_all_to(pipe, std::slice::from_ref(self), retention_days);
    }

    /// This event as [`APPEND`] takes it: the trim's cutoff (ms), its time
    /// (ms), the number of field names and values, then they.
    fn args(&self, inv: &mut redis::ScriptInvocation, retention_days: u64) {
        let cutoff_ms = (self.at - (retention_days * 86_400) as f64).max(0.0) * 1000.0;
        inv.arg(cutoff_ms as u64)
            .arg((self.at.max(0.0) * 1000.0) as u64)
            .arg(6 + 2 * self.fields.len())
            .arg(field::EVENT)
            .arg(self.kind.as_str())
            .arg(field::APPROVAL_ID)
            .arg(&self.approval_id)
            .arg(field::AT)
            .arg(format!("{:.3}", self.at));
        for (k, v) in &self.fields {
            inv.arg(*k).arg(v);
        }
    }
}

/// Queues the appends of `events`, in order, on `pipe` (after [`prepare`]):
/// one script call for each run of events on the same trail, not one each.
pub fn add_all_to(pipe: &mut redis::Pipeline, events: &[Event], retention_days: u64) {
    for run in events.chunk_by(|a, b| a.bridge == b.bridge) {
        let mut inv = APPEND_SCRIPT.key(keys::audit(&run[0].bridge));
        for e in run {
            e.args(&mut inv, retention_days);
        }
        pipe.invoke_script(&inv).ignore();
    }
}

/// Appends entries, each its id the event's time (so the trail reads in
/// time order and `--since` is a range), trimming by `MINID` (exact, not
/// `~`, so what is kept is what the retention says). An event stamped before
/// the stream's last entry (another host's clock ahead of this one) gets the
/// server's time instead; a stream that takes neither loses the line rather
/// than failing the step it records. ARGV, for each entry in turn: the
/// trim's cutoff (ms), the event's time (ms), the number of field names and
/// values, then they.
const APPEND: &str = r#"
local i = 1
while i <= #ARGV do
  local cutoff, at, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  -- The fields straight from ARGV: a table built for them cost a tenth
  -- of the script.
  local first, last = i + 3, i + 2 + n
  local ok = redis.pcall('XADD', KEYS[1], 'MINID', cutoff, at .. '-*', unpack(ARGV, first, last))
  if type(ok) == 'table' and ok.err then
    -- A stream that takes no entry (someone gave it the largest id) loses
    -- this line rather than stopping the step it records.
    redis.pcall('XADD', KEYS[1], 'MINID', cutoff, '*', unpack(ARGV, first, last))
  end
  i = i + 3 + n
end
return 1
"#;

static APPEND_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(APPEND));

/// Makes `pipe` able to carry appends: loads [`APPEND`] first (cheap when
/// loaded already), so `EVALSHA` cannot meet an empty script cache.
pub fn prepare(pipe: &mut redis::Pipeline) {
    pipe.load_script(&APPEND_SCRIPT).ignore();
}

/// Appends events, in order, in one round trip.
pub async fn append(store: &mut Store, config: &Config, events: &[Event]) -> Result<()> {
    append_then(store, config, events, None).await
}

/// Appends events, in order, then runs `then` (a wake-up), all in one
/// round trip: `then` runs after the events are appended, and even if Redis
/// refused an append (the step they record happened). On a Cluster the
/// two go to their own nodes, `then` after the appends' answer.
pub async fn append_then(
    store: &mut Store,
    config: &Config,
    events: &[Event],
    then: Option<redis::Cmd>,
) -> Result<()> {
    if events.is_empty() && then.is_none() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    if !events.is_empty() {
        prepare(&mut pipe);
        add_all_to(&mut pipe, events, config.audit.retention_days);
    }
    let what = match then {
        Some(cmd) => {
            pipe.add_command(cmd).ignore();
            "XADD audit, then XADD the wake-up"
        }
        None => "XADD audit",
    };
    pipe.query_async::<()>(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(what, e))
}

/// An entry read back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entry {
    /// The stream entry id.
    pub id: String,
    pub bridge: String,
    pub event: String,
    pub approval_id: String,
    pub at: f64,
    /// Every other field.
    pub fields: BTreeMap<String, String>,
}

impl Entry {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Which entries `cowboy audit` shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// An approval id, or the start of one.
    pub approval: Option<String>,
    pub agent: Option<String>,
    pub bridge: Option<String>,
    /// Unix seconds: only events at or after.
    pub since: Option<f64>,
}

impl Filter {
    fn keeps(&self, e: &Entry) -> bool {
        self.approval
            .as_ref()
            .is_none_or(|a| !a.is_empty() && e.approval_id.starts_with(a.as_str()))
            && self.since.is_none_or(|since| e.at >= since)
    }
}

/// The entries of the bridges' trails that pass `filter`, oldest first. An
/// agent filter keeps the whole history of every approval that agent asked for
/// (the agent is named in the `parked` event only).
pub async fn query(store: &mut Store, config: &Config, filter: &Filter) -> Result<Vec<Entry>> {
    let mut all = Vec::new();
    for bridge in config.bridges.keys() {
        if filter.bridge.as_ref().is_some_and(|b| b != bridge) {
            continue;
        }
        all.extend(read(store, bridge, filter.since).await?);
    }
    if let Some(agent) = &filter.agent {
        let theirs: std::collections::HashSet<String> = all
            .iter()
            .filter(|e| e.get(field::AGENT) == Some(agent.as_str()) && !e.approval_id.is_empty())
            .map(|e| e.approval_id.clone())
            .collect();
        // Events of deliveries without approval name their agent themselves.
        all.retain(|e| match e.approval_id.is_empty() {
            true => e.get(field::AGENT) == Some(agent.as_str()),
            false => theirs.contains(&e.approval_id),
        });
    }
    all.retain(|e| filter.keeps(e));
    all.sort_by(|a, b| a.at.total_cmp(&b.at).then_with(|| a.id.cmp(&b.id)));
    Ok(all)
}

/// The history of one approval on its requesting bridge's trail, from
/// `since` (its record's `created_at`: nothing of it is older), read as a
/// range of the trail, not all of it.
pub async fn history(
    store: &mut Store,
    bridge: &str,
    approval_id: &str,
    since: Option<f64>,
) -> Result<Vec<Entry>> {
    let mut all = read(store, bridge, since).await?;
    all.retain(|e| e.approval_id == approval_id);
    Ok(all)
}

/// A trail, from `since` (by entry id, which is the event's time).
async fn read(store: &mut Store, bridge: &str, since: Option<f64>) -> Result<Vec<Entry>> {
    let key = keys::audit(bridge);
    // A minute early: the appending process's clock and the server's may differ.
    let start = match since {
        Some(s) => format!("{}", ((s - 60.0).max(0.0) * 1000.0) as u64),
        None => "-".to_string(),
    };
    let raw: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg(start)
        .arg("+")
        .query_async(&mut store.conn)
        .await
        .map_err(|e| Error::from_redis(&format!("XRANGE {key}"), e))?;
    Ok(raw
        .into_iter()
        .map(|(id, pairs)| {
            let mut fields: BTreeMap<String, String> = pairs.into_iter().collect();
            let event = fields.remove(field::EVENT).unwrap_or_default();
            let approval_id = fields.remove(field::APPROVAL_ID).unwrap_or_default();
            let at = fields
                .remove(field::AT)
                .and_then(|t| t.parse().ok())
                .unwrap_or(0.0);
            Entry {
                id,
                bridge: bridge.to_string(),
                event,
                approval_id,
                at,
                fields,
            }
        })
        .collect())
}

/// Entries as text (one line each) or JSON lines.
pub fn render(entries: &[Entry], json: bool) -> String {
    let mut out = String::new();
    for e in entries {
        if json {
            let line = serde_json::to_string(e).unwrap_or_default();
            let _ = writeln!(out, "{line}");
            continue;
        }
        let details: Vec<String> = e
            .fields
            .iter()
            .map(|(k, v)| format!("{k}={}", quoted(v)))
            .collect();
        let _ = writeln!(
            out,
            "{}  {:<8} {}  {:<10} {}",
            crate::clock::utc(e.at),
            e.bridge,
            if e.approval_id.is_empty() {
                "-"
            } else {
                &e.approval_id
            },
            e.event,
            details.join(" ")
        );
    }
    out
}

/// A value as one safe token: bare when plain, else quoted with escapes.
fn quoted(v: &str) -> String {
    let plain = v
        .chars()
        .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\');
    if plain {
        v.to_string()
    } else {
        format!("{:?}", display_safe(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_could_fake_a_line_are_quoted() {
        assert_eq!(quoted("discord:42"), "discord:42");
        assert_eq!(quoted("a b\nevent=delivered"), "\"a b\\nevent=delivered\"");
    }

    #[test]
    fn an_empty_approval_filter_matches_nothing() {
        let e = Entry {
            id: "1-0".into(),
            bridge: "b".into(),
            event: "parked".into(),
            approval_id: "abc".into(),
            at: 5.0,
            fields: BTreeMap::new(),
        };
        let f = |approval: &str| Filter {
            approval: Some(approval.into()),
            ..Filter::default()
        };
        assert!(f("ab").keeps(&e));
        assert!(!f("").keeps(&e));
        assert!(!f("x").keeps(&e));
    }
}
