//! A local Discord that speaks the real protocol, for the real serenity client.
//!
//! REST (`/api/v10`): the gateway URL, `users/@me`, a channel's type, create message (with nonce
//! de-duplication under `enforce_nonce`), edit message, add and delete reaction,
//! list a channel's messages and a reaction's users (what people did is kept
//! whether or not a session heard it), and a 429 with `retry_after` on demand. Gateway websocket: HELLO, IDENTIFY →
//! READY and the guild's GUILD_CREATE (roles, channels, the bot's overwrites; the
//! bot's missing permissions are answered 403), heartbeat ACK, RESUME → RESUMED
//! with replay, and dispatches of
//! MESSAGE_CREATE / MESSAGE_REACTION_ADD carrying the fields serenity 0.12.5
//! needs. Everything the bridge did is recorded for assertions. It listens on
//! 127.0.0.1 only; anything unexpected is recorded as such and answered 404.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, patch, post, put};
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// The bot's user id in the fake.
pub const BOT_ID: u64 = 900_000_000_000_000_001;
/// The token the fake accepts.
pub const TOKEN: &str = "fake-bot-token";
/// The one guild, holding every channel the fake was started with that is not a DM.
pub const GUILD: u64 = 700_000_000_000_000_001;

/// Discord's permission bits the fake checks before answering.
pub mod permission {
    pub const ADD_REACTIONS: u64 = 1 << 6;
    pub const VIEW_CHANNEL: u64 = 1 << 10;
    pub const SEND_MESSAGES: u64 = 1 << 11;
    pub const MANAGE_MESSAGES: u64 = 1 << 13;
    pub const READ_MESSAGE_HISTORY: u64 = 1 << 16;
    /// What @everyone may do in the guild: everything the bridge uses.
    pub const EVERYONE: u64 =
        ADD_REACTIONS | VIEW_CHANNEL | SEND_MESSAGES | MANAGE_MESSAGES | READ_MESSAGE_HISTORY;
}

/// A message the bridge created.
#[derive(Debug, Clone)]
pub struct Posted {
    pub id: u64,
    pub channel_id: u64,
    pub content: String,
    pub nonce: Option<String>,
    pub enforce_nonce: bool,
    pub reference: Option<u64>,
    pub edits: Vec<String>,
    /// `allowed_mentions` of the create call, and of each edit after it (Null when absent).
    pub allowed_mentions: Vec<Value>,
}

/// What the fake saw and holds.
#[derive(Debug, Default)]
pub struct Recorded {
    pub posted: Vec<Posted>,
    /// (message id, emoji, user id) added through REST.
    pub reactions: Vec<(u64, String, u64)>,
    /// (message id, emoji, user id) removed through REST.
    pub removed: Vec<(u64, String, u64)>,
    /// (message id, emoji, user id) people added: what `GET …/reactions/{emoji}`
    /// lists (with the bot's), less what was removed.
    pub user_reactions: Vec<(u64, String, u64)>,
    /// Super (burst) reactions people added: listed with `type=1` only.
    pub burst_reactions: Vec<(u64, String, u64)>,
    /// Every create-message call to any channel: when it came (a global
    /// limit holds them all).
    pub post_times: Vec<tokio::time::Instant>,
    /// Every request that reached the REST API (the gateway's included).
    pub requests: usize,
    /// The next create-message call draws a global 429 with this `retry_after`.
    pub global_next: Option<std::time::Duration>,
    /// Global 429s answered: (when, how long).
    pub global_429s: Vec<(tokio::time::Instant, std::time::Duration)>,
    /// Messages people wrote, with their author: what `GET …/messages` lists
    /// (with the bot's).
    pub said: Vec<(Posted, Value)>,
    /// `GET` calls for reactions and for messages.
    pub reads: usize,
    /// Create-message calls refused as invalid (an unknown channel): what
    /// Discord counts toward its ban on an address.
    pub invalid: usize,
    /// Create-message calls answered 429.
    pub rate_limited: usize,
    /// Create-message calls that returned an existing message for a repeated nonce.
    pub nonce_hits: usize,
    pub identifies: usize,
    pub resumes: usize,
    pub heartbeats: usize,
    pub me_calls: usize,
    pub unexpected: Vec<String>,
    /// Channels that exist; others answer 404 Unknown Channel.
    pub channels: HashSet<u64>,
    /// Of them, the DM channels (`GET /channels/{id}` says type 1).
    pub dm_channels: HashSet<u64>,
    /// Per channel: the permission bits an overwrite there denies the bot
    /// ([`FakeDiscord::deny_bot`]); carried in GUILD_CREATE and enforced.
    pub bot_denied: HashMap<u64, u64>,
    /// Requests answered 403 because the bot lacked a permission.
    pub forbidden: usize,
    /// GUILD_CREATE is not sent on IDENTIFY ([`FakeDiscord::hold_guilds`]).
    pub guilds_held: bool,
    /// How many of the next create-message calls answer 429.
    pub rate_limit_next: usize,
    /// Per channel: how many of the next create-message calls there answer 429.
    pub rate_limit_channel: HashMap<u64, usize>,
    /// Per channel: how many create-message calls there go through before
    /// its `rate_limit_channel` count applies.
    pub pass_before_limit: HashMap<u64, usize>,
    /// Per channel: every create-message call there answers 429 until then.
    pub rate_limit_until: HashMap<u64, tokio::time::Instant>,
    /// How long each create-message call takes before it is answered.
    pub post_delay: std::time::Duration,
    /// Per channel: create-message calls answered 429.
    pub rate_limited_on: HashMap<u64, usize>,
    /// Discord's per-route buckets for create-message, when enforced: at most
    /// this many posts per channel in each window, windows laid end to end
    /// from the instant given ([`FakeDiscord::enforce_buckets`]).
    pub bucket: Option<(usize, std::time::Duration, tokio::time::Instant)>,
    /// Per channel: the number of the window its last post fell in, and the
    /// posts made in that window.
    windows: HashMap<u64, (u128, usize)>,
    /// Per channel: posts refused because its bucket was empty (429 with the
    /// real headers, `Retry-After` included).
    pub bucket_429s: HashMap<u64, usize>,
    seq: u64,
    next_id: u64,
    /// Dispatches sent, for RESUME replays: (seq, payload).
    log: Vec<(u64, Value)>,
}

