//! One approval: what it would send or run, and deciding or editing it.

use std::collections::HashMap;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use broker::approval::{self, Answer, Approvals, Outcome, Verdict};
use broker::audit;
use broker::identity::Identity;

use crate::session::Session;

use crate::*;

pub(crate) async fn render_detail(
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
            delegations: Vec::new(),
        };
        return page(status, pages::approval(&session.user, &csrf, &d));
    };
    let history = match audit::history(&mut store, r.source(), id, Some(r.created_at as f64)).await
    {
        Ok(h) => h,
        Err(e) => return failed(e),
    };
    let bridge = app.config.bridges.get(r.source());
    let now_secs = now as u64;
    let delegations = match approval::delegation::covering(&mut store, &r, now_secs).await {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let view = match approval::View::load(&mut store, &app.config, r).await {
        Ok(v) => v,
        Err(e) => return failed(e),
    };
    let gated = view.gated;
    // Headed by what the entry says (the edit form starts from it too), not
    // by the record's copies, which any surface of the approval can write.
    let r = view.header();
    let (mut fields, mut content, mut matches) = (Vec::new(), None, None);
    let mut unreadable = None;
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
        approval::Shown::Unreadable(why) => {
            matches = Some(false);
            unreadable = Some(why);
        }
    }
    let identity = Identity::web(&session.user);
    let cannot_decide = match bridge {
        _ if unreadable.is_some() => unreadable.map(|why| format!("What this approval would send cannot be read ({why}): it will not be sent; reject it and ask the agent again.")),
        _ if gated && content.is_none() => Some("The card approvers were shown is no longer kept, so this page cannot show what would run: reject it from the CLI and ask the agent again.".to_string()),
        Some(b) if b.approval.allows_at(&identity, r.escalated) => None,
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
        delegations,
    };
    page(status, pages::approval(&session.user, &csrf, &d))
}

pub(crate) async fn detail(
    State(app): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(s) = app.session(&headers).await else {
        return to_login();
    };
    if !approval::is_id(&id) {
        return not_found();
    }
    render_detail(&app, &s, &id, None, StatusCode::OK).await
}

pub(crate) async fn decide(
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
        // The outbox did not answer in time, or failed: say so, not "Redis".
        Err(e) => match not_applied(e, "Nothing decided", "a decision") {
            Ok(said) => said,
            Err(page) => return *page,
        },
    };
    render_detail(&app, &s, &id, Some(message), status).await
}

/// How the outbox's refusal or failure reads on the page: a refusal says
/// why (409); the outbox not answering, or failing, says so (503); any other
/// error is the page's own.
fn not_applied(
    e: broker::Error,
    nothing: &str,
    what: &str,
) -> Result<(String, StatusCode), Box<Response>> {
    match e {
        broker::Error::Operator { message, .. } => {
            Ok((format!("{nothing}: {message}"), StatusCode::CONFLICT))
        }
        e @ (broker::Error::Platform { .. } | broker::Error::Internal(_)) => {
            tracing::warn!(error = %e, "web: {what} was not applied");
            Ok((
                format!("{nothing} yet: {e}"),
                StatusCode::SERVICE_UNAVAILABLE,
            ))
        }
        e => Err(Box::new(failed(e))),
    }
}

/// "Not now": moves the deadline (never a decision), through the requesting
/// bridge's outbox, which applies the snooze rules.
pub(crate) async fn later(
    State(app): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<HashMap<String, String>>,
) -> Response {
    let s = match checked_post(&app, &headers, &id, &f).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let reason = f.get("reason").map(String::as_str).unwrap_or("");
    if reason.len() > MAX_REASON_BYTES {
        return refused("the reason is too long (at most 2,000 bytes)");
    }
    let seconds = match f.get("for").map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => None,
        Some(span) => match broker::text::duration_secs(span) {
            Some(secs) => Some(secs),
            None => return refused("give how much later as 90m, 2h or 1d"),
        },
    };
    let identity = Identity::web(&s.user).to_string();
    let mut store = app.store.clone();
    let requester = broker::request::Requester::Web;
    let snoozed =
        broker::request::snooze(&mut store, &requester, &id, &identity, seconds, reason).await;
    let (message, status) = match snoozed {
        Ok(s) => (
            format!(
                "Snoozed by {identity} until {} (snooze {} of {}).",
                broker::clock::utc(s.until as f64),
                s.count,
                s.max
            ),
            StatusCode::OK,
        ),
        Err(e) => match not_applied(e, "Not snoozed", "a snooze") {
            Ok(said) => said,
            Err(page) => return *page,
        },
    };
    render_detail(&app, &s, &id, Some(message), status).await
}

pub(crate) async fn edit(
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
        Err(e) => match not_applied(e, "Nothing edited", "an edit") {
            Ok(said) => said,
            Err(page) => return *page,
        },
    };
    render_detail(&app, &s, &id, Some(message), status).await
}
