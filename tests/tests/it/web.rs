//! The approval page: its security without a browser, a real browser
//! (chromium over WebDriver), and its metrics scraped by a real Prometheus.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use broker::keys;
use harness::setup::Setup;
use harness::web::{write_password, Browser, Prometheus, WebServer};
use harness::{hash, wait_until, Deployment};

use crate::approval::{agent_sends, inbox_notices, notification};
use crate::SOON;

const KEY: &str = "0123456789abcdef0123456789abcdef-session-key";

fn web_config() -> String {
    format!(
        "{}\n[web]\nsession_key_file = \"{{dir}}/session.key\"\ntrusted_proxies = [\"127.0.0.1\"]\n\n[web.users.boss]\npassword_file = \"{{dir}}/boss.hash\"\n\n[web.users.eve]\npassword_file = \"{{dir}}/eve.hash\"\n",
        Setup::approval(3600)
            .approvers(&["console:boss", "cli:op", "web:boss"])
            .toml()
    )
}

async fn deployment() -> (Deployment, WebServer) {
    let d = Deployment::new(&web_config());
    std::fs::write(d.path("session.key"), KEY).unwrap();
    write_password(&d.path("boss.hash"), "correct horse");
    write_password(&d.path("eve.hash"), "eve's password");
    let web = WebServer::start(&d).await;
    (d, web)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn set_cookie(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get_all("set-cookie").iter().find_map(|v| {
        let v = v.to_str().ok()?;
        let (pair, _) = v.split_once(';')?;
        let (k, val) = pair.split_once('=')?;
        (k == name && !val.is_empty()).then(|| val.to_string())
    })
}

fn csrf_of(html: &str) -> String {
    let at =
        html.find(r#"name="csrf" value=""#).expect("a csrf field") + r#"name="csrf" value=""#.len();
    html[at..].split('"').next().unwrap().to_string()
}

async fn click(c: &fantoccini::Client, what: fantoccini::Locator<'_>) {
    c.find(what).await.unwrap().click().await.unwrap();
}

/// The result line of the page a form POST loads: waited for, since a click
/// returns before the new page is there.
async fn result_of_post(c: &fantoccini::Client) -> String {
    c.wait()
        .at_most(SOON)
        .for_element(fantoccini::Locator::Id("result"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Logs in; returns the response to the login POST and the session cookie.
async fn login(web: &WebServer, user: &str, password: &str) -> (reqwest::Response, Option<String>) {
    login_from(web, user, password, None).await
}

/// A login through the trusted proxy (127.0.0.1) for client `from`.
async fn login_from(
    web: &WebServer,
    user: &str,
    password: &str,
    from: Option<&str>,
) -> (reqwest::Response, Option<String>) {
    let c = client();
    let form = c.get(web.url("/login")).send().await.unwrap();
    let pre = set_cookie(&form, "cowboy_login").expect("a pre-login cookie");
    let csrf = csrf_of(&form.text().await.unwrap());
    let mut req = c
        .post(web.url("/login"))
        .header("cookie", format!("cowboy_login={pre}"));
    if let Some(from) = from {
        req = req.header("x-forwarded-for", format!("203.0.113.9, {from}"));
    }
    let r = req
        .form(&[("user", user), ("password", password), ("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    let session = set_cookie(&r, "cowboy_session");
    (r, session)
}

async fn get(web: &WebServer, session: &str, path: &str) -> reqwest::Response {
    client()
        .get(web.url(path))
        .header("cookie", format!("cowboy_session={session}"))
        .send()
        .await
        .unwrap()
}

async fn post(
    web: &WebServer,
    session: &str,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    client()
        .post(web.url(path))
        .header("cookie", format!("cowboy_session={session}"))
        .form(form)
        .send()
        .await
        .unwrap()
}

/// The page heads an approval with what the entry says (the agent whose
/// stream it is read from, its destination, subject and size), and its edit
/// form starts from the entry's destination and subject: a writer of the
/// record who changes its copies neither misleads the approver nor gets an
/// edit that quietly sends elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_record_neither_heads_the_page_nor_fills_its_edit_form() {
    let (d, web) = deployment().await;
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "helo wrold", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let mut store = d.store().await;
    harness::write_record(&mut store, &id, &crate::consent::FORGED_HEADER).await;
    let (_, session) = login(&web, "boss", "correct horse").await;
    let html = get(&web, &session.unwrap(), &format!("/approval/{id}"))
        .await
        .text()
        .await
        .unwrap();
    for shown in [
        "<th>from</th><td>ann</td>",
        "<th>to</th><td>bob@example.org</td>",
        "<th>size</th><td>10 bytes</td>",
        r#"name="channel" value="bob@example.org""#,
        r#"name="subject" value="""#,
    ] {
        assert!(html.contains(shown), "{shown:?} in\n{html}");
    }
    for (_, forged) in crate::consent::FORGED_HEADER {
        assert!(!html.contains(forged), "{forged:?} in\n{html}");
    }
    for s in services {
        s.stop().await.unwrap();
    }
}

/// Every key and its serialized value: the whole dataset, to compare.
async fn snapshot(d: &Deployment) -> BTreeMap<String, Vec<u8>> {
    let mut store = d.store().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut store.conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys {
        let v: Vec<u8> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut store.conn)
            .await
            .unwrap();
        out.insert(k, v);
    }
    out
}

/// Without a browser: a POST without its session's CSRF token is refused; no
/// GET of any page changes Redis; the page decides through the broker's
/// rules, once; a decided approval cannot be decided again from a stale page;
/// every response carries the security headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_need_their_csrf_token_and_gets_change_nothing() {
    let (d, web) = deployment().await;
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "from the page", "r1").await;
    let (id, _) = notification(&d, 0).await;
    for s in services {
        s.stop().await.unwrap();
    }
    let (r, session) = login(&web, "boss", "correct horse").await;
    assert_eq!(r.status(), 303, "logged in");
    let session = session.expect("a session cookie");
    let set = r
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let all: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let cookie = all
        .iter()
        .find(|c| c.starts_with("cowboy_session="))
        .unwrap_or(&set);
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );

    let page = get(&web, &session, &format!("/approval/{id}")).await;
    for (h, want) in [
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(page.headers().get(h).unwrap(), want);
    }
    let csp = page
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = page.text().await.unwrap();
    let csrf = csrf_of(&html);
    assert!(html.contains("from the page"));

    // GET every page: nothing in Redis changes.
    let before = snapshot(&d).await;
    for path in [
        "/",
        "/queue",
        &format!("/approval/{id}"),
        "/login",
        "/static/app.js",
        "/static/app.css",
        "/metrics",
        &format!("/approval/{id}/decide"),
    ] {
        let r = get(&web, &session, path).await;
        assert!(r.status().as_u16() < 500, "{path}: {}", r.status());
    }
    assert_eq!(snapshot(&d).await, before, "a GET changed Redis");

    let decide = format!("/approval/{id}/decide");
    let digest = hash(&mut d.store().await, &keys::approval(&id)).await["message_sha256"].clone();
    for form in [
        vec![("verdict", "approved"), ("digest", digest.as_str())],
        vec![
            ("verdict", "approved"),
            ("digest", digest.as_str()),
            ("csrf", "0000"),
        ],
    ] {
        let r = post(&web, &session, &decide, &form).await;
        assert_eq!(r.status(), 403, "refused without the right CSRF token");
    }
    assert_eq!(snapshot(&d).await, before, "a refused POST changed Redis");

    let mail = d.spawn("outbox", "mail");
    let desk = d.spawn("outbox", "desk");
    let r = post(
        &web,
        &session,
        &decide,
        &[
            ("verdict", "approved"),
            ("digest", &digest),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("approved by web:boss"));
    wait_until("the delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    // The page it was decided from, posted again: the broker's rules answer.
    let again = post(
        &web,
        &session,
        &decide,
        &[
            ("verdict", "approved"),
            ("digest", &digest),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(again.status(), 409);
    assert!(again.text().await.unwrap().contains("Nothing decided"));
    mail.stop().await.unwrap();
    desk.stop().await.unwrap();
    assert_eq!(d.delivered("mail.out").len(), 1, "delivered once");
    web.stop().await;
}

/// Wrong passwords are refused and answered slowly; a client address is
/// locked after three (the client a trusted proxy forwarded for), while the
/// same name logs in from elsewhere; an expired, altered or never-issued
/// session is refused, and a logged-out one too even if its cookie was copied;
/// a user who is not an approver sees the approval but cannot decide it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_slowed_and_locked_and_sessions_expire() {
    let (d, web) = deployment().await;
    let guesser = Some("198.51.100.7");
    let started = Instant::now();
    let (r, session) = login_from(&web, "boss", "wrong", guesser).await;
    assert_eq!(r.status(), 401);
    assert!(session.is_none());
    assert!(
        started.elapsed() >= web::auth::FAILURE_DELAY,
        "a failure is answered slowly"
    );
    let (r, _) = login_from(&web, "nobody", "x", guesser).await;
    assert_eq!(r.status(), 401, "an unknown name reads the same");
    login_from(&web, "boss", "wrong again", guesser).await;
    login_from(&web, "boss", "and again", guesser).await;
    let (r, session) = login_from(&web, "boss", "correct horse", guesser).await;
    assert_eq!(
        r.status(),
        429,
        "locked after three failures, even with the right password"
    );
    assert!(r.headers().get("retry-after").is_some());
    assert!(session.is_none());
    // Logging in under its own name does not reset the count against boss.
    let (r, _) = login_from(&web, "eve", "eve's password", guesser).await;
    assert_eq!(r.status(), 303);
    let (r, _) = login_from(&web, "boss", "correct horse", guesser).await;
    assert_eq!(r.status(), 429, "still locked for boss from the guesser");
    // The guesser's address is locked, not boss: boss logs in from elsewhere.
    let (r, session) = login_from(&web, "boss", "correct horse", Some("192.0.2.44")).await;
    assert_eq!(r.status(), 303, "the name is not locked for everyone");
    let boss = session.expect("boss logs in");
    let home = get(&web, &boss, "/").await;
    assert_eq!(home.status(), 200);
    let csrf = csrf_of(&home.text().await.unwrap());
    let live = get(&web, &boss, "/events").await;
    assert_eq!(live.status(), 200);
    let out = post(&web, &boss, "/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.status(), 303);
    // Its live updates end too (checked again before every 10 s read).
    tokio::time::timeout(Duration::from_secs(30), live.bytes())
        .await
        .expect("the live-update stream of a logged-out session ends")
        .ok();
    assert_eq!(
        get(&web, &boss, "/").await.status(),
        303,
        "a copied cookie is refused after logout"
    );

    // A session signed with the page's key but expired, and one altered.
    let keys = web::session::Keys::load(Some(&d.path("session.key"))).unwrap();
    let expired = keys.session("eve", broker::now_secs() - 1);
    assert_eq!(
        get(&web, &expired, "/").await.status(),
        303,
        "expired: back to the login"
    );
    let fresh = keys.session("eve", broker::now_secs() + 600);
    let altered = fresh.replacen("eve", "boss", 1);
    assert_eq!(
        get(&web, &altered, "/").await.status(),
        303,
        "altered: back to the login"
    );
    assert_eq!(
        get(&web, &fresh, "/").await.status(),
        303,
        "signed with the page's key, but never issued by the page"
    );

    // eve is a user of the page but not an approver of the bridge.
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    agent_sends(&d, "for approvers only", "r1").await;
    let (id, _) = notification(&d, 0).await;
    let (_, eve) = login(&web, "eve", "eve's password").await;
    let eve = eve.expect("eve logs in");
    let html = get(&web, &eve, &format!("/approval/{id}"))
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("for approvers only"), "eve sees it");
    // Live updates: one stream for a user who only looks, so nobody who is not
    // an approver can hold the page's streams.
    let first = get(&web, &eve, "/events").await;
    assert_eq!(first.status(), 200);
    assert_eq!(get(&web, &eve, "/events").await.status(), 429);
    drop(first);
    assert!(
        html.contains("not on the approvers") && !html.contains(r#"id="approve""#),
        "but has no buttons"
    );
    let digest = hash(&mut d.store().await, &keys::approval(&id)).await["message_sha256"].clone();
    let r = post(
        &web,
        &eve,
        &format!("/approval/{id}/decide"),
        &[
            ("verdict", "approved"),
            ("digest", &digest),
            ("csrf", &csrf_of(&html)),
        ],
    )
    .await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        hash(&mut d.store().await, &keys::approval(&id)).await["status"],
        "pending"
    );
    for s in services {
        s.stop().await.unwrap();
    }
    assert!(d.delivered("mail.out").is_empty());
    web.stop().await;
}

/// A real Prometheus scrapes `/metrics` every second: after 3 parked and 1
/// decided, it reports 2 pending for the bridge and one time-to-decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_pending_and_time_to_decision() {
    let (d, web) = deployment().await;
    let prometheus = Prometheus::start(&web.addr.to_string());
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let mut ids = Vec::new();
    for i in 0..3 {
        agent_sends(&d, &format!("message {i}"), &format!("r{i}")).await;
        ids.push(notification(&d, i).await.0);
    }
    let out = d.cowboy(&["approvals", "approve", &ids[0], "--as", "op"]);
    assert!(out.status.success(), "{out:?}");
    wait_until("the approved one is sent", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    let pending = wait_until(
        "Prometheus to report 2 pending",
        Duration::from_secs(60),
        || async {
            prometheus
                .query(r#"cowboy_approvals_pending{bridge="mail"}"#)
                .await
                .filter(|v| *v == 2.0)
        },
    )
    .await;
    assert_eq!(pending, 2.0);
    let observed = wait_until(
        "a time-to-decision observation",
        Duration::from_secs(60),
        || async {
            prometheus
                .query(r#"cowboy_time_to_decision_seconds_count{bridge="mail"}"#)
                .await
                .filter(|v| *v >= 1.0)
        },
    )
    .await;
    assert_eq!(observed, 1.0);
    let decided = prometheus
        .query(r#"cowboy_decisions_total{bridge="mail",verdict="approved",surface="cli"}"#)
        .await;
    assert_eq!(decided, Some(1.0));
    let up = prometheus
        .query(r#"cowboy_service_up{bridge="mail",service="outbox"}"#)
        .await;
    assert_eq!(up, Some(1.0));
    for s in services {
        s.stop().await.unwrap();
    }
    web.stop().await;
}

/// In a real browser: log in, see the whole message (HTML in it shown as text,
/// its script never run), watch the queue grow without a reload, approve (sent
/// once) and reject with a reason (the agent hears it), edit, and say "not
/// now" (the deadline moves; nothing is decided).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_logs_in_sees_everything_and_decides() {
    use fantoccini::Locator;
    let (d, web) = deployment().await;
    let services = [d.spawn("outbox", "mail"), d.spawn("outbox", "desk")];
    let hostile = "Hi Bob,\n<script>window.pwned = 1</script><b>not bold</b>\n<img src=x onerror=\"window.pwned=2\">";
    agent_sends(&d, hostile, "r1").await;
    let (first, _) = notification(&d, 0).await;

    let browser = Browser::start().await;
    let c = &browser.client;
    c.goto(&web.url("/login")).await.unwrap();
    c.find(Locator::Id("user"))
        .await
        .unwrap()
        .send_keys("boss")
        .await
        .unwrap();
    c.find(Locator::Id("password"))
        .await
        .unwrap()
        .send_keys("correct horse")
        .await
        .unwrap();
    click(c, Locator::Id("login")).await;
    let rows = wait_until("the queue with one approval", SOON, || async {
        let rows = c.find_all(Locator::Css("tr.approval")).await.ok()?;
        (rows.len() == 1).then_some(rows)
    })
    .await;
    assert_eq!(rows.len(), 1);
    // Marked so that a reload would be noticed.
    c.execute("window.notReloaded = true; return true;", vec![])
        .await
        .unwrap();
    agent_sends(&d, "a second one", "r2").await;
    let (second, _) = notification(&d, 1).await;
    wait_until(
        "the queue to show the new approval without a reload",
        SOON,
        || async {
            let rows = c.find_all(Locator::Css("tr.approval")).await.ok()?;
            (rows.len() == 2).then_some(())
        },
    )
    .await;
    let kept = c
        .execute("return window.notReloaded === true;", vec![])
        .await
        .unwrap();
    assert_eq!(
        kept,
        serde_json::json!(true),
        "updated in place, not reloaded"
    );
    if let Ok(dir) = std::env::var("COWBOY_SCREENSHOTS") {
        std::fs::write(
            format!("{dir}/web-queue.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();
    }

    c.goto(&web.url(&format!("/approval/{first}")))
        .await
        .unwrap();
    let shown = c
        .find(Locator::Id("content"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(shown, hostile, "the whole message, as text");
    let pwned = c
        .execute("return window.pwned === undefined;", vec![])
        .await
        .unwrap();
    assert_eq!(
        pwned,
        serde_json::json!(true),
        "nothing the agent wrote ran"
    );
    let bold = c
        .find_all(Locator::Css("#content b, #content script, #content img"))
        .await
        .unwrap();
    assert!(bold.is_empty(), "no element came from the agent's text");
    if let Ok(dir) = std::env::var("COWBOY_SCREENSHOTS") {
        std::fs::write(
            format!("{dir}/web-approval.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();
    }
    click(c, Locator::Id("approve")).await;
    let result = result_of_post(c).await;
    assert!(result.contains("approved by web:boss"), "{result}");
    let sent = wait_until("the delivery", SOON, || async {
        d.delivered("mail.out").first().cloned()
    })
    .await;
    assert_eq!(sent.content, hostile);

    c.goto(&web.url(&format!("/approval/{second}")))
        .await
        .unwrap();
    c.find(Locator::Id("reason"))
        .await
        .unwrap()
        .send_keys("not this week")
        .await
        .unwrap();
    click(c, Locator::Id("reject")).await;
    let notice = wait_until("the rejection notice", SOON, || async {
        inbox_notices(&d, "ann:mail:inbox")
            .await
            .into_iter()
            .find(|n| n["status"] == "rejected")
    })
    .await;
    assert_eq!(notice["reason"], "not this week");
    assert_eq!(notice["approver"], "web:boss");

    // Edit before sending: the page asks again about the edited version.
    agent_sends(&d, "third, to be edited", "r3").await;
    let (third, _) = notification(&d, 2).await;
    c.goto(&web.url(&format!("/approval/{third}")))
        .await
        .unwrap();
    click(c, Locator::Css("details summary")).await;
    let area = c.find(Locator::Id("edit-content")).await.unwrap();
    area.clear().await.unwrap();
    area.send_keys("third, edited in the page").await.unwrap();
    click(c, Locator::Id("edit")).await;
    let result = result_of_post(c).await;
    assert!(result.contains("Edited"), "{result}");
    let (again, _) = notification(&d, 3).await;
    assert_eq!(again, third);
    let card = &d.delivered("desk.out")[3];
    assert!(
        card.content.contains("| third, edited in the page")
            && card.content.contains("Edited:    by web:boss"),
        "{}",
        card.content
    );

    // Not now: the deadline moves two hours (never a decision).
    let mut store = d.store().await;
    let before: u64 = hash(&mut store, &keys::approval(&third)).await["expires_at"]
        .parse()
        .unwrap();
    c.goto(&web.url(&format!("/approval/{third}")))
        .await
        .unwrap();
    let span = c.find(Locator::Id("later-for")).await.unwrap();
    span.clear().await.unwrap();
    span.send_keys("2h").await.unwrap();
    c.find(Locator::Id("later-reason"))
        .await
        .unwrap()
        .send_keys("after the meeting")
        .await
        .unwrap();
    click(c, Locator::Id("later")).await;
    let result = result_of_post(c).await;
    assert!(result.contains("Snoozed by web:boss"), "{result}");
    let shown = c
        .find(Locator::Id("snoozed"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(shown.contains("snoozed by web:boss"), "{shown}");
    let after = hash(&mut store, &keys::approval(&third)).await;
    assert_eq!(after["expires_at"], (before + 7200).to_string());
    assert_eq!(after["status"], "pending");
    browser.close().await;
    for s in services {
        s.stop().await.unwrap();
    }
    assert_eq!(d.delivered("mail.out").len(), 1, "sent once");
    web.stop().await;
}