struct Shared {
    rec: Mutex<Recorded>,
    events: broadcast::Sender<Value>,
    /// Dropping every gateway connection on demand.
    kill: broadcast::Sender<()>,
    base: String,
    /// During an outage ([`FakeDiscord::go_down`]): every request on a
    /// connection still open answers 502, as Discord's edge does.
    down: std::sync::atomic::AtomicBool,
}

/// A running fake Discord.
pub struct FakeDiscord {
    shared: Arc<Shared>,
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
    app: Router,
}

/// A snowflake for the current time (Discord's epoch is 2015-01-01).
fn snowflake_now() -> u64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    (ms - 1_420_070_400_000) << 22
}

fn user(id: u64, name: &str, bot: bool) -> Value {
    json!({"id": id.to_string(), "username": name, "discriminator": "0", "global_name": name, "avatar": null, "bot": bot})
}

fn message_json(m: &Posted, author: Value) -> Value {
    json!({
        "id": m.id.to_string(),
        "channel_id": m.channel_id.to_string(),
        "author": author,
        "content": m.content,
        "timestamp": "2026-11-29T12:00:00.000000+00:00",
        "edited_timestamp": null,
        "tts": false,
        "mention_everyone": false,
        "mentions": [],
        "mention_roles": [],
        "attachments": [],
        "embeds": [],
        "pinned": false,
        "type": if m.reference.is_some() { 19 } else { 0 },
        "nonce": m.nonce,
        "message_reference": m.reference.map(|r| json!({"message_id": r.to_string(), "channel_id": m.channel_id.to_string()})),
    })
}

