//! The approval page (`cowboy web`) and the metrics exporter (`cowboy exporter`).
//!
//! # Layout (each module states its invariants)
//!
//! - [`session`]: signed session cookies and CSRF tokens.
//! - [`auth`]: the users of `[web.users]`, Argon2 checks, failed-login slow-down.
//! - [`pages`]: the server-rendered HTML.
//! - [`metrics`]: the `/metrics` route.
//! - `routes`: the page's handlers (login, queue, one approval).
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
mod routes;
pub mod session;

use routes::*;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;

use broker::approval::{self};
use broker::config::{Config, RedisConfig};
use broker::identity::Identity;
use broker::{keys, Clock, Shutdown, Store};

use session::{Keys, Session, SESSION_COOKIE};

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
            .any(|b| b.approval.allows_ever(&identity));
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
        let record = store.session_record(&s.nonce).await.ok()?;
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
        .route("/approval/{id}/later", post(later))
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

fn failed(e: broker::Error) -> Response {
    tracing::warn!(error = %e, "web: Redis");
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::error("unavailable", "Redis could not be read; try again."),
    )
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
