//! The approval page (`cowboy web`) and the metrics exporter (`cowboy exporter`).
//!
//! # Layout (each module states its invariants)
//!
//! - [`session`]: signed session cookies and CSRF tokens.
//! - [`auth`]: the users of `[web.users]`, Argon2 checks, failed-login slow-down.
//! - [`pages`]: the server-rendered HTML.
//! - [`metrics`]: the `/metrics` route.
//!
//! Invariants of the handlers:
//! - A `GET` never changes state: link scanners and prefetchers cannot decide.
//! - Every `POST` carries the CSRF token of its session (or, for the login, of
//!   its pre-login cookie), or it is refused before anything is read.
//! - A logged-in user decides as approver `web:NAME` through the broker's own
//!   functions ([`broker::approval::decide`], [`broker::approval::edit::edit`]),
//!   applied by the requesting bridge's outbox from the page's request stream
//!   ([`broker::request`]): the page's Redis user cannot write a record,
//!   a decision or a trail,
//!   so the approvers list, the window, quorum and edits apply exactly as on
//!   every other surface; a decision is bound to the digest the page showed.
//! - Every response carries a strict Content-Security-Policy (no inline script,
//!   no framing), `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`.

pub mod auth;
pub mod metrics;
pub mod pages;
pub mod session;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Form, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use broker::approval::{self, field, Answer, Approvals, Outcome, State as ApprovalState, Verdict};
use broker::config::{Config, RedisConfig};
use broker::identity::Identity;
use broker::{audit, keys, Clock, Shutdown, Store};

use session::{Keys, Session, LOGIN_COOKIE, SESSION_COOKIE};

/// What a process of this crate serves, which decides its Redis user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The page (`cowboy-web`): reads, and asks for decisions.
    Page,
    /// `/metrics` alone (`cowboy-exporter`): reads only. Never the page's
    /// user, whose password asks for decisions.
    Exporter,
}

/// The Redis connection settings of the page: its own user when it has one;
/// `COWBOY_REDIS_USERNAME` / `COWBOY_REDIS_PASSWORD_FILE` override, as for
/// every service.
pub fn redis_config(config: &Config) -> RedisConfig {
    redis_config_for(config, Role::Page)
}

/// The Redis connection settings of `role`: its own user when it has one,
/// else `[redis]`; the environment overrides as for every service.
pub fn redis_config_for(config: &Config, role: Role) -> RedisConfig {
    let own = config.web.as_ref().and_then(|w| match role {
        Role::Page => w.redis_password_file.clone().map(|f| (keys::WEB_USER, f)),
        Role::Exporter => w
            .exporter_password_file
            .clone()
            .map(|f| (keys::EXPORTER_USER, f)),
    });
    let mut redis = match own {
        Some((user, file)) => RedisConfig {
            username: Some(user.to_string()),
            password_file: Some(file),
            ..config.redis.clone()
        },
        None => config.redis.clone(),
    };
    if let Ok(user) = std::env::var("COWBOY_REDIS_USERNAME") {
        redis.username = Some(user);
    }
    if let Ok(file) = std::env::var("COWBOY_REDIS_PASSWORD_FILE") {
        redis.password_file = Some(file.into());
    }
    redis
}

