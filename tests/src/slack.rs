//! A local Slack that speaks the parts of the real protocol the bridge uses,
//! for the real client crate (slack-morphism).
//!
//! Web API (`/api/{method}`, GET query or POST JSON / form, as Slack takes
//! them, `Authorization: Bearer`, always HTTP 200 with `ok: false` and an
//! error code for a refusal, 429 with `Retry-After` on demand): `auth.test`,
//! `apps.connections.open` (app token only), `chat.postMessage`,
//! `chat.update`, `conversations.history` (newest first) and `.replies` (a
//! thread's parent first; asked with a reply's ts, that reply alone; a post
//! to a reply goes to its thread), messages' metadata only when asked
//! (`include_all_metadata`), cursor paging; `reactions.get`, `views.open`.
//! Socket Mode over a WebSocket on loopback: `hello` on connect, envelopes
//! (`events_api`, `interactive`) with an `envelope_id` the client must
//! acknowledge. What people do is kept whether or not a connection heard it
//! (history, reactions), as on Slack; an envelope sent while no connection
//! is open is dropped (counted), as Slack gives up on it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// The bot token the fake accepts.
pub const BOT_TOKEN: &str = "xoxb-fake-bot-token";
/// The app-level token the fake accepts (Socket Mode).
pub const APP_TOKEN: &str = "xapp-fake-app-token";
/// The workspace.
pub const TEAM: &str = "T0COWBOY1";
/// Another workspace (a Slack Connect channel's other side).
pub const OTHER_TEAM: &str = "T0OTHER01";
/// The bot's user id and bot id.
pub const BOT_USER: &str = "U0BOT0001";
pub const BOT_ID: &str = "B0BOT0001";
/// The app's id.
pub const APP_ID: &str = "A0APP0001";

/// A message in a channel: the bot's or a person's.
#[derive(Debug, Clone)]
pub struct Msg {
    pub channel: String,
    pub ts: String,
    pub user: String,
    pub bot_id: Option<String>,
    pub text: String,
    pub blocks: Value,
    pub thread_ts: Option<String>,
    pub metadata: Option<Value>,
    /// The whole `chat.postMessage` request, for its shape.
    pub request: Value,
    /// The blocks of each `chat.update`, in order.
    pub edits: Vec<Value>,
    /// (reaction name, user) as people added them.
    pub reactions: Vec<(String, String)>,
}

/// What the fake saw and holds.
#[derive(Debug, Default)]
pub struct Recorded {
    pub messages: Vec<Msg>,
    /// `views.open` calls: (trigger id, view).
    pub views: Vec<(String, Value)>,
    /// Envelope ids the client acknowledged.
    pub acks: HashSet<String>,
    /// Envelopes sent while no connection was open.
    pub dropped: usize,
    /// Per method: how many of the next calls answer 429.
    pub rate_limit_next: HashMap<String, usize>,
    /// Per method: the `Retry-After` of its 429s, in seconds (default 1).
    pub retry_after: HashMap<String, u64>,
    /// Per method: calls answered 429.
    pub rate_limited: HashMap<String, usize>,
    /// Which `chat.postMessage` calls (counted from 1) post the message and
    /// then answer 503, as when the response is lost on the way back.
    pub lose_posts: HashSet<usize>,
    /// `chat.postMessage` calls so far.
    pub post_calls: usize,
    /// Every call: (method, when).
    pub calls: Vec<(String, tokio::time::Instant)>,
    pub connections_opened: usize,
    pub unexpected: Vec<String>,
    /// Channels that exist.
    pub channels: HashSet<String>,
    next: u64,
}

struct Shared {
    rec: Mutex<Recorded>,
    envelopes: broadcast::Sender<Value>,
    base: String,
}