impl FakeDiscord {
    /// Starts the fake on a free loopback port; `channels` exist.
    pub async fn start(channels: &[u64]) -> FakeDiscord {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (events, _) = broadcast::channel(1024);
        let (kill, _) = broadcast::channel(4);
        let rec = Recorded {
            channels: channels.iter().copied().collect(),
            // Snowflakes of now, as Discord's are: a client may take an id
            // for a point in time.
            next_id: snowflake_now(),
            ..Recorded::default()
        };
        let shared = Arc::new(Shared {
            rec: Mutex::new(rec),
            events,
            kill,
            base: format!("127.0.0.1:{port}"),
            down: std::sync::atomic::AtomicBool::new(false),
        });
        let app = Router::new()
            .route("/api/v10/gateway", get(gateway_url))
            .route("/api/v10/gateway/bot", get(gateway_url))
            .route("/api/v10/users/@me", get(me))
            .route("/api/v10/channels/{channel}", get(get_channel))
            .route(
                "/api/v10/channels/{channel}/messages",
                post(create_message).get(list_messages),
            )
            .route(
                "/api/v10/channels/{channel}/messages/{message}/reactions/{emoji}",
                get(reaction_users),
            )
            .route(
                "/api/v10/channels/{channel}/messages/{message}",
                patch(edit_message),
            )
            .route(
                "/api/v10/channels/{channel}/messages/{message}/reactions/{emoji}/{user}",
                put(add_reaction).delete(delete_reaction),
            )
            .route("/gateway", get(gateway))
            .fallback(any(unexpected))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), edge))
            .with_state(shared.clone());
        let task = serve(listener, app.clone());
        FakeDiscord {
            shared,
            port,
            task,
            app,
        }
    }

    /// An outage: the port stops accepting, every gateway session is dropped,
    /// and requests on connections still open answer 502. What people do
    /// meanwhile is still recorded (Discord keeps working for them).
    pub async fn go_down(&mut self) {
        self.shared
            .down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.task.abort();
        let _ = (&mut self.task).await;
        let _ = self.shared.kill.send(());
    }

    /// The end of an outage: the same port accepts again.
    pub async fn come_up(&mut self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the local Discord cannot listen on its port {} again: {e}",
                        self.port
                    );
                    crate::real_sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        };
        self.task = serve(listener, self.app.clone());
        self.shared
            .down
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// `api_base` for the bridge.
    pub fn api_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `gateway_url` for the bridge.
    pub fn gateway_url(&self) -> String {
        format!("ws://127.0.0.1:{}/gateway", self.port)
    }

    /// Reads what was recorded.
    pub fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        f(&mut self.shared.rec.lock().unwrap())
    }

    /// Answers the next `n` create-message calls with 429.
    pub fn rate_limit(&self, n: usize) {
        self.with(|r| r.rate_limit_next = n);
    }

    /// The next `n` create-message calls to `channel` answer 429 (`usize::MAX`: all).
    pub fn rate_limit_channel(&self, channel: u64, n: usize) {
        self.with(|r| r.rate_limit_channel.insert(channel, n));
    }

    /// After `pass` more create-message calls to `channel` go through, the
    /// next `n` there answer 429.
    pub fn rate_limit_channel_after(&self, channel: u64, pass: usize, n: usize) {
        self.with(|r| {
            r.pass_before_limit.insert(channel, pass);
            r.rate_limit_channel.insert(channel, n)
        });
    }

    /// Every create-message call to `channel` answers 429 for `how_long` from now.
    pub fn rate_limit_channel_for(&self, channel: u64, how_long: std::time::Duration) {
        let until = tokio::time::Instant::now() + how_long;
        self.with(|r| r.rate_limit_until.insert(channel, until));
    }

    /// Sessions that identify from now on get READY but not the guild's
    /// GUILD_CREATE, until [`FakeDiscord::release_guilds`] (Discord sends it
    /// after READY, at a time of its choosing).
    pub fn hold_guilds(&self) {
        self.with(|r| r.guilds_held = true);
    }

    /// Sends the held GUILD_CREATE to every identified session.
    pub fn release_guilds(&self) {
        let guild = self.with(|r| {
            r.guilds_held = false;
            guild_json(r)
        });
        self.dispatch("GUILD_CREATE", guild);
    }

    /// An overwrite in `channel` denying the bot `bits` (of [`permission`]):
    /// in the GUILD_CREATE of every later session, and enforced with 403s.
    pub fn deny_bot(&self, channel: u64, bits: u64) {
        self.with(|r| *r.bot_denied.entry(channel).or_default() |= bits);
    }

    /// Enforces Discord's create-message buckets: `limit` posts per channel in
    /// each `window`, answered with the real `X-RateLimit-*` headers; a post
    /// to an empty bucket gets 429 with `Retry-After`, as from discord.com.
    ///
    /// Every channel's windows start now and follow each other on a fixed
    /// grid: the headers promise when a bucket refills, not where its window
    /// began, and a grid lets a test on paused time step to just past a
    /// refill ([`FakeDiscord::next_refill`]) however late the sender heard of it.
    pub fn enforce_buckets(&self, limit: usize, window: std::time::Duration) {
        assert!(!window.is_zero(), "a bucket window takes some time");
        self.with(|r| r.bucket = Some((limit, window, tokio::time::Instant::now())));
    }

    /// When every bucket next refills (enforced buckets only).
    pub fn next_refill(&self) -> tokio::time::Instant {
        let (_, window, from) = self.with(|r| r.bucket).expect("buckets enforced");
        window_at(from, window, tokio::time::Instant::now()).1
    }

    /// Sends a dispatch to every identified gateway session.
    pub fn dispatch(&self, t: &str, d: Value) {
        FakeRef(self.shared.clone()).dispatch(t, d);
    }

    /// Someone writes in a channel (optionally replying to `reference`). Returns the message id.
    pub fn user_message(
        &self,
        channel: u64,
        author: u64,
        name: &str,
        content: &str,
        reference: Option<u64>,
    ) -> u64 {
        let (id, mut d) = self.say(channel, author, name, content, reference);
        d["guild_id"] = json!("700000000000000001");
        d["member"] = json!({"roles": [], "joined_at": "2026-01-01T00:00:00.000000+00:00", "deaf": false, "mute": false, "flags": 0});
        self.dispatch("MESSAGE_CREATE", d);
        id
    }

    /// Someone writes to the bot in a direct message (no guild). Returns the message id.
    pub fn user_dm(&self, channel: u64, author: u64, name: &str, content: &str) -> u64 {
        self.with(|r| r.dm_channels.insert(channel));
        let (id, d) = self.say(channel, author, name, content, None);
        self.dispatch("MESSAGE_CREATE", d);
        id
    }

    /// Records a message someone wrote (kept for `GET …/messages`); returns
    /// its id and its JSON, to dispatch.
    fn say(
        &self,
        channel: u64,
        author: u64,
        name: &str,
        content: &str,
        reference: Option<u64>,
    ) -> (u64, Value) {
        let id = self.with(|r| {
            r.next_id = (r.next_id + 1).max(snowflake_now());
            r.next_id
        });
        let m = Posted {
            id,
            channel_id: channel,
            content: content.into(),
            nonce: None,
            enforce_nonce: false,
            reference,
            edits: vec![],
            allowed_mentions: vec![],
        };
        self.with(|r| r.said.push((m.clone(), user(author, name, false))));
        (id, message_json(&m, user(author, name, false)))
    }

    /// Someone reacts to a message.
    pub fn user_reaction(&self, channel: u64, message: u64, user_id: u64, emoji: &str) {
        self.with(|r| r.user_reactions.push((message, emoji.to_string(), user_id)));
        self.reaction_event(channel, message, user_id, emoji, false);
    }

    /// Someone adds a super (burst) reaction: the gateway says `burst`, and
    /// the REST list has it under `type=1` only.
    pub fn user_burst_reaction(&self, channel: u64, message: u64, user_id: u64, emoji: &str) {
        self.with(|r| {
            r.burst_reactions
                .push((message, emoji.to_string(), user_id))
        });
        self.reaction_event(channel, message, user_id, emoji, true);
    }

    fn reaction_event(&self, channel: u64, message: u64, user_id: u64, emoji: &str, burst: bool) {
        self.dispatch(
            "MESSAGE_REACTION_ADD",
            json!({
                "user_id": user_id.to_string(),
                "channel_id": channel.to_string(),
                "message_id": message.to_string(),
                "guild_id": "700000000000000001",
                "emoji": {"id": null, "name": emoji},
                "burst": burst,
                "type": u8::from(burst),
            }),
        );
    }

    /// The next create-message call, to whatever channel, draws a global 429
    /// (`X-RateLimit-Global`) that holds every route for `retry_after`.
    pub fn rate_limit_globally(&self, retry_after: std::time::Duration) {
        self.with(|r| r.global_next = Some(retry_after));
    }

    /// Drops every gateway connection (the client must reconnect and resume).
    pub fn drop_gateway(&self) {
        let _ = self.shared.kill.send(());
    }

    /// Whether a session has identified (dispatches will reach it).
    pub fn identified(&self) -> bool {
        self.with(|r| r.identifies > 0)
    }
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The number of the bucket window `now` falls in, windows of `window` laid
/// end to end from `from`, and when it ends.
fn window_at(
    from: tokio::time::Instant,
    window: std::time::Duration,
    now: tokio::time::Instant,
) -> (u128, tokio::time::Instant) {
    let number = now.duration_since(from).as_nanos() / window.as_nanos();
    let ends = window.as_nanos() * (number + 1);
    (number, from + std::time::Duration::from_nanos(ends as u64))
}