/// Everything a handler needs.
pub struct App {
    pub config: Arc<Config>,
    pub store: Store,
    pub keys: Keys,
    pub users: auth::Users,
    pub clock: Clock,
    pub counters: metrics::Counters,
    /// Whose Redis user it connects as.
    pub role: Role,
    secure: bool,
    session_secs: u64,
    /// Live-update streams at once: each holds a Redis connection.
    streams: Arc<tokio::sync::Semaphore>,
    /// Live-update streams per user, so no user holds them all.
    streams_by_user: Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

/// One user's hold on a live-update stream, released when the stream ends.
struct UserStream {
    by_user: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    user: String,
}

impl UserStream {
    /// Takes one of `user`'s streams, if one is free: [`MAX_STREAMS_PER_USER`]
    /// for an approver of some bridge, one for a user who only looks.
    fn take(app: &App, user: &str) -> Option<UserStream> {
        let identity = Identity::web(user);
        let approver = app
            .config
            .bridges
            .values()
            .any(|b| b.approval.allows(&identity));
        let most = if approver { MAX_STREAMS_PER_USER } else { 1 };
        let mut by_user = app.streams_by_user.lock().ok()?;
        let n = by_user.entry(user.to_string()).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(UserStream {
            by_user: app.streams_by_user.clone(),
            user: user.to_string(),
        })
    }
}

impl Drop for UserStream {
    fn drop(&mut self) {
        if let Ok(mut by_user) = self.by_user.lock() {
            if let Some(n) = by_user.get_mut(&self.user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_user.remove(&self.user);
                }
            }
        }
    }
}

type Shared = Arc<App>;

/// Live-update streams served at once (each holds a Redis connection); the
/// page works without them, it only stops updating by itself.
const MAX_STREAMS: usize = 64;
/// Live-update streams one user may hold (a few tabs and devices).
const MAX_STREAMS_PER_USER: usize = 4;

/// The longest reason a page accepts (it goes to the agent and the trail).
const MAX_REASON_BYTES: usize = 2000;

impl App {
    /// Loads users and keys from the config's `[web]` (refusing a bad one
    /// with the key named) and connects to Redis.
    pub async fn new(config: Arc<Config>, clock: Clock) -> broker::Result<App> {
        App::new_for(config, clock, Role::Page).await
    }

    /// As [`App::new`], connecting as `role`'s Redis user.
    pub async fn new_for(config: Arc<Config>, clock: Clock, role: Role) -> broker::Result<App> {
        // Everything but Redis is the `[web]` table: a failure there is the
        // config's (exit 78); Redis being away is not (69).
        let bad = |message: String| broker::error::ConfigError::invalid("web", message);
        let web = config
            .web
            .clone()
            .ok_or_else(|| bad("no [web] table in the config: nothing to serve".into()))?;
        let keys = Keys::load(web.session_key_file.as_deref()).map_err(bad)?;
        let users = auth::Users::load(&web).map_err(bad)?;
        let store = Store::connect(&redis_config_for(&config, role)).await?;
        Ok(App {
            config,
            store,
            keys,
            users,
            clock,
            counters: metrics::Counters::default(),
            role,
            secure: web.secure_cookies,
            session_secs: web.session_hours * 3600,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            streams_by_user: Arc::default(),
        })
    }

    /// The session a request carries: a cookie that verifies and has not
    /// expired, of a user still in the config, and issued by this page and not
    /// revoked since (its record in Redis, which logout deletes, names the user
    /// and the fingerprint of the password hash it was issued under, so a
    /// changed password ends every earlier session).
    async fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let cookies = headers.get(header::COOKIE)?.to_str().ok()?;
        let value = session::cookie(cookies, SESSION_COOKIE)?;
        let s = self.keys.verify(value, self.clock.now_secs_f64())?;
        // A user removed from the config is logged out.
        let fingerprint = self.users.fingerprint(&s.user)?;
        let mut store = self.store.clone();
        let record: Option<String> =
            redis::AsyncCommands::get(&mut store.conn, keys::web_session(&s.nonce))
                .await
                .ok()?;
        (record? == session_record(&s.user, &fingerprint)).then_some(s)
    }

    fn cookie(&self, name: &str, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        ))
        .expect("cookie values are ASCII")
    }
}

/// The page's router (the metrics route included).
pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(queue))
        .route("/queue", get(queue_fragment))
        .route("/events", get(events))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/approval/{id}", get(detail))
        .route("/approval/{id}/decide", post(decide))
        .route("/approval/{id}/edit", post(edit))
        .route(
            "/static/app.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css")], pages::CSS) }),
        )
        .route(
            "/static/app.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], pages::JS) }),
        )
        .route("/metrics", get(metrics_route))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(app)
}

