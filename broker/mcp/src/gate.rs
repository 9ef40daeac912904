//! What the tools do in Redis, as the agent's own ACL user.
//!
//! Invariants:
//! - The connection authenticates as Redis user `agent` (with its password
//!   file; nothing else is tried): whatever a tool does, the agent's ACL
//!   allows, so this server is never a way around the gate.
//! - A send is validated before anything is written, with the broker's own
//!   checks (`Message::from_entry`, then the approval channels) and so in
//!   their words; the one write is a single `XADD`, so a refused or
//!   interrupted send leaves nothing half-written. The bridge checks again:
//!   it alone knows its platform's spelling of a destination.
//! - A request id is sent once: one this server wrote, or one a notice on the
//!   bridge's inbox names, is refused (a retried call never delivers twice).
//! - `status` and `wait` read inboxes without a group (`XRANGE`), in pages
//!   of [`PAGE`] entries: a flood of inbound messages costs time, never
//!   Redis memory, and never hides the notices about an entry this server
//!   wrote (read from its entry id on). An outcome once seen is remembered,
//!   so retention trimming its notice does not turn it back into `queued`.
//! - `inbox` hands each entry out at least once: only what is returned is
//!   acknowledged, and what was read but not returned (over the size budget,
//!   or an acknowledgement that failed) is handed out again first.
//! - At most [`MAX_READERS`] calls that read Redis run at once.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use broker::config::Config;
use broker::entry::Message;
use broker::error::ConfigError;
use broker::store::{Entry, Store};
use broker::{keys, Error};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::status::{self, Fields};

/// Entries read per round trip when inboxes are searched.
const PAGE: usize = 100;
/// Newest entries searched per inbox for a request this server did not write.
const SEARCHED: usize = 2000;
/// Longest `wait` (clients' tool calls time out after about a minute).
pub const MAX_WAIT_SECONDS: u64 = 50;
/// Most inbox entries one `inbox` call returns.
pub const MAX_INBOX: usize = 100;
/// Most bytes of entries one `inbox` answer carries (hosts truncate large
/// tool results); what does not fit comes with the next call.
const INBOX_BYTES: usize = 256 * 1024;
/// The consumer name `inbox` reads the agent's group as.
const CONSUMER: &str = "mcp";
/// Calls that read Redis (`status`, `wait`, `inbox`) under way at once: a
/// client calling them in a loop must not take Redis's memory or connections.
pub const MAX_READERS: usize = 8;

/// A refusal the client is told as a tool error.
#[derive(Debug)]
pub struct Refused(pub String);

impl From<Error> for Refused {
    fn from(e: Error) -> Refused {
        // The agent must tell "try again" from "never".
        match e.is_retriable() {
            true => Refused(format!("Redis is unavailable for now, try again: {e}")),
            false => Refused(e.to_string()),
        }
    }
}

/// A request this server wrote.
#[derive(Debug, Clone)]
struct Written {
    bridge: String,
    /// Its entry id; `None` when the write's answer was lost.
    entry_id: Option<String>,
    /// Its outcome once seen (see the module invariants).
    outcome: Option<Value>,
}

/// What `send` is given.
#[derive(Debug, Default)]
pub struct Request {
    pub bridge: String,
    pub destination: String,
    pub content: String,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    pub request_id: Option<String>,
}

/// One agent's way to its streams.
pub struct Gate {
    agent: String,
    config: Config,
    store: Store,
    /// Request ids this server wrote, with their bridge (so `status` can say
    /// `queued` rather than `unknown`, and `wait` knows which inbox to watch).
    written: Mutex<HashMap<String, Written>>,
    /// Permits for [`MAX_READERS`].
    readers: tokio::sync::Semaphore,
}

