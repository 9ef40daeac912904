//! Logging in and out: the login form, the slow-down, the session cookie.

use std::collections::HashMap;

use axum::extract::{Form, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use crate::session::{LOGIN_COOKIE, SESSION_COOKIE};

use crate::*;

pub(crate) async fn login_form(State(app): State<Shared>) -> Response {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let csrf = app.keys.login_csrf(&token);
    let mut r = page(StatusCode::OK, pages::login(&csrf, None));
    r.headers_mut()
        .append(header::SET_COOKIE, app.cookie(LOGIN_COOKIE, &token, 600));
    r
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
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
pub(crate) fn client_of(
    app: &App,
    peer: std::net::IpAddr,
    headers: &HeaderMap,
) -> std::net::IpAddr {
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

pub(crate) async fn login(
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
            let recorded = store
                .open_session(
                    &s.nonce,
                    &session_record(&f.user, &fingerprint),
                    app.session_secs,
                )
                .await;
            if let Err(e) = recorded {
                return failed(e);
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

pub(crate) async fn logout(
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
    if let Err(e) = store.end_session(&s.nonce).await {
        return failed(e);
    }
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut()
        .append(header::SET_COOKIE, app.cookie(SESSION_COOKIE, "", 0));
    r
}