/// The exporter's router: `/metrics` alone.
pub fn exporter_router(app: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics_route))
        .with_state(app)
}

async fn secure_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// Serves the page on `listener` until `shutdown`; the audit tail for the
/// metrics runs beside it.
pub async fn serve(
    app: App,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
    with_page: bool,
) -> std::io::Result<()> {
    let app = Arc::new(app);
    let tail = tokio::spawn(metrics::tail(
        app.config.clone(),
        app.counters.clone(),
        shutdown.clone(),
        app.role,
    ));
    let router = if with_page {
        router(app)
    } else {
        exporter_router(app)
    };
    let stop = shutdown.clone();
    // The peer's address: failed logins are counted per client.
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { stop.wait().await })
    .await;
    tail.abort();
    served
}

fn page(status: StatusCode, markup: maud::Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

fn to_login() -> Response {
    Redirect::to("/login").into_response()
}

fn refused(why: &str) -> Response {
    page(StatusCode::FORBIDDEN, pages::error("refused", why))
}

fn not_found() -> Response {
    page(
        StatusCode::NOT_FOUND,
        pages::error("not found", "No such approval."),
    )
}

/// What every POST about approval `id` passes first: a session, its CSRF
/// token, an id that can be one. Nothing is read before.
/// What a session's record in Redis holds.
fn session_record(user: &str, fingerprint: &str) -> String {
    format!("{user}|{fingerprint}")
}

async fn checked_post(
    app: &App,
    headers: &HeaderMap,
    id: &str,
    form: &HashMap<String, String>,
) -> Result<Session, Box<Response>> {
    let Some(s) = app.session(headers).await else {
        return Err(Box::new(to_login()));
    };
    if !csrf_ok(app, &s, form) {
        return Err(Box::new(refused("missing or wrong CSRF token")));
    }
    if !approval::is_id(id) {
        return Err(Box::new(not_found()));
    }
    Ok(s)
}

/// The CSRF check of a form posted in `session`.
fn csrf_ok(app: &App, session: &Session, form: &HashMap<String, String>) -> bool {
    form.get("csrf")
        .is_some_and(|t| session::same(t, &app.keys.csrf(session)))
}

async fn login_form(State(app): State<Shared>) -> Response {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let csrf = app.keys.login_csrf(&token);
    let mut r = page(StatusCode::OK, pages::login(&csrf, None));
    r.headers_mut()
        .append(header::SET_COOKIE, app.cookie(LOGIN_COOKIE, &token, 600));
    r
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
}

/// Who is logging in, as far as failed logins are counted: the peer, or the
/// address a trusted proxy (`[web] trusted_proxies`) says it forwarded for
/// (the rightmost `X-Forwarded-For` entry that is not a trusted proxy itself).
fn client_of(app: &App, peer: std::net::IpAddr, headers: &HeaderMap) -> std::net::IpAddr {
    // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d.
    let peer = peer.to_canonical();
    let trusted = |ip: &std::net::IpAddr| {
        app.config.web.as_ref().is_some_and(|w| {
            w.trusted_proxies
                .iter()
                .filter_map(|t| t.parse::<std::net::IpAddr>().ok())
                .any(|t| t.to_canonical() == *ip)
        })
    };
    if !trusted(&peer) {
        return peer;
    }
    let entries: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    // From the right: our proxies' entries are skipped; the first other one
    // is the client. An entry that does not parse ends the walk at the last
    // proxy, never at an address the client wrote itself.
    let mut client = peer;
    for entry in entries.into_iter().rev() {
        match entry.parse::<std::net::IpAddr>() {
            Ok(ip) => {
                let ip = ip.to_canonical();
                if trusted(&ip) {
                    client = ip;
                    continue;
                }
                return ip;
            }
            Err(_) => return client,
        }
    }
    client
}

async fn login(
    State(app): State<Shared>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let pre = headers
        .get(header::COOKIE)
        .and_then(|c| c.to_str().ok())
        .and_then(|c| session::cookie(c, LOGIN_COOKIE))
        .unwrap_or("");
    if pre.is_empty() || !session::same(&f.csrf, &app.keys.login_csrf(pre)) {
        return refused("the login form expired or came from elsewhere; open /login again");
    }
    let now = app.clock.now_secs_f64();
    let client = client_of(&app, peer.ip(), &headers);
    match app.users.check(&f.user, &f.password, now, client).await {
        auth::Login::Ok => {
            let value = app.keys.session(&f.user, now as u64 + app.session_secs);
            // Issued here, so revocable: logout and a changed password end it.
            let Some(s) = app.keys.verify(&value, now) else {
                return refused("the session could not be made");
            };
            let fingerprint = app.users.fingerprint(&f.user).unwrap_or_default();
            let mut store = app.store.clone();
            let recorded: redis::RedisResult<()> = redis::AsyncCommands::set_ex(
                &mut store.conn,
                keys::web_session(&s.nonce),
                session_record(&f.user, &fingerprint),
                app.session_secs.max(1),
            )
            .await;
            if let Err(e) = recorded {
                return failed(broker::Error::from_redis("SET web session", e));
            }
            let mut r = Redirect::to("/").into_response();
            r.headers_mut().append(
                header::SET_COOKIE,
                app.cookie(SESSION_COOKIE, &value, app.session_secs),
            );
            r.headers_mut()
                .append(header::SET_COOKIE, app.cookie(LOGIN_COOKIE, "", 0));
            tracing::info!(user = ?f.user, "web login");
            r
        }
        auth::Login::Wrong => {
            tracing::warn!(user = ?f.user, "web login refused");
            page(
                StatusCode::UNAUTHORIZED,
                pages::login(&f.csrf, Some("Wrong user or password.")),
            )
        }
        auth::Login::Locked(secs) => {
            tracing::warn!(user = ?f.user, "web login refused: locked");
            let mut r = page(
                StatusCode::TOO_MANY_REQUESTS,
                pages::login(
                    &f.csrf,
                    Some(&format!("Too many failed logins: try again in {secs} s.")),
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            r
        }
    }
}

async fn logout(
    State(app): State<Shared>,
    headers: HeaderMap,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let Some(s) = app.session(&headers).await else {
        return to_login();
    };
    if !csrf_ok(&app, &s, &f) {
        return refused("missing or wrong CSRF token");
    }
    // The cookie may have been copied: the session ends here, not in the browser.
    let mut store = app.store.clone();
    let revoked: redis::RedisResult<()> =
        redis::AsyncCommands::del(&mut store.conn, keys::web_session(&s.nonce)).await;
    if let Err(e) = revoked {
        return failed(broker::Error::from_redis("DEL web session", e));
    }
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut()
        .append(header::SET_COOKIE, app.cookie(SESSION_COOKIE, "", 0));
    r
}

/// The pending approvals of every bridge that asks, oldest first.
async fn rows(app: &App) -> Result<Vec<pages::Row>, broker::Error> {
    let mut store = app.store.clone();
    let ids = approval::pending_ids(&mut store, &app.config).await?;
    let shown = [
        field::STATUS,
        field::EXPIRES_AT,
        field::SETTLED_AT,
        field::CREATED_AT,
        field::SOURCE,
        field::CHANNEL_ID,
        field::AGENT,
        field::CONTENT_BYTES,
        field::QUORUM,
        field::APPROVALS,
        field::ENTRY_ID,
    ];
    let records = Approvals::on(&mut store)
        .load_fields_many(&ids, &shown)
        .await?;
    let now = app.clock.now_secs_f64();
    let mut rows: Vec<pages::Row> = records
        .into_iter()
        .flatten()
        .filter(|r| !r.is_settled())
        .map(|r| pages::Row {
            state: r.state(now),
            record: r,
            now,
        })
        .filter(|row| row.state == ApprovalState::Pending)
        .collect();
    rows.sort_by(|a, b| {
        (a.record.created_at, &a.record.entry_id).cmp(&(b.record.created_at, &b.record.entry_id))
    });
    Ok(rows)
}

fn failed(e: broker::Error) -> Response {
    tracing::warn!(error = %e, "web: Redis");
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::error("unavailable", "Redis could not be read; try again."),
    )
}

async fn queue(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let Some(s) = app.session(&headers).await else {
        return to_login();
    };
    match rows(&app).await {
        Ok(rows) => page(
            StatusCode::OK,
            pages::queue(&s.user, &app.keys.csrf(&s), &rows),
        ),
        Err(e) => failed(e),
    }
}

async fn queue_fragment(State(app): State<Shared>, headers: HeaderMap) -> Response {
    if app.session(&headers).await.is_none() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    match rows(&app).await {
        Ok(rows) => Html(pages::queue_table(&rows).into_string()).into_response(),
        Err(e) => failed(e),
    }
}

/// Server-sent events: one `changed` whenever any audit trail grows (an
/// approval parked, answered, settled).
async fn events(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let Some(s) = app.session(&headers).await else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    // Per user first: one user's tabs (or scripts) cannot hold every stream.
    let Some(mine) = UserStream::take(&app, &s.user) else {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    };
    let Ok(permit) = app.streams.clone().try_acquire_owned() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let permit = (permit, mine);
    let streams: Vec<String> = app.config.bridges.keys().map(|b| keys::audit(b)).collect();
    // Its own connection: a blocking read would hold up everyone else's.
    let store = match Store::connect(&redis_config(&app.config)).await {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    let start = vec!["$".to_string(); streams.len()];
    // Checked again before every read (at least every 10 s): a logged-out or
    // changed-password session loses its stream too.
    let record_key = keys::web_session(&s.nonce);
    let record = session_record(&s.user, &app.users.fingerprint(&s.user).unwrap_or_default());
    // The permit rides with the stream: dropped when the client goes.
    let stream = futures::stream::unfold(
        (store, start, permit),
        move |(mut store, mut last, permit)| {
            let streams = streams.clone();
            let (record_key, record) = (record_key.clone(), record.clone());
            async move {
                loop {
                    let still: redis::RedisResult<Option<String>> =
                        redis::AsyncCommands::get(&mut store.conn, &record_key).await;
                    if still.ok().flatten().as_deref() != Some(record.as_str()) {
                        return None;
                    }
                    let mut cmd = redis::cmd("XREAD");
                    cmd.arg("COUNT")
                        .arg(100)
                        .arg("BLOCK")
                        .arg(10_000)
                        .arg("STREAMS")
                        .arg(&streams)
                        .arg(&last);
                    type Read = Option<Vec<(String, Vec<(String, HashMap<String, String>)>)>>;
                    match cmd.query_async::<Read>(&mut store.conn).await {
                        Ok(Some(batches)) => {
                            for (s, entries) in batches {
                                if let (Some(i), Some((id, _))) =
                                    (streams.iter().position(|x| *x == s), entries.last())
                                {
                                    last[i] = id.clone();
                                }
                            }
                            let event = Event::default().data("changed");
                            return Some((
                                Ok::<_, std::convert::Infallible>(event),
                                (store, last, permit),
                            ));
                        }
                        Ok(None) => continue,
                        Err(_) => return None,
                    }
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn render_detail(
    app: &App,
    session: &Session,
    id: &str,
    message: Option<String>,
    status: StatusCode,
) -> Response {
    let mut store = app.store.clone();
    let record = match Approvals::on(&mut store).load(id).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let csrf = app.keys.csrf(session);
    let now = app.clock.now_secs_f64();
    let Some(r) = record else {
        let filter = audit::Filter {
            approval: Some(id.to_string()),
            ..audit::Filter::default()
        };
        let history = match audit::query(&mut store, &app.config, &filter).await {
            Ok(h) => h,
            Err(e) => return failed(e),
        };
        if history.is_empty() && message.is_none() {
            return not_found();
        }
        let d = pages::Detail {
            id,
            record: None,
            state: "settled (the record is gone)",
            fields: vec![],
            content: None,
            context: None,
            matches: Some(true),
            history: &history,
            cannot_decide: None,
            editable: false,
            message,
        };
        return page(status, pages::approval(&session.user, &csrf, &d));
    };
    let history = match audit::history(&mut store, r.source(), id, Some(r.created_at as f64)).await
    {
        Ok(h) => h,
        Err(e) => return failed(e),
    };
    let bridge = app.config.bridges.get(r.source());
    let view = match approval::View::load(&mut store, &app.config, r).await {
        Ok(v) => v,
        Err(e) => return failed(e),
    };
    let gated = view.gated;
    let (mut fields, mut content, mut matches) = (Vec::new(), None, None);
    match view.shown {
        approval::Shown::Gone => {}
        // A declared action: the card approvers were shown, which holds
        // what the approval binds (the command, the bridge's findings),
        // never the agent's raw fields.
        approval::Shown::Card(card) => {
            matches = Some(card.is_some());
            content = card;
        }
        approval::Shown::Message {
            message: m,
            matches: same,
        } => {
            matches = Some(same);
            fields.push(("to", m.channel_id.clone()));
            fields.push((
                "subject",
                m.subject.clone().unwrap_or_else(|| "(none)".into()),
            ));
            fields.push((
                "reply to",
                m.reply_to.clone().unwrap_or_else(|| "(none)".into()),
            ));
            content = Some(m.content);
        }
        approval::Shown::Unreadable(_) => matches = Some(false),
    }
    let r = view.record;
    let identity = Identity::web(&session.user);
    let cannot_decide = match bridge {
        _ if gated && content.is_none() => Some("The card approvers were shown is no longer kept, so this page cannot show what would run: reject it from the CLI and ask the agent again.".to_string()),
        Some(b) if b.approval.allows(&identity) => None,
        _ => Some(format!("You ({identity}) are not on the approvers of bridge `{}`: you can see this approval but not decide it.", r.source())),
    };
    let state = if r.is_settled() {
        "settled"
    } else {
        r.state(now).as_str()
    };
    let d = pages::Detail {
        id,
        record: Some(&r),
        state,
        fields,
        content,
        context: None,
        matches,
        history: &history,
        cannot_decide,
        editable: !gated,
        message,
    };
    page(status, pages::approval(&session.user, &csrf, &d))
}

async fn detail(State(app): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let Some(s) = app.session(&headers).await else {
        return to_login();
    };
    if !approval::is_id(&id) {
        return not_found();
    }
    render_detail(&app, &s, &id, None, StatusCode::OK).await
}

async fn decide(
    State(app): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let s = match checked_post(&app, &headers, &id, &f).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let verdict = match f.get("verdict").map(String::as_str) {
        Some("approved") => Verdict::Approved,
        Some("rejected") => Verdict::Rejected,
        _ => return refused("no verdict"),
    };
    let identity = Identity::web(&s.user);
    let reason = f.get("reason").map(String::as_str).unwrap_or("");
    if reason.len() > MAX_REASON_BYTES {
        return refused("the reason is too long (at most 2,000 bytes)");
    }
    // A decision from the page is bound to the version it showed.
    let Some(digest) = f
        .get("digest")
        .map(String::as_str)
        .filter(|d| !d.is_empty())
    else {
        return refused("no digest: decide from the approval's page");
    };
    let answer = Answer::new(&app.clock, verdict, &identity, reason).seeing(digest);
    let mut store = app.store.clone();
    // The page's Redis user writes no record: the requesting bridge's outbox
    // applies the decision (see `broker::request`).
    let decided =
        broker::request::decide(&mut store, &broker::request::Requester::Web, &id, answer).await;
    let (message, status) = match decided {
        Ok(Outcome::Decided) => (
            format!("{} by {identity}.", verdict.as_str()),
            StatusCode::OK,
        ),
        Ok(Outcome::Counted {
            have,
            need,
            again: false,
        }) => (
            format!("Approval counted: {have} of {need}."),
            StatusCode::OK,
        ),
        Ok(Outcome::Counted { have, need, .. }) => (
            format!("Nothing changed: your approval is counted already ({have} of {need})."),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::NotAllowed) => (
            format!("Nothing decided: {identity} is not an approver of this bridge."),
            StatusCode::FORBIDDEN,
        ),
        Ok(Outcome::Late(approval::Late::Superseded)) => (
            "Nothing decided: the message was edited since this page was shown; look at it again."
                .to_string(),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::SharedProofCounted) => (
            "Not counted: an approval through this page is counted already, and under a quorum the page counts once (its one password proves all its users); the other approvers answer on a surface of their own."
                .to_string(),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::EditorNotCounted) => (
            "Not counted: you edited this message, and under a quorum the editor's approval does not count; the other approvers decide."
                .to_string(),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::Late(approval::Late::Missing)) => (
            "Nothing decided: it is settled and gone.".to_string(),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::Late(state)) => (
            format!("Nothing decided: it is already {state}."),
            StatusCode::CONFLICT,
        ),
        Ok(Outcome::Unknown | Outcome::Submitted) => (
            "Nothing decided: no such approval.".to_string(),
            StatusCode::NOT_FOUND,
        ),
        Err(broker::Error::Operator { message: why, .. }) => (format!("Nothing decided: {why}"), StatusCode::CONFLICT),
        // The outbox did not answer in time, or failed: say so, not "Redis".
        Err(e @ (broker::Error::Platform { .. } | broker::Error::Internal(_))) => {
            tracing::warn!(error = %e, "web: a decision was not applied");
            (format!("Nothing decided yet: {e}"), StatusCode::SERVICE_UNAVAILABLE)
        }
        Err(e) => return failed(e),
    };
    render_detail(&app, &s, &id, Some(message), status).await
}

async fn edit(
    State(app): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let s = match checked_post(&app, &headers, &id, &f).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let mut store = app.store.clone();
    // Edited from the version shown (checked by the edit itself): a page
    // older than the record edits nothing.
    let Some(seen) = f.get("digest").filter(|d| !d.is_empty()).cloned() else {
        return refused("no digest: edit from the approval's page");
    };
    // Browsers send CR LF in a textarea; the agent's lines end with LF.
    let content = f.get("content").map(|c| c.replace("\r\n", "\n"));
    let change = approval::edit::Change {
        content,
        subject: f.get("subject").cloned(),
        channel_id: f.get("channel").cloned(),
        seen: Some(seen),
    };
    let editor = Identity::web(&s.user);
    let (message, status) = match broker::request::edit(
        &mut store,
        &broker::request::Requester::Web,
        &id,
        &change,
        &editor,
    )
    .await
    {
        Ok(e) => (
            format!(
                "Edited (edit {}): approvers are asked again about the new version.",
                e.revision
            ),
            StatusCode::OK,
        ),
        Err(broker::Error::Operator { message: why, .. }) => {
            (format!("Nothing edited: {why}"), StatusCode::CONFLICT)
        }
        Err(e @ (broker::Error::Platform { .. } | broker::Error::Internal(_))) => {
            tracing::warn!(error = %e, "web: an edit was not applied");
            (
                format!("Nothing edited yet: {e}"),
                StatusCode::SERVICE_UNAVAILABLE,
            )
        }
        Err(e) => return failed(e),
    };
    render_detail(&app, &s, &id, Some(message), status).await
}

async fn metrics_route(State(app): State<Shared>) -> Response {
    let mut store = app.store.clone();
    match metrics::render(
        &mut store,
        &app.config,
        &app.counters,
        app.clock.now_secs_f64(),
    )
    .await
    {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics");
            (StatusCode::SERVICE_UNAVAILABLE, e).into_response()
        }
    }
}