/// A 429 as discord.com answers it: `retry_after` in the body and in the
/// `Retry-After` header, the global flag in both, and the bucket's headers.
fn limited(retry_after: f64, global: bool, bucket: &[(&'static str, String)]) -> Response {
    let mut response = (
        StatusCode::TOO_MANY_REQUESTS,
        Json(json!({"message": "You are being rate limited.", "retry_after": retry_after, "global": global, "code": 0})),
    )
        .into_response();
    let h = response.headers_mut();
    h.insert("retry-after", format!("{retry_after:.3}").parse().unwrap());
    if global {
        h.insert("x-ratelimit-global", "true".parse().unwrap());
        h.insert("x-ratelimit-scope", "global".parse().unwrap());
    }
    for (k, v) in bucket {
        h.insert(*k, v.parse().unwrap());
    }
    response
}

fn serve(listener: tokio::net::TcpListener, app: Router) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// Discord's edge: a 502 for every request while the fake is down.
async fn edge(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.down.load(std::sync::atomic::Ordering::SeqCst) {
        return error(StatusCode::BAD_GATEWAY, 0, "502: Bad Gateway");
    }
    s.rec.lock().unwrap().requests += 1;
    next.run(request).await
}

/// The guild as GUILD_CREATE carries it: @everyone's permissions, the
/// channels with the overwrites denying the bot, and the bot's own member.
fn guild_json(rec: &Recorded) -> Value {
    let channels: Vec<Value> = rec
        .channels
        .iter()
        .filter(|c| !rec.dm_channels.contains(c))
        .map(|c| {
            let overwrites: Vec<Value> = rec
                .bot_denied
                .get(c)
                .map(|deny| json!({"id": BOT_ID.to_string(), "type": 1, "allow": "0", "deny": deny.to_string()}))
                .into_iter()
                .collect();
            json!({"id": c.to_string(), "type": 0, "name": format!("channel-{c}"), "position": 0, "permission_overwrites": overwrites})
        })
        .collect();
    json!({
        "id": GUILD.to_string(), "name": "cowboy", "icon": null, "splash": null,
        "discovery_splash": null, "owner_id": "1", "verification_level": 0,
        "default_message_notifications": 0, "explicit_content_filter": 0,
        "roles": [{"id": GUILD.to_string(), "name": "@everyone", "color": 0,
            "colors": {"primary_color": 0, "secondary_color": null, "tertiary_color": null},
            "hoist": false, "managed": false, "mentionable": false, "position": 0,
            "permissions": permission::EVERYONE.to_string(), "icon": null, "unicode_emoji": null, "flags": 0}],
        "emojis": [], "features": [], "mfa_level": 0, "application_id": null,
        "system_channel_id": null, "system_channel_flags": 0, "rules_channel_id": null,
        "premium_tier": 0, "preferred_locale": "en-US", "nsfw_level": 0, "stickers": [],
        "premium_progress_bar_enabled": false, "joined_at": "2026-01-01T00:00:00.000000+00:00",
        "large": false, "unavailable": false, "member_count": 1, "voice_states": [],
        "members": [{"user": user(BOT_ID, "cowboy-bot", true), "roles": [],
            "joined_at": "2026-01-01T00:00:00.000000+00:00", "deaf": false, "mute": false, "flags": 0}],
        "channels": channels, "threads": [], "presences": [], "stage_instances": [],
        "guild_scheduled_events": [],
    })
}

/// Whether the bot may do `bits` in `channel`; a 403 is counted when not.
fn bot_may(rec: &mut Recorded, channel: u64, bits: u64) -> bool {
    let denied = rec.bot_denied.get(&channel).copied().unwrap_or(0);
    let may = denied & bits == 0;
    if !may {
        rec.forbidden += 1;
    }
    may
}

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bot {TOKEN}"))
}

fn error(status: StatusCode, code: u64, message: &str) -> Response {
    (status, Json(json!({"message": message, "code": code}))).into_response()
}

async fn gateway_url(State(s): State<Arc<Shared>>) -> Json<Value> {
    Json(
        json!({"url": format!("ws://{}/gateway", s.base), "shards": 1, "session_start_limit": {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}}),
    )
}

async fn me(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    s.rec.lock().unwrap().me_calls += 1;
    Json(user(BOT_ID, "cowboy-bot", true)).into_response()
}

async fn create_message(
    State(s): State<Arc<Shared>>,
    Path(channel): Path<u64>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let delay = s.rec.lock().unwrap().post_delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut rec = s.rec.lock().unwrap();
    rec.post_times.push(tokio::time::Instant::now());
    if let Some(wait) = rec.global_next.take() {
        rec.global_429s.push((tokio::time::Instant::now(), wait));
        rec.rate_limited += 1;
        return limited(wait.as_secs_f64(), true, &[]);
    }
    let passes = rec
        .pass_before_limit
        .get_mut(&channel)
        .is_some_and(|p| p.checked_sub(1).map(|left| *p = left).is_some());
    let channel_limited = !passes && rec.rate_limit_channel.get(&channel).is_some_and(|n| *n > 0)
        || rec
            .rate_limit_until
            .get(&channel)
            .is_some_and(|t| tokio::time::Instant::now() < *t);
    if channel_limited {
        if let Some(n) = rec.rate_limit_channel.get_mut(&channel) {
            *n = n.saturating_sub(if *n == usize::MAX { 0 } else { 1 });
        }
        rec.rate_limited += 1;
        *rec.rate_limited_on.entry(channel).or_default() += 1;
        return limited(0.2, false, &[]);
    }
    if rec.rate_limit_next > 0 {
        rec.rate_limit_next -= 1;
        rec.rate_limited += 1;
        return limited(0.2, false, &[]);
    }
    if !rec.channels.contains(&channel) {
        rec.invalid += 1;
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    }
    // The bucket's headers, on every answer while buckets are enforced.
    let mut bucket_headers = Vec::new();
    if let Some((limit, window, from)) = rec.bucket {
        let now = tokio::time::Instant::now();
        let (number, refill) = window_at(from, window, now);
        let (at, used) = rec.windows.entry(channel).or_insert((number, 0));
        if *at != number {
            (*at, *used) = (number, 0);
        }
        // Rounded up to the millisecond the headers show: a sender that
        // waits what they say never asks before the refill.
        let reset_after = ((refill - now).as_secs_f64() * 1000.0).ceil() / 1000.0;
        let unix_reset = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            + reset_after;
        let full = *used >= limit;
        if !full {
            *used += 1;
        }
        let remaining = limit - (*used).min(limit);
        bucket_headers = vec![
            ("x-ratelimit-limit", limit.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-reset", format!("{unix_reset:.3}")),
            ("x-ratelimit-reset-after", format!("{reset_after:.3}")),
            ("x-ratelimit-bucket", format!("create-message-{channel}")),
        ];
        if full {
            *rec.bucket_429s.entry(channel).or_default() += 1;
            rec.rate_limited += 1;
            bucket_headers.push(("x-ratelimit-scope", "user".into()));
            return limited(reset_after, false, &bucket_headers);
        }
    }
    let content = body["content"].as_str().unwrap_or("").to_string();
    if content.encode_utf16().count() > 2000 {
        return error(
            StatusCode::BAD_REQUEST,
            50035,
            "Invalid Form Body: content too long",
        );
    }
    let nonce = match &body["nonce"] {
        Value::String(n) => Some(n.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let enforce = body["enforce_nonce"].as_bool().unwrap_or(false);
    if let (true, Some(n)) = (enforce, &nonce) {
        if let Some(existing) = rec
            .posted
            .iter()
            .find(|p| p.channel_id == channel && p.nonce.as_deref() == Some(n))
            .cloned()
        {
            rec.nonce_hits += 1;
            return Json(message_json(&existing, user(BOT_ID, "cowboy-bot", true))).into_response();
        }
    }
    rec.next_id = (rec.next_id + 1).max(snowflake_now());
    let reference = body["message_reference"]["message_id"]
        .as_str()
        .and_then(|s| s.parse().ok());
    let m = Posted {
        id: rec.next_id,
        channel_id: channel,
        content,
        nonce,
        enforce_nonce: enforce,
        reference,
        edits: vec![],
        allowed_mentions: vec![body["allowed_mentions"].clone()],
    };
    rec.posted.push(m.clone());
    drop(rec);
    let json = message_json(&m, user(BOT_ID, "cowboy-bot", true));
    // Discord tells the gateway about the bot's own messages too.
    let fake = FakeRef(s.clone());
    fake.dispatch("MESSAGE_CREATE", json.clone());
    let mut response = Json(json).into_response();
    for (k, v) in bucket_headers {
        response.headers_mut().insert(k, v.parse().unwrap());
    }
    response
}

async fn edit_message(
    State(s): State<Arc<Shared>>,
    Path((channel, message)): Path<(u64, u64)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let mut rec = s.rec.lock().unwrap();
    let Some(m) = rec
        .posted
        .iter_mut()
        .find(|p| p.id == message && p.channel_id == channel)
    else {
        return error(StatusCode::NOT_FOUND, 10008, "Unknown Message");
    };
    if let Some(c) = body["content"].as_str() {
        m.content = c.to_string();
        m.edits.push(c.to_string());
        m.allowed_mentions.push(body["allowed_mentions"].clone());
    }
    let m = m.clone();
    Json(message_json(&m, user(BOT_ID, "cowboy-bot", true))).into_response()
}

async fn add_reaction(
    State(s): State<Arc<Shared>>,
    Path((channel, message, emoji, who)): Path<(u64, u64, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) || who != "@me" {
        return error(StatusCode::FORBIDDEN, 50013, "Missing Permissions");
    }
    s.rec
        .lock()
        .unwrap()
        .reactions
        .push((message, emoji.clone(), BOT_ID));
    // The gateway reports the bot's own reaction, as Discord does.
    FakeRef(s.clone()).dispatch(
        "MESSAGE_REACTION_ADD",
        json!({"user_id": BOT_ID.to_string(), "channel_id": channel.to_string(), "message_id": message.to_string(), "emoji": {"id": null, "name": emoji}, "burst": false, "type": 0}),
    );
    StatusCode::NO_CONTENT.into_response()
}

async fn delete_reaction(
    State(s): State<Arc<Shared>>,
    Path((channel, message, emoji, who)): Path<(u64, u64, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let uid = if who == "@me" {
        BOT_ID
    } else {
        who.parse().unwrap_or(0)
    };
    let mut rec = s.rec.lock().unwrap();
    if uid != BOT_ID && !bot_may(&mut rec, channel, permission::MANAGE_MESSAGES) {
        return error(StatusCode::FORBIDDEN, 50013, "Missing Permissions");
    }
    rec.user_reactions
        .retain(|(m, e, u)| !(*m == message && *e == emoji && *u == uid));
    rec.removed.push((message, emoji, uid));
    StatusCode::NO_CONTENT.into_response()
}

/// A list request's page: `limit` (Discord's default for the route when
/// absent) and `after` (an id; 0 when absent).
fn page(q: &HashMap<String, String>, default: usize) -> (usize, u64) {
    let limit = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(default);
    let after = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    (limit, after)
}

/// `GET /channels/{c}/messages/{m}/reactions/{emoji}?limit&after`: who reacted
/// so, in user id order, `limit` (default 25) after `after`.
async fn reaction_users(
    State(s): State<Arc<Shared>>,
    Path((channel, message, emoji)): Path<(u64, u64, String)>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let (limit, after) = page(&q, 25);
    let burst = q.get("type").map(String::as_str) == Some("1");
    let mut rec = s.rec.lock().unwrap();
    let read = permission::VIEW_CHANNEL | permission::READ_MESSAGE_HISTORY;
    if !bot_may(&mut rec, channel, read) {
        return error(StatusCode::FORBIDDEN, 50001, "Missing Access");
    }
    rec.reads += 1;
    let listed: Vec<&(u64, String, u64)> = match burst {
        true => rec.burst_reactions.iter().collect(),
        false => rec.reactions.iter().chain(&rec.user_reactions).collect(),
    };
    let mut ids: Vec<u64> = listed
        .into_iter()
        .filter(|(m, e, u)| *m == message && *e == emoji && *u > after)
        .map(|(_, _, u)| *u)
        .collect();
    ids.sort();
    ids.dedup();
    let users: Vec<Value> = ids
        .into_iter()
        .take(limit)
        .map(|u| user(u, &format!("user{u}"), u == BOT_ID))
        .collect();
    Json(Value::Array(users)).into_response()
}

/// `GET /channels/{c}/messages?after&limit`: the `limit` (default 50) oldest
/// messages after `after`, newest first as Discord lists them.
async fn list_messages(
    State(s): State<Arc<Shared>>,
    Path(channel): Path<u64>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let (limit, after) = page(&q, 50);
    let mut rec = s.rec.lock().unwrap();
    if !bot_may(&mut rec, channel, permission::VIEW_CHANNEL) {
        return error(StatusCode::FORBIDDEN, 50001, "Missing Access");
    }
    rec.reads += 1;
    // As Discord: without Read Message History, an empty list.
    let history =
        rec.bot_denied.get(&channel).copied().unwrap_or(0) & permission::READ_MESSAGE_HISTORY == 0;
    let bot = user(BOT_ID, "cowboy-bot", true);
    let mut all: Vec<(u64, Value)> = rec
        .posted
        .iter()
        .map(|p| (p, bot.clone()))
        .chain(rec.said.iter().map(|(p, a)| (p, a.clone())))
        .filter(|(p, _)| history && p.channel_id == channel && p.id > after)
        .map(|(p, a)| (p.id, message_json(p, a)))
        .collect();
    all.sort_by_key(|(id, _)| *id);
    all.truncate(limit);
    all.reverse();
    Json(Value::Array(all.into_iter().map(|(_, m)| m).collect())).into_response()
}

/// `GET /channels/{c}`: its id and type (1 for a DM, 0 for a guild text channel).
async fn get_channel(
    State(s): State<Arc<Shared>>,
    Path(channel): Path<u64>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, 0, "401: Unauthorized");
    }
    let rec = s.rec.lock().unwrap();
    if !rec.channels.contains(&channel) {
        return error(StatusCode::NOT_FOUND, 10003, "Unknown Channel");
    }
    let kind = u8::from(rec.dm_channels.contains(&channel));
    Json(json!({"id": channel.to_string(), "type": kind})).into_response()
}

async fn unexpected(State(s): State<Arc<Shared>>, req: axum::extract::Request) -> Response {
    s.rec
        .lock()
        .unwrap()
        .unexpected
        .push(format!("{} {}", req.method(), req.uri()));
    error(StatusCode::NOT_FOUND, 0, "404: Not Found")
}

/// Dispatch helper usable from handlers.
struct FakeRef(Arc<Shared>);

impl FakeRef {
    fn dispatch(&self, t: &str, d: Value) {
        let payload = {
            let mut rec = self.0.rec.lock().unwrap();
            rec.seq += 1;
            let p = json!({"op": 0, "t": t, "s": rec.seq, "d": d});
            let seq = rec.seq;
            rec.log.push((seq, p.clone()));
            p
        };
        let _ = self.0.events.send(payload);
    }
}

async fn gateway(State(s): State<Arc<Shared>>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| session(s, socket))
}

async fn session(s: Arc<Shared>, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    let hello = json!({"op": 10, "d": {"heartbeat_interval": 2000}});
    if tx
        .send(WsMessage::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    let mut events = s.events.subscribe();
    let mut kill = s.kill.subscribe();
    let mut live = false;
    loop {
        tokio::select! {
            _ = kill.recv() => {
                // Abrupt drop, as a network failure would be.
                return;
            }
            ev = events.recv(), if live => {
                match ev {
                    Ok(p) => if tx.send(WsMessage::Text(p.to_string().into())).await.is_err() { return },
                    Err(_) => return,
                }
            }
            msg = rx.next() => {
                let Some(Ok(msg)) = msg else { return };
                let WsMessage::Text(text) = msg else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                match v["op"].as_u64() {
                    Some(1) => {
                        s.rec.lock().unwrap().heartbeats += 1;
                        if tx.send(WsMessage::Text(json!({"op": 11}).to_string().into())).await.is_err() { return }
                    }
                    Some(2) => {
                        if v["d"]["token"].as_str() != Some(TOKEN) && v["d"]["token"].as_str() != Some(&format!("Bot {TOKEN}")) {
                            let _ = tx.send(WsMessage::Close(Some(axum::extract::ws::CloseFrame { code: 4004, reason: "Authentication failed.".into() }))).await;
                            return;
                        }
                        let ready = {
                            let mut rec = s.rec.lock().unwrap();
                            rec.identifies += 1;
                            rec.seq += 1;
                            json!({"op": 0, "t": "READY", "s": rec.seq, "d": {
                                "v": 10,
                                "user": {"id": BOT_ID.to_string(), "username": "cowboy-bot", "discriminator": "0", "global_name": null, "avatar": null, "bot": true, "verified": true, "mfa_enabled": false, "flags": 0},
                                "guilds": [{"id": GUILD.to_string(), "unavailable": true}],
                                "session_id": "fake-session",
                                "resume_gateway_url": format!("ws://{}/gateway", s.base),
                                "application": {"id": "800000000000000001", "flags": 0},
                            }})
                        };
                        if tx.send(WsMessage::Text(ready.to_string().into())).await.is_err() { return }
                        let guild = {
                            let mut rec = s.rec.lock().unwrap();
                            (!rec.guilds_held).then(|| {
                                rec.seq += 1;
                                json!({"op": 0, "t": "GUILD_CREATE", "s": rec.seq, "d": guild_json(&rec)})
                            })
                        };
                        if let Some(guild) = guild {
                            if tx.send(WsMessage::Text(guild.to_string().into())).await.is_err() { return }
                        }
                        live = true;
                    }
                    Some(6) => {
                        // The replay below covers whatever the subscription buffered.
                        while events.try_recv().is_ok() {}
                        let after = v["d"]["seq"].as_u64().unwrap_or(0);
                        let (resumed, replay) = {
                            let mut rec = s.rec.lock().unwrap();
                            rec.resumes += 1;
                            let replay: Vec<Value> = rec.log.iter().filter(|(q, _)| *q > after).map(|(_, p)| p.clone()).collect();
                            rec.seq += 1;
                            (json!({"op": 0, "t": "RESUMED", "s": rec.seq, "d": {}}), replay)
                        };
                        for p in replay.into_iter().chain([resumed]) {
                            if tx.send(WsMessage::Text(p.to_string().into())).await.is_err() { return }
                        }
                        live = true;
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Every create-message the bridge made in `channel`, in order.
pub fn contents(rec: &Recorded, channel: u64) -> Vec<String> {
    rec.posted
        .iter()
        .filter(|p| p.channel_id == channel)
        .map(|p| p.content.clone())
        .collect()
}

/// A message id → its content.
pub fn by_id(rec: &Recorded) -> HashMap<u64, Posted> {
    rec.posted.iter().map(|p| (p.id, p.clone())).collect()
}