impl Gate {
    /// Connects as the agent's own Redis user: `[agents.NAME] password_file`
    /// is required, and the server must confirm the user (the ACL is loaded).
    pub async fn connect(config: Config, agent: &str) -> broker::Result<Gate> {
        let key = format!("agents.{agent}");
        let a = config.agents.get(agent).ok_or_else(|| {
            ConfigError::invalid(
                &key,
                format!(
                    "no agent `{agent}` in the config (known: {})",
                    config.agent_names().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let file = a.password_file.clone().ok_or_else(|| {
            ConfigError::invalid(
                format!("{key}.password_file"),
                "cowboy mcp connects as the agent's own Redis user and needs its password file",
            )
        })?;
        let redis = broker::config::RedisConfig {
            username: Some(agent.to_string()),
            password_file: Some(file),
            ..config.redis.clone()
        };
        // Authenticated as `agent` or refused: a server without that ACL
        // user answers WRONGPASS.
        let store = Store::connect(&redis).await?;
        Ok(Gate {
            agent: agent.to_string(),
            config,
            store,
            written: Mutex::new(HashMap::new()),
            readers: tokio::sync::Semaphore::new(MAX_READERS),
        })
    }

    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// One of the [`MAX_READERS`] permits, or a refusal saying why.
    fn reader(&self) -> Result<tokio::sync::SemaphorePermit<'_>, Refused> {
        self.readers.try_acquire().map_err(|_| {
            Refused(format!(
                "{MAX_READERS} status, wait or inbox calls are under way already; call again when one returns"
            ))
        })
    }

    /// Validates and writes one message to `{agent}:{bridge}:outbox`, asking
    /// for progress notices. Returns the entry id and the request id.
    pub async fn send(&self, r: Request) -> Result<Value, Refused> {
        let bridge = self.message_bridge(&r.bridge)?;
        let request_id = r
            .request_id
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut fields: Vec<(&str, &[u8])> = vec![
            ("channel_id", r.destination.as_bytes()),
            ("content", r.content.as_bytes()),
        ];
        if let Some(s) = &r.subject {
            fields.push(("subject", s.as_bytes()));
        }
        if let Some(s) = &r.reply_to {
            fields.push(("reply_to", s.as_bytes()));
        }
        fields.push(("request_id", request_id.as_bytes()));
        fields.push(("notices", broker::entry::NOTICES_ALL.as_bytes()));
        let entry = Entry {
            id: "0-0".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        };
        let refuse = |why: String| Refused(format!("refused, nothing written: {why}"));
        let message = Message::from_entry(&entry, bridge).map_err(refuse)?;
        broker::outbox::not_an_approval_channel(
            &self.config,
            &r.bridge,
            &message.channel_id,
            |c| Ok(c.to_string()),
        )
        .map_err(refuse)?;
        // Held across the check and the write: two calls with one request id
        // at once write one entry.
        let mut written = self.written.lock().await;
        if let Some(w) = written.get(&request_id) {
            return Err(refuse(format!(
                "request id `{request_id}` was sent already (entry {} on bridge `{}`): follow it with `status`, or send with a new request id",
                w.entry_id.as_deref().unwrap_or("not confirmed"),
                w.bridge
            )));
        }
        let inbox = keys::agent_inbox(&self.agent, &r.bridge);
        let known = self
            .search(&inbox, |f| f.get("request_id") == Some(&request_id))
            .await?;
        if !known.is_empty() {
            return Err(refuse(format!(
                "request id `{request_id}` was sent already (the inbox has notices about it): follow it with `status`, or send with a new request id"
            )));
        }
        let stream = keys::agent_outbox(&self.agent, &r.bridge);
        let mut w = Written {
            bridge: r.bridge.clone(),
            entry_id: None,
            outcome: None,
        };
        let id = match self.store.clone().xadd(&stream, &fields).await {
            Ok(id) => id,
            Err(e) => {
                // It may be written all the same (a lost answer): the id is
                // kept, so `status` follows it and a retry is refused.
                written.insert(request_id.clone(), w);
                return Err(Refused(format!(
                    "the write's answer was lost ({e}); request id `{request_id}` may be queued: follow it with `status` before sending again"
                )));
            }
        };
        w.entry_id = Some(id.clone());
        written.insert(request_id.clone(), w);
        Ok(json!({
            "entry_id": id,
            "request_id": request_id,
            "stream": stream,
            "needs_approval": bridge.approval.required,
        }))
    }

    /// A configured bridge that takes messages (a gated type runs declared
    /// actions, whose requests are not messages).
    fn message_bridge(&self, name: &str) -> Result<&broker::config::BridgeConfig, Refused> {
        let bridge = self.config.bridges.get(name).ok_or_else(|| {
            Refused(format!(
                "refused, nothing written: no bridge `{name}` (this agent may use: {})",
                self.message_bridges().join(", ")
            ))
        })?;
        if registry::is_gated(&bridge.kind) {
            return Err(Refused(format!(
                "refused, nothing written: bridge `{name}` runs declared actions, which are not sent through MCP"
            )));
        }
        Ok(bridge)
    }

    fn message_bridges(&self) -> Vec<&str> {
        self.config
            .bridges
            .iter()
            .filter(|(_, b)| !registry::is_gated(&b.kind))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The inbox streams of this agent, one per bridge, by bridge name.
    fn inboxes(&self) -> BTreeMap<String, String> {
        self.config
            .bridges
            .keys()
            .map(|b| (b.clone(), keys::agent_inbox(&self.agent, b)))
            .collect()
    }

    /// The entries of `stream` that `matches` keeps, oldest first: the newest
    /// [`SEARCHED`], read a page at a time.
    async fn search(
        &self,
        stream: &str,
        matches: impl Fn(&Fields) -> bool,
    ) -> Result<Vec<(String, Fields)>, Refused> {
        let mut store = self.store.clone();
        let mut found = Vec::new();
        let mut end = "+".to_string();
        let mut read = 0;
        while read < SEARCHED {
            let page = newest(&mut store, stream, &end, PAGE).await?;
            let Some((last, _)) = page.last() else { break };
            end = format!("({last}");
            read += page.len();
            let short = page.len() < PAGE;
            for (id, fields) in page {
                let f = text_fields(fields.unwrap_or_default());
                if matches(&f) {
                    found.push((id, f));
                }
            }
            if short {
                break;
            }
        }
        found.reverse();
        Ok(found)
    }

    /// The notices about the entry `entry_id` of `{agent}:{bridge}:outbox`,
    /// oldest first: every inbox entry from that id on, a page at a time
    /// (notices are written after their entry), matched on the entry itself.
    async fn notices_of_entry(&self, bridge: &str, entry_id: &str) -> Result<Vec<Fields>, Refused> {
        let inbox = keys::agent_inbox(&self.agent, bridge);
        let outbox = keys::agent_outbox(&self.agent, bridge);
        let mut store = self.store.clone();
        let mut found = Vec::new();
        // From a minute before the entry: after a failover to a master whose
        // clock is behind, a notice's id may be lower than its entry's.
        let ms: u64 = entry_id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        let mut start = ms.saturating_sub(60_000).to_string();
        loop {
            let page = store.range(&inbox, &start, "+", PAGE).await?;
            let Some(last) = page.last() else { break };
            start = format!("({}", last.id);
            let short = page.len() < PAGE;
            for e in page {
                let is = |name: &str, want: &str| e.text(name) == Some(want);
                if is("kind", "notice") && is("stream", &outbox) && is("entry_id", entry_id) {
                    found.push(text_fields(e.fields));
                }
            }
            if short {
                break;
            }
        }
        Ok(found)
    }

    /// The status of `request_id` (no permit taken: callers hold one).
    async fn status_now(&self, request_id: &str) -> Result<Value, Refused> {
        let mine = self.written.lock().await.get(request_id).cloned();
        let notices = match &mine {
            Some(Written {
                bridge,
                entry_id: Some(entry_id),
                ..
            }) => self.notices_of_entry(bridge, entry_id).await?,
            Some(Written { bridge, .. }) => {
                let inbox = keys::agent_inbox(&self.agent, bridge);
                self.notices_named(&[inbox], request_id).await?
            }
            None => {
                let inboxes: Vec<String> = self.inboxes().into_values().collect();
                self.notices_named(&inboxes, request_id).await?
            }
        };
        let now = status::status(request_id, &notices, mine.is_some());
        let decided = !matches!(
            now["state"].as_str(),
            Some(status::state::QUEUED | status::state::AWAITING_APPROVAL | status::state::UNKNOWN)
        );
        let mut written = self.written.lock().await;
        let Some(w) = written.get_mut(request_id) else {
            return Ok(now);
        };
        match (decided, &w.outcome) {
            (true, _) => w.outcome = Some(now.clone()),
            // Its notice is gone (retention): the outcome seen stands.
            (false, Some(seen)) => return Ok(seen.clone()),
            (false, None) => {}
        }
        Ok(now)
    }

    /// Notices naming `request_id` among the newest entries of `inboxes`.
    async fn notices_named(
        &self,
        inboxes: &[String],
        request_id: &str,
    ) -> Result<Vec<Fields>, Refused> {
        let mut found = Vec::new();
        for inbox in inboxes {
            found.extend(
                self.search(inbox, |f| {
                    f.get("kind").map(String::as_str) == Some("notice")
                        && f.get("request_id").map(String::as_str) == Some(request_id)
                })
                .await?,
            );
        }
        found.sort_by_key(|(id, _)| stream_id(id));
        Ok(found.into_iter().map(|(_, f)| f).collect())
    }

    pub async fn status(&self, request_id: &str) -> Result<Value, Refused> {
        let _permit = self.reader()?;
        self.status_now(request_id).await
    }

    /// The status once it differs from what it was when asked, or after
    /// `seconds` (at most [`MAX_WAIT_SECONDS`]) with `changed: false`.
    pub async fn wait(&self, request_id: &str, seconds: u64) -> Result<Value, Refused> {
        let _permit = self.reader()?;
        let seconds = seconds.min(MAX_WAIT_SECONDS);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let streams: Vec<String> = match self.written.lock().await.get(request_id) {
            Some(w) => vec![keys::agent_inbox(&self.agent, &w.bridge)],
            None => self.inboxes().into_values().collect(),
        };
        // From what exists now: nothing written after the status below is missed.
        let mut last = Vec::new();
        for s in &streams {
            last.push(self.last_id(s).await?);
        }
        let first = self.status_now(request_id).await?;
        let mut blocking = self.store.blocking().await?;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(with_changed(first, false));
            }
            // Woken by any new inbox entry; the status is read again after.
            let batch = blocking
                .tail(&streams, &last, PAGE, left.min(Duration::from_secs(5)))
                .await?;
            let mut woken = false;
            for (stream, entries) in batch {
                if let (Some(i), Some((id, _))) =
                    (streams.iter().position(|s| *s == stream), entries.last())
                {
                    last[i] = id.clone();
                    woken = true;
                }
            }
            if woken {
                let now = self.status_now(request_id).await?;
                if now != first {
                    return Ok(with_changed(now, true));
                }
            }
        }
    }

    async fn last_id(&self, stream: &str) -> Result<String, Refused> {
        Ok(newest(&mut self.store.clone(), stream, "+", 1)
            .await?
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_string(), |(id, _)| id))
    }

    /// The agent's inbox entries (messages and notices) not yet handed out,
    /// at most `max` and [`INBOX_BYTES`], through its consumer group: first
    /// what was read before and not returned, then new ones. Only what is
    /// returned is acknowledged.
    pub async fn inbox(&self, max: usize) -> Result<Value, Refused> {
        let _permit = self.reader()?;
        let max = max.clamp(1, MAX_INBOX);
        let group = keys::agent_group(&self.agent);
        let mut blocking = self.store.blocking().await?;
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut acks: Vec<(String, Vec<String>)> = Vec::new();
        'streams: for (bridge, stream) in self.inboxes() {
            let mut ids = Vec::new();
            for from in ["0", ">"] {
                if out.len() >= max {
                    acks.push((stream, ids));
                    break 'streams;
                }
                let batch = match blocking
                    .read_group(
                        &group,
                        CONSUMER,
                        std::slice::from_ref(&stream),
                        &[from],
                        max - out.len(),
                        None,
                    )
                    .await
                {
                    Ok(b) => b,
                    // No group yet: the bridge's ping service creates it (the
                    // agent's ACL cannot); nothing was ever written there.
                    Err(Error::Redis(e)) if e.code() == Some("NOGROUP") => continue 'streams,
                    Err(e) => return Err(e.into()),
                };
                for (id, fields) in batch.into_iter().flat_map(|(_, entries)| entries) {
                    // Deleted since it was read: nothing to hand out.
                    let Some(fields) = fields else {
                        ids.push(id);
                        continue;
                    };
                    let mut f = text_fields(fields);
                    let kind = f.remove("kind").unwrap_or_else(|| "message".into());
                    let item = json!({ "bridge": bridge, "id": id, "kind": kind, "fields": f });
                    let size = item.to_string().len();
                    if !out.is_empty() && bytes + size > INBOX_BYTES {
                        // Stays pending: the next call hands it out first.
                        acks.push((stream, ids));
                        break 'streams;
                    }
                    bytes += size;
                    out.push(item);
                    ids.push(id);
                }
            }
            acks.push((stream, ids));
        }
        let mut store = self.store.clone();
        for (stream, ids) in &acks {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            // Handed out all the same: unacknowledged, they come again first
            // (twice is the price; never lost).
            if let Err(e) = store.ack(stream, &group, &ids).await {
                tracing::warn!(stream, error = %e, "inbox entries handed out but not acknowledged");
            }
        }
        Ok(json!({ "entries": out }))
    }

    /// The bridges this agent may send through, their destinations, and
    /// whether each needs approval.
    pub fn destinations(&self) -> Value {
        let bridges: Vec<Value> = self
            .config
            .bridges
            .iter()
            .map(|(name, b)| {
                let kind = registry::kind(&b.kind);
                json!({
                    "bridge": name,
                    "type": b.kind,
                    "about": kind.map(|k| k.about.as_str()),
                    "destinations": b.destinations,
                    "needs_approval": b.approval.required,
                    "max_content_bytes": b.max_content_bytes,
                    "send_through_mcp": !registry::is_gated(&b.kind),
                })
            })
            .collect();
        json!({ "agent": self.agent, "bridges": bridges })
    }
}

/// At most `count` entries of `stream` from `end` back, newest first.
async fn newest(
    store: &mut Store,
    stream: &str,
    end: &str,
    count: usize,
) -> Result<Vec<broker::store::RawEntry>, Refused> {
    Ok(store.newest(stream, end, count).await?)
}

fn with_changed(mut v: Value, changed: bool) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("changed".into(), json!(changed));
    }
    v
}

fn text_fields(fields: Vec<(String, Vec<u8>)>) -> Fields {
    fields
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// A stream id as numbers, for ordering ids of different streams.
fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}