/// A running local Slack.
pub struct FakeSlack {
    shared: Arc<Shared>,
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Recorded {
    /// A fresh ts: now, with a counter for the micros, as Slack's are unique.
    fn ts(&mut self) -> String {
        self.next += 1;
        format!("{}.{:06}", now_secs(), self.next)
    }

    /// The bot's messages in `channel`, in order.
    pub fn posted(&self, channel: &str) -> Vec<&Msg> {
        self.messages
            .iter()
            .filter(|m| m.channel == channel && m.user == BOT_USER)
            .collect()
    }

    /// The message at `channel:ts`.
    pub fn at(&self, external: &str) -> Option<&Msg> {
        let (c, ts) = external.split_once(':')?;
        self.messages.iter().find(|m| m.channel == c && m.ts == ts)
    }
}

fn history_json(m: &Msg) -> Value {
    let mut v = json!({
        "type": "message",
        "ts": m.ts,
        "user": m.user,
        "text": m.text,
        "team": TEAM,
    });
    if let Some(b) = &m.bot_id {
        v["bot_id"] = json!(b);
        v["app_id"] = json!(APP_ID);
    }
    if !m.blocks.is_null() {
        v["blocks"] = m.blocks.clone();
    }
    if let Some(t) = &m.thread_ts {
        v["thread_ts"] = json!(t);
    }
    if let Some(md) = &m.metadata {
        v["metadata"] = md.clone();
    }
    let mut by: Vec<(String, Vec<String>)> = Vec::new();
    for (name, user) in &m.reactions {
        match by.iter_mut().find(|(n, _)| n == name) {
            Some((_, users)) => users.push(user.clone()),
            None => by.push((name.clone(), vec![user.clone()])),
        }
    }
    if !by.is_empty() {
        v["reactions"] = by
            .into_iter()
            .map(|(n, u)| json!({"name": n, "count": u.len(), "users": u}))
            .collect();
    }
    v
}

impl FakeSlack {
    /// Starts the fake on a free loopback port; `channels` exist.
    pub async fn start(channels: &[&str]) -> FakeSlack {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (envelopes, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            rec: Mutex::new(Recorded {
                channels: channels.iter().map(|c| c.to_string()).collect(),
                ..Recorded::default()
            }),
            envelopes,
            base: format!("127.0.0.1:{port}"),
        });
        let app = Router::new()
            .route("/api/{method}", any(method))
            .route("/socket", get(socket))
            .fallback(any(unexpected))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeSlack { shared, port, task }
    }

    /// `api_base` for the bridge.
    pub fn api_base(&self) -> String {
        format!("http://127.0.0.1:{}/api", self.port)
    }

