//! What the tools do in Redis, as the agent's own ACL user.
//!
//! Invariants:
//! - The connection authenticates as Redis user `agent` (with its password
//!   file; nothing else is tried): whatever a tool does, the agent's ACL
//!   allows, so this server is never a way around the gate.
//! - A send is validated before anything is written, with the broker's own
//!   check (`Message::from_entry`, then the approval channels) and so its
//!   words; the one write is a single `XADD`, so a refused or interrupted
//!   send leaves nothing half-written. The bridge checks again (it alone
//!   knows its platform's spelling of a destination).
//! - `status` and `wait` read inboxes without a group (`XREVRANGE`, `XREAD`):
//!   they never consume what `inbox` hands out.

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

/// Notices read back per inbox when a status is asked for (newest first).
const NOTICES_READ: usize = 5000;
/// Longest `wait` (clients' tool calls time out after about a minute).
pub const MAX_WAIT_SECONDS: u64 = 50;
/// Most inbox entries one `inbox` call returns.
pub const MAX_INBOX: usize = 100;
/// The consumer name `inbox` reads the agent's group as.
const CONSUMER: &str = "mcp";
/// `wait`s and `inbox` reads under way at once: each holds a connection of
/// its own, and a client calling them in a loop must not take Redis's.
pub const MAX_READERS: usize = 8;

/// A refusal the client is told as a tool error.
#[derive(Debug)]
pub struct Refused(pub String);

impl From<Error> for Refused {
    fn from(e: Error) -> Refused {
        Refused(e.to_string())
    }
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
    written: Mutex<HashMap<String, String>>,
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
                "{MAX_READERS} waits or inbox reads are under way already; call again when one returns"
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
        let stream = keys::agent_outbox(&self.agent, &r.bridge);
        let id = self.store.clone().xadd(&stream, &fields).await?;
        self.written
            .lock()
            .await
            .insert(request_id.clone(), r.bridge.clone());
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

    /// The notices about `request_id` on the inboxes it may be on, oldest first.
    async fn notices(&self, request_id: &str) -> Result<Vec<Fields>, Refused> {
        let streams: Vec<String> = match self.written.lock().await.get(request_id) {
            Some(bridge) => vec![keys::agent_inbox(&self.agent, bridge)],
            None => self.inboxes().into_values().collect(),
        };
        let mut found: Vec<(String, Fields)> = Vec::new();
        let mut store = self.store.clone();
        for stream in streams {
            let v: redis::Value = redis::cmd("XREVRANGE")
                .arg(&stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(NOTICES_READ)
                .query_async(&mut store.conn)
                .await
                .map_err(|e| Error::from_redis(&format!("XREVRANGE {stream}"), e))?;
            for (id, fields) in broker::store::parse_entries(v) {
                let Some(fields) = fields else { continue };
                let f = text_fields(fields);
                let ours = f.get("kind").map(String::as_str) == Some("notice")
                    && f.get("request_id").map(String::as_str) == Some(request_id);
                if ours {
                    found.push((id, f));
                }
            }
        }
        found.sort_by_key(|(id, _)| stream_id(id));
        Ok(found.into_iter().map(|(_, f)| f).collect())
    }

    pub async fn status(&self, request_id: &str) -> Result<Value, Refused> {
        let notices = self.notices(request_id).await?;
        let written = self.written.lock().await.contains_key(request_id);
        Ok(status::status(request_id, &notices, written))
    }

    /// The status once it differs from what it was when asked, or after
    /// `seconds` (at most [`MAX_WAIT_SECONDS`]) with `changed: false`.
    pub async fn wait(&self, request_id: &str, seconds: u64) -> Result<Value, Refused> {
        let _permit = self.reader()?;
        let seconds = seconds.min(MAX_WAIT_SECONDS);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let first = self.status(request_id).await?;
        let streams: Vec<String> = match self.written.lock().await.get(request_id) {
            Some(bridge) => vec![keys::agent_inbox(&self.agent, bridge)],
            None => self.inboxes().into_values().collect(),
        };
        // From what exists now: nothing written after the status above is missed.
        let mut last = Vec::new();
        for s in &streams {
            last.push(self.last_id(s).await?);
        }
        let mut blocking = self.store.blocking().await?;
        loop {
            let now = self.status(request_id).await?;
            if now != first {
                return Ok(with_changed(now, true));
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(with_changed(now, false));
            }
            // Woken by any new inbox entry; the status is read again after.
            let batch = blocking
                .tail(&streams, &last, 100, left.min(Duration::from_secs(5)))
                .await?;
            for (stream, entries) in batch {
                if let (Some(i), Some((id, _))) =
                    (streams.iter().position(|s| *s == stream), entries.last())
                {
                    last[i] = id.clone();
                }
            }
        }
    }

    async fn last_id(&self, stream: &str) -> Result<String, Refused> {
        let v: redis::Value = redis::cmd("XREVRANGE")
            .arg(stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.store.clone().conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XREVRANGE {stream}"), e))?;
        Ok(broker::store::parse_entries(v)
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_string(), |(id, _)| id))
    }

    /// The agent's new inbox entries (messages and notices), at most `max`,
    /// through its consumer group: each is handed out once and acknowledged
    /// as it is returned.
    pub async fn inbox(&self, max: usize) -> Result<Value, Refused> {
        let _permit = self.reader()?;
        let max = max.clamp(1, MAX_INBOX);
        let group = keys::agent_group(&self.agent);
        let mut blocking = self.store.blocking().await?;
        let mut store = self.store.clone();
        let mut out = Vec::new();
        for (bridge, stream) in self.inboxes() {
            if out.len() >= max {
                break;
            }
            let batch = match blocking
                .read_group(
                    &group,
                    CONSUMER,
                    std::slice::from_ref(&stream),
                    &[">"],
                    max - out.len(),
                    None,
                )
                .await
            {
                Ok(b) => b,
                // No group yet: the bridge's ping service creates it (the
                // agent's ACL cannot); nothing was ever written there.
                Err(Error::Redis(e)) if e.code() == Some("NOGROUP") => continue,
                Err(e) => return Err(e.into()),
            };
            for (_, entries) in batch {
                let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
                store.ack(&stream, &group, &ids).await?;
                for (id, fields) in &entries {
                    let Some(fields) = fields else { continue };
                    let mut f = text_fields(fields.clone());
                    let kind = f.remove("kind").unwrap_or_else(|| "message".into());
                    out.push(json!({
                        "bridge": bridge,
                        "id": id,
                        "kind": kind,
                        "fields": f,
                    }));
                }
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
