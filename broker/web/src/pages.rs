//! The HTML of the page, rendered on the server (maud escapes every value).
//!
//! Invariants:
//! - Agent text only ever reaches the page as escaped text, never as markup,
//!   and the message is shown whole in a `<pre>`, every line, nothing folded
//!   away; values that could act on the display pass through `display_safe`.
//! - Every form posts its session's CSRF token; a form decides the version it
//!   was rendered for (the digest rides along).
//! - Nothing here decides: it draws what the handlers computed.

use maud::{html, Markup, DOCTYPE};

use broker::approval::{display_safe, Record, State};
use broker::audit::Entry;

/// One row of the queue.
pub struct Row {
    pub record: Record,
    pub state: State,
    pub now: f64,
}

fn shell(title: &str, user: Option<&str>, csrf: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · cowboy" }
                link rel="stylesheet" href="/static/app.css";
                script src="/static/app.js" defer {}
            }
            body {
                header {
                    a href="/" { "cowboy approvals" }
                    @if let Some(user) = user {
                        form method="post" action="/logout" class="logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            span { "web:" (user) " " }
                            button type="submit" { "log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The login form.
pub fn login(csrf: &str, message: Option<&str>) -> Markup {
    shell(
        "log in",
        None,
        "",
        html! {
            h1 { "Log in" }
            @if let Some(m) = message { p class="error" { (m) } }
            form method="post" action="/login" {
                input type="hidden" name="csrf" value=(csrf);
                label { "user " input name="user" id="user" autocomplete="username" required; }
                label { "password " input name="password" id="password" type="password" autocomplete="current-password" required; }
                button type="submit" id="login" { "log in" }
            }
        },
    )
}

fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The queue's table (also served alone, for live updates).
pub fn queue_table(rows: &[Row]) -> Markup {
    html! {
        @if rows.is_empty() {
            p class="empty" { "Nothing is waiting for approval." }
        } @else {
            table {
                thead { tr { th { "agent" } th { "bridge" } th { "to" } th { "size" } th { "age" } th { "time left" } th { "approvals" } } }
                tbody {
                    @for row in rows {
                        @let r = &row.record;
                        tr class="approval" data-id=(r.id) {
                            td { a href={ "/approval/" (r.id) } { (r.agent().unwrap_or("(shared outbox)")) } }
                            td { (r.source()) }
                            td { (display_safe(&r.channel_id)) }
                            td { (r.content_bytes) " B" }
                            td { (age(row.now - r.created_at as f64)) }
                            td {
                                @match r.expires_at {
                                    0 => "never",
                                    t => (age(t as f64 - row.now)),
                                }
                            }
                            td { @match r.progress() { Some(p) => (p), None => "1 needed" } }
                        }
                    }
                }
            }
        }
    }
}

/// The pending queue, oldest first.
pub fn queue(user: &str, csrf: &str, rows: &[Row]) -> Markup {
    shell(
        "queue",
        Some(user),
        csrf,
        html! {
            h1 { "Waiting for approval" }
            div id="queue" { (queue_table(rows)) }
        },
    )
}

/// What the detail page shows of an approval.
pub struct Detail<'a> {
    pub id: &'a str,
    pub record: Option<&'a Record>,
    pub state: &'a str,
    /// Every field the sender will use, in order, and the whole content.
    pub fields: Vec<(&'static str, String)>,
    pub content: Option<String>,
    /// The bridge's own findings (a commit), shown below the content.
    pub context: Option<String>,
    /// Whether the entry still matches the approval's digest.
    pub matches: Option<bool>,
    pub history: &'a [Entry],
    /// Why this user may not decide, if they may not.
    pub cannot_decide: Option<String>,
    pub editable: bool,
    /// What the last action did (already escaped text of ours).
    pub message: Option<String>,
    /// The delegations that let someone answer for an approver here.
    pub delegations: Vec<String>,
}

pub fn approval(user: &str, csrf: &str, d: &Detail<'_>) -> Markup {
    let pending = d.state == "pending";
    shell(
        "approval",
        Some(user),
        csrf,
        html! {
            @if let Some(m) = &d.message { p class="notice" id="result" { (m) } }
            h1 { "Approval " code { (d.id) } }
            p class="state" { "state: " strong id="state" { (d.state) } }
            @if let Some(r) = d.record {
                table class="fields" {
                    tr { th { "from" } td { (r.agent().unwrap_or("an agent on the shared outbox")) } }
                    tr { th { "via" } td { (r.source()) } }
                    @for (k, v) in &d.fields { tr { th { (k) } td { (display_safe(v)) } } }
                    tr { th { "size" } td { (r.content_bytes) " bytes" } }
                    tr { th { "digest" } td { code id="digest" { (r.message_sha256) } } }
                    tr { th { "deadline" } td { @match r.expires_at { 0 => "never expires", t => (broker::clock::utc(t as f64)) } } }
                    tr { th { "approvals" } td { @match r.progress() { Some(p) => (p), None => "one approver decides" } } }
                    @if let Some(later) = r.snoozed(|t| broker::clock::utc(t as f64)) {
                        tr { th { "later" } td id="snoozed" { (display_safe(&later)) } }
                    }
                    @if let Some(step) = r.escalation() {
                        tr { th { "escalated" } td id="escalated" { (display_safe(&step)) } }
                    }
                    @for d in &d.delegations {
                        tr { th { "delegated" } td class="delegation" { (display_safe(d)) } }
                    }
                    @if let (Some(by), Some(orig)) = (&r.edited_by, &r.original_sha256) {
                        tr { th { "edited" } td { "by " (display_safe(by)) "; the agent's version had digest " code { (orig) } } }
                    }
                }
                @if let Some(content) = &d.content {
                    h2 { "The message, whole" }
                    pre id="content" { (display_safe(content)) }
                    p class="end" { "(end of message: " (content.len()) " bytes, " (content.split('\n').count()) " lines)" }
                }
                @if let Some(context) = &d.context {
                    h2 { "What the bridge found" }
                    pre id="context" { (display_safe(context)) }
                }
                @match d.matches {
                    Some(false) => p class="error" { "The entry no longer matches what the approval binds: it will not be sent." },
                    None => p class="error" { "The entry is gone from its stream: it will not be sent." },
                    _ => {}
                }
                @if pending {
                    @match &d.cannot_decide {
                        Some(why) => p class="error" id="cannot" { (why) },
                        None => {
                            form method="post" action={ "/approval/" (d.id) "/decide" } class="decide" {
                                input type="hidden" name="csrf" value=(csrf);
                                input type="hidden" name="digest" value=(r.message_sha256);
                                input type="hidden" name="verdict" value="approved";
                                button type="submit" id="approve" { "Approve and send" }
                            }
                            form method="post" action={ "/approval/" (d.id) "/decide" } class="decide" {
                                input type="hidden" name="csrf" value=(csrf);
                                input type="hidden" name="digest" value=(r.message_sha256);
                                input type="hidden" name="verdict" value="rejected";
                                label { "reason (the agent sees it) " input name="reason" id="reason"; }
                                button type="submit" id="reject" { "Reject" }
                            }
                            @if r.expires_at != 0 {
                                form method="post" action={ "/approval/" (d.id) "/later" } class="decide" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    input type="hidden" name="digest" value=(r.message_sha256);
                                    label { "later by " input name="for" id="later-for" value="1h" size="5"; }
                                    label { " why " input name="reason" id="later-reason"; }
                                    button type="submit" id="later" { "Not now: move the deadline" }
                                }
                            }
                            @if d.editable {
                                details {
                                    summary { "edit before sending (approvers are asked again)" }
                                    form method="post" action={ "/approval/" (d.id) "/edit" } {
                                        input type="hidden" name="csrf" value=(csrf);
                                        input type="hidden" name="digest" value=(r.message_sha256);
                                        label { "to " input name="channel" value=(r.channel_id); }
                                        label { "subject " input name="subject" value=(r.subject.clone().unwrap_or_default()); }
                                        textarea name="content" id="edit-content" rows="10" { (d.content.clone().unwrap_or_default()) }
                                        button type="submit" id="edit" { "save the edit" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "History" }
            table class="history" {
                @for e in d.history {
                    tr {
                        td { (broker::clock::utc(e.at)) }
                        td { (e.event) }
                        td {
                            @for (k, v) in &e.fields { span class="kv" { (k) "=" (display_safe(v)) } " " }
                        }
                    }
                }
            }
            p { a href="/" { "back to the queue" } }
        },
    )
}

/// A plain error page.
pub fn error(title: &str, text: &str) -> Markup {
    shell(
        title,
        None,
        "",
        html! { h1 { (title) } p { (text) } p { a href="/" { "back" } } },
    )
}

pub const CSS: &str = r#"
body { font-family: system-ui, sans-serif; margin: 0; }
header { display: flex; justify-content: space-between; align-items: center; padding: .5rem 1rem; background: #234; }
header a, header span { color: #fff; }
main { padding: 1rem; max-width: 60rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid #ddd; vertical-align: top; }
th { white-space: nowrap; }
td { overflow-wrap: break-word; word-break: break-word; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f6f6f0; border-left: 4px solid #b90; padding: .5rem; font-family: ui-monospace, monospace; }
.error { color: #a00; font-weight: bold; }
.notice { background: #eef; padding: .5rem; }
form.decide { display: inline-block; margin: .5rem .5rem .5rem 0; }
button { font-size: 1.1rem; padding: .5rem 1rem; }
label { display: block; margin: .3rem 0; }
textarea { width: 100%; font-family: ui-monospace, monospace; }
.kv { font-size: .85rem; }
@media (max-width: 40rem) { #queue th:nth-child(4), #queue td:nth-child(4), #queue th:nth-child(2), #queue td:nth-child(2) { display: none; } }
table.fields th { width: 7rem; }
"#;

/// Live updates of the queue: when the server says something changed, the
/// table is fetched again and replaced (server-rendered, escaped HTML).
pub const JS: &str = r#"
(function () {
  var queue = document.getElementById('queue');
  if (!queue || !window.EventSource) return;
  var events = new EventSource('/events');
  events.onmessage = function () {
    fetch('/queue', { credentials: 'same-origin' }).then(function (r) {
      if (r.ok) return r.text().then(function (t) { queue.innerHTML = t; });
    });
  };
})();
"#;