    /// Reads what was recorded.
    pub fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        f(&mut self.shared.rec.lock().unwrap())
    }

    /// The next `n` calls of `method` answer 429 with `Retry-After: 1`.
    pub fn rate_limit(&self, method: &str, n: usize) {
        self.with(|r| r.rate_limit_next.insert(method.to_string(), n));
    }

    /// Sends an envelope to the open connection; returns its id.
    fn envelope(&self, kind: &str, payload: Value) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let env = json!({
            "envelope_id": id,
            "type": kind,
            "accepts_response_payload": false,
            "payload": payload,
        });
        if self.shared.envelopes.send(env).is_err() {
            self.with(|r| r.dropped += 1);
        }
        id
    }

    /// Whether the client acknowledged envelope `id`.
    pub fn acked(&self, id: &str) -> bool {
        self.with(|r| r.acks.contains(id))
    }

    /// Whether a Socket Mode connection is open.
    pub fn connected(&self) -> bool {
        self.shared.envelopes.receiver_count() > 0
    }

    fn event(&self, team: &str, event: Value) -> String {
        let payload = json!({
            "token": "verification-token",
            "team_id": team,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": format!("Ev{}", uuid::Uuid::new_v4().simple()),
            "event_time": now_secs(),
            "authorizations": [{"team_id": team, "user_id": BOT_USER, "is_bot": true}],
        });
        self.envelope("events_api", payload)
    }

    /// Someone writes in `channel` (in the thread of `thread_ts`, if given):
    /// kept for history and sent as a `message` event. Returns its ts and
    /// the envelope id.
    pub fn say(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> (String, String) {
        let ts = self.with(|r| {
            let ts = r.ts();
            r.messages.push(Msg {
                channel: channel.into(),
                ts: ts.clone(),
                user: user.into(),
                bot_id: None,
                text: text.into(),
                blocks: Value::Null,
                thread_ts: thread_ts.map(String::from),
                metadata: None,
                request: Value::Null,
                edits: Vec::new(),
                reactions: Vec::new(),
            });
            ts
        });
        let mut ev = json!({
            "type": "message",
            "channel": channel,
            "channel_type": if channel.starts_with('D') { "im" } else { "channel" },
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "team": TEAM,
        });
        if let Some(t) = thread_ts {
            ev["thread_ts"] = json!(t);
        }
        let env = self.event(TEAM, ev);
        (ts, env)
    }

    /// Another app posts in `channel` (a `bot_message`).
    pub fn app_says(&self, channel: &str, text: &str) -> String {
        let ts = self.with(|r| r.ts());
        self.event(
            TEAM,
            json!({"type": "message", "subtype": "bot_message", "channel": channel, "bot_id": "B0OTHER01",
                   "text": text, "ts": ts, "event_ts": ts}),
        )
    }

    /// `user` reacts `name` on the message at `channel:ts` (kept for
    /// `reactions.get`), from workspace `team`. Returns the envelope id.
    pub fn react(&self, external: &str, user: &str, name: &str, team: &str) -> String {
        let (channel, ts) = external.split_once(':').unwrap();
        self.with(|r| {
            if let Some(m) = r
                .messages
                .iter_mut()
                .find(|m| m.channel == channel && m.ts == ts)
            {
                m.reactions.push((name.into(), user.into()));
            }
        });
        self.event(
            team,
            json!({
                "type": "reaction_added",
                "user": user,
                "reaction": name,
                "item_user": BOT_USER,
                "item": {"type": "message", "channel": channel, "ts": ts},
                "event_ts": format!("{}.000001", now_secs()),
            }),
        )
    }

    /// `user` of workspace `team` presses the button `action_id` on the card
    /// at `channel:ts`, the button carrying `value`. Returns the envelope id.
    pub fn press(
        &self,
        external: &str,
        user: &str,
        team: &str,
        action_id: &str,
        value: &str,
    ) -> String {
        let (channel, ts) = external.split_once(':').unwrap();
        let trigger = format!("trigger.{}", uuid::Uuid::new_v4().simple());
        self.envelope(
            "interactive",
            json!({
                "type": "block_actions",
                "team": {"id": team, "domain": "cowboy"},
                "user": {"id": user, "team_id": team, "username": user, "name": user},
                "api_app_id": APP_ID,
                "token": "verification-token",
                "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": false},
                "trigger_id": trigger,
                "channel": {"id": channel, "name": "approvals"},
                "response_url": format!("http://{}/response", self.shared.base),
                "actions": [{
                    "type": "button",
                    "action_id": action_id,
                    "block_id": "cowboy_answer",
                    "text": {"type": "plain_text", "text": action_id},
                    "value": value,
                    "action_ts": format!("{}.000002", now_secs()),
                }],
            }),
        )
    }

    /// `user` of `team` submits the `n`th modal the bot opened with `reason`.
    /// Returns the envelope id.
    pub fn submit(&self, n: usize, user: &str, team: &str, reason: &str) -> String {
        let view = self.with(|r| r.views[n].1.clone());
        let mut stateful = view.clone();
        stateful["id"] = json!(format!("V{n:08}"));
        stateful["team_id"] = json!(team);
        stateful["hash"] = json!("1.abc");
        stateful["app_id"] = json!(APP_ID);
        stateful["bot_id"] = json!(BOT_ID);
        stateful["state"] = json!({"values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}});
        self.envelope(
            "interactive",
            json!({
                "type": "view_submission",
                "team": {"id": team, "domain": "cowboy"},
                "user": {"id": user, "team_id": team, "username": user, "name": user},
                "api_app_id": APP_ID,
                "token": "verification-token",
                "trigger_id": format!("trigger.{}", uuid::Uuid::new_v4().simple()),
                "view": stateful,
            }),
        )
    }
}

fn refuse(error: &str) -> Response {
    Json(json!({"ok": false, "error": error})).into_response()
}

/// The request's parameters: the query, and a JSON or form body.
fn params(query: Option<String>, headers: &HeaderMap, body: &[u8]) -> Result<Value, String> {
    let mut out = serde_json::Map::new();
    let form = |s: &str, out: &mut serde_json::Map<String, Value>| {
        for (k, v) in url_pairs(s) {
            out.insert(k, Value::String(v));
        }
    };
    if let Some(q) = query {
        form(&q, &mut out);
    }
    let kind = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !body.is_empty() {
        if kind.starts_with("application/json") {
            let v: Value =
                serde_json::from_slice(body).map_err(|e| format!("invalid_json: {e}"))?;
            let Value::Object(m) = v else {
                return Err("invalid_json".into());
            };
            out.extend(m);
        } else if kind.starts_with("application/x-www-form-urlencoded") {
            form(&String::from_utf8_lossy(body), &mut out);
        } else {
            return Err(format!("invalid_content_type: {kind}"));
        }
    }
    Ok(Value::Object(out))
}

/// `a=b&c=d`, percent-decoded.
fn url_pairs(s: &str) -> Vec<(String, String)> {
    let decode = |t: &str| {
        let t = t.replace('+', " ");
        let bytes = t.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                if let Ok(b) = u8::from_str_radix(&t[i + 1..i + 3], 16) {
                    out.push(b);
                    i += 3;
                    continue;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn str_of(p: &Value, k: &str) -> Option<String> {
    match &p[k] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

async fn method(
    State(s): State<Arc<Shared>>,
    Path(method): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    {
        let mut rec = s.rec.lock().unwrap();
        rec.calls
            .push((method.clone(), tokio::time::Instant::now()));
        if let Some(n) = rec.rate_limit_next.get_mut(&method).filter(|n| **n > 0) {
            *n -= 1;
            *rec.rate_limited.entry(method.clone()).or_default() += 1;
            let after = rec
                .retry_after
                .get(&method)
                .copied()
                .unwrap_or(1)
                .to_string();
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", after)],
                Json(json!({"ok": false, "error": "ratelimited"})),
            )
                .into_response();
        }
    }
    let wanted = if method == "apps.connections.open" {
        APP_TOKEN
    } else {
        BOT_TOKEN
    };
    if token.is_empty() {
        return refuse("not_authed");
    }
    if token != wanted {
        return refuse(
            if token.starts_with("xapp-") || token.starts_with("xoxb-") {
                "not_allowed_token_type"
            } else {
                "invalid_auth"
            },
        );
    }
    let p = match params(query, &headers, &body) {
        Ok(p) => p,
        Err(e) => return refuse(&e),
    };
    let mut rec = s.rec.lock().unwrap();
    match method.as_str() {
        "auth.test" => Json(json!({
            "ok": true, "url": "https://cowboy.slack.com/", "team": "cowboy", "user": "cowboy-bot",
            "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install": false,
        }))
        .into_response(),
        "apps.connections.open" => {
            rec.connections_opened += 1;
            Json(json!({"ok": true, "url": format!("ws://{}/socket?ticket={}", s.base, rec.connections_opened)}))
                .into_response()
        }
        "chat.postMessage" => {
            let Some(channel) = str_of(&p, "channel") else {
                return refuse("channel_not_found");
            };
            if !rec.channels.contains(&channel) {
                return refuse("channel_not_found");
            }
            let text = str_of(&p, "text").unwrap_or_default();
            let blocks = p["blocks"].clone();
            if text.is_empty() && blocks.is_null() {
                return refuse("no_text");
            }
            if !(blocks.is_null() || blocks.as_array().is_some_and(|b| b.len() <= 50)) {
                return refuse("invalid_blocks");
            }
            // A reply to a thread reply goes to that reply's thread.
            let thread_ts = str_of(&p, "thread_ts").map(|t| {
                rec.messages
                    .iter()
                    .find(|m| m.channel == channel && m.ts == t)
                    .and_then(|m| m.thread_ts.clone())
                    .unwrap_or(t)
            });
            let ts = rec.ts();
            let msg = Msg {
                channel: channel.clone(),
                ts: ts.clone(),
                user: BOT_USER.into(),
                bot_id: Some(BOT_ID.into()),
                text,
                blocks,
                thread_ts,
                metadata: (!p["metadata"].is_null()).then(|| p["metadata"].clone()),
                request: p.clone(),
                edits: Vec::new(),
                reactions: Vec::new(),
            };
            let message = history_json(&msg);
            rec.messages.push(msg);
            rec.post_calls += 1;
            if rec.lose_posts.contains(&rec.post_calls) {
                return (StatusCode::SERVICE_UNAVAILABLE, "upstream lost").into_response();
            }
            Json(json!({"ok": true, "channel": channel, "ts": ts, "message": message}))
                .into_response()
        }
        "chat.update" => {
            let (Some(channel), Some(ts)) = (str_of(&p, "channel"), str_of(&p, "ts")) else {
                return refuse("message_not_found");
            };
            let Some(m) = rec
                .messages
                .iter_mut()
                .find(|m| m.channel == channel && m.ts == ts)
            else {
                return refuse("message_not_found");
            };
            if m.user != BOT_USER {
                return refuse("cant_update_message");
            }
            m.edits.push(p["blocks"].clone());
            if let Some(t) = str_of(&p, "text") {
                m.text = t;
            }
            let message = json!({"text": m.text, "user": BOT_USER, "bot_id": BOT_ID});
            Json(json!({"ok": true, "channel": channel, "ts": ts, "text": m.text, "message": message}))
                .into_response()
        }
        "conversations.history" | "conversations.replies" => {
            let Some(channel) = str_of(&p, "channel").filter(|c| rec.channels.contains(c)) else {
                return refuse("channel_not_found");
            };
            let key = |ts: &str| {
                let (a, b) = ts.split_once('.').unwrap_or((ts, "0"));
                (a.parse::<u64>().unwrap_or(0), b.parse::<u64>().unwrap_or(0))
            };
            let oldest = str_of(&p, "oldest").map(|o| key(&o));
            let limit = str_of(&p, "limit")
                .and_then(|l| l.parse().ok())
                .unwrap_or(100usize)
                .min(1000);
            let skip: usize = str_of(&p, "cursor")
                .and_then(|c| c.strip_prefix("next:").and_then(|n| n.parse().ok()))
                .unwrap_or(0);
            let mut all: Vec<&Msg> = rec
                .messages
                .iter()
                .filter(|m| m.channel == channel)
                .collect();
            if method == "conversations.history" {
                // The channel's own messages: thread replies are not listed.
                all.retain(|m| m.thread_ts.is_none() || m.thread_ts.as_deref() == Some(&m.ts));
                all.retain(|m| oldest.is_none_or(|o| key(&m.ts) > o));
                all.sort_by_key(|m| std::cmp::Reverse(key(&m.ts)));
            } else {
                let Some(asked) = all
                    .iter()
                    .find(|m| str_of(&p, "ts").as_deref() == Some(&m.ts))
                else {
                    return refuse("thread_not_found");
                };
                // Asked with a reply's ts, Slack lists that reply alone.
                let parent = asked.ts.clone();
                let a_reply = asked.thread_ts.as_ref().is_some_and(|t| *t != parent);
                all.retain(|m| {
                    m.ts == parent || (!a_reply && m.thread_ts.as_deref() == Some(parent.as_str()))
                });
                all.sort_by_key(|m| key(&m.ts));
            }
            // As Slack: a message's metadata is listed only when asked.
            let with_metadata =
                str_of(&p, "include_all_metadata").is_some_and(|v| v == "true" || v == "1");
            let page: Vec<Value> = all
                .iter()
                .skip(skip)
                .take(limit)
                .map(|m| {
                    let mut v = history_json(m);
                    if !with_metadata {
                        if let Some(o) = v.as_object_mut() {
                            o.remove("metadata");
                        }
                    }
                    v
                })
                .collect();
            let more = all.len() > skip + limit;
            let next = if more {
                format!("next:{}", skip + limit)
            } else {
                String::new()
            };
            Json(json!({"ok": true, "messages": page, "has_more": more, "response_metadata": {"next_cursor": next}}))
                .into_response()
        }
        "reactions.get" => {
            let (Some(channel), Some(ts)) = (str_of(&p, "channel"), str_of(&p, "timestamp")) else {
                return refuse("message_not_found");
            };
            let Some(m) = rec
                .messages
                .iter()
                .find(|m| m.channel == channel && m.ts == ts)
            else {
                return refuse("message_not_found");
            };
            let mut message = history_json(m);
            message["reactions"] = message.get("reactions").cloned().unwrap_or(json!([]));
            Json(json!({"ok": true, "type": "message", "channel": channel, "message": message}))
                .into_response()
        }
        "views.open" => {
            let Some(trigger) = str_of(&p, "trigger_id") else {
                return refuse("invalid_trigger_id");
            };
            let view = p["view"].clone();
            if view["type"] != "modal" {
                return refuse("invalid_arguments");
            }
            rec.views.push((trigger, view.clone()));
            let mut v = view;
            v["id"] = json!(format!("V{:08}", rec.views.len() - 1));
            v["team_id"] = json!(TEAM);
            v["hash"] = json!("1.abc");
            Json(json!({"ok": true, "view": v})).into_response()
        }
        other => {
            rec.unexpected.push(other.to_string());
            refuse("unknown_method")
        }
    }
}

async fn unexpected(State(s): State<Arc<Shared>>, uri: axum::http::Uri) -> Response {
    s.rec.lock().unwrap().unexpected.push(uri.to_string());
    (StatusCode::NOT_FOUND, "not found").into_response()
}

async fn socket(State(s): State<Arc<Shared>>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| session(s, socket))
}

async fn session(s: Arc<Shared>, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    let mut envelopes = s.envelopes.subscribe();
    let hello = json!({
        "type": "hello",
        "num_connections": 1,
        "debug_info": {"host": "local-slack", "approximate_connection_time": 18060},
        "connection_info": {"app_id": APP_ID},
    });
    if tx
        .send(WsMessage::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            env = envelopes.recv() => match env {
                Ok(e) => if tx.send(WsMessage::Text(e.to_string().into())).await.is_err() { return },
                Err(_) => return,
            },
            msg = rx.next() => {
                let Some(Ok(msg)) = msg else { return };
                match msg {
                    WsMessage::Text(text) => {
                        if let Ok(v) = serde_json::from_str::<Value>(&text) {
                            if let Some(id) = v["envelope_id"].as_str() {
                                s.rec.lock().unwrap().acks.insert(id.to_string());
                            }
                        }
                    }
                    WsMessage::Ping(p) => { let _ = tx.send(WsMessage::Pong(p)).await; }
                    WsMessage::Close(_) => return,
                    _ => {}
                }
            }
        }
    }
}
