//! Pure logic of the Slack bridge: agent text as Block Kit that Slack shows
//! as written, the approval card and its closing edit, the reject modal, and
//! what a reaction means.
//!
//! Invariants:
//! - Agent text is only ever a rich-text `text` element or `plain_text`:
//!   Slack interprets neither (no mrkdwn, no links, no `<!channel>`), so it
//!   is shown verbatim. A mention in agent text becomes a real one only when
//!   the bridge's `mentions` allows its kind; cards allow none.
//! - The card's frame is the bot's own section; the content sits in
//!   preformatted blocks below it, so nothing the agent writes can read as
//!   the frame or as a button.
//! - Each button carries the digest of the version the card shows; a press
//!   is answered for that version only.

use broker::approval::{display_safe, frame_head, one_line, Record, Verdict};
use serde_json::{json, Value};

/// The most characters of agent content in one delivered message.
pub const LIMIT: usize = 3000;
/// Characters of content per preformatted block on a card.
pub const CARD_CHUNK: usize = 2900;
/// Preformatted blocks on one card (Slack takes 50 blocks per message).
pub const CARD_CHUNKS: usize = 40;
/// The most characters of one frame line: twelve lines stay under the
/// section's 3,000, so a long value (a subject of escaped invisible
/// characters) is cut on its own line and never pushes the lines after it
/// (size, digest, deadline, quorum) off the card.
const LINE_CHARS: usize = 230;

/// `action_id` of the approve button.
pub const APPROVE: &str = "cowboy_approve";
/// `action_id` of the reject button.
pub const REJECT: &str = "cowboy_reject";
/// `action_id` of the later (snooze) button.
pub const LATER: &str = "cowboy_later";
/// `callback_id` of the modal that asks a rejection's reason.
pub const REASON_MODAL: &str = "cowboy_reject_reason";
/// The reason input's block and action id in that modal.
pub const REASON_INPUT: &str = "reason";
/// `event_type` of the metadata a delivery carries, found again on a retry.
pub const DELIVERY_EVENT: &str = "cowboy_delivery";

/// Splits agent content into messages of at most [`LIMIT`] characters.
pub fn split(content: &str) -> Vec<String> {
    broker::text::split(content, LIMIT, |_| 1)
}

/// Text for Slack's mrkdwn (notifications' fallback, the bot's own lines):
/// `&`, `<` and `>` escaped, so nothing in it is a mention or a link.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// What a `<…>` token of agent text is, if it is a mention of a kind in
/// `allowed` (`users`, `groups`, `everyone`).
fn mention(token: &str, allowed: &[String]) -> Option<Value> {
    let on = |k: &str| allowed.iter().any(|m| m == k);
    let id = |s: &str, first: char| crate::config::is_slack_id(s, &[first]).then(|| s.to_string());
    if let Some(user) = token.strip_prefix('@') {
        let user = id(user, 'U').or_else(|| id(user, 'W'))?;
        return on("users").then(|| json!({"type": "user", "user_id": user}));
    }
    if let Some(group) = token.strip_prefix("!subteam^") {
        let group = id(group, 'S')?;
        return on("groups").then(|| json!({"type": "usergroup", "usergroup_id": group}));
    }
    match token {
        "!here" | "!channel" | "!everyone" if on("everyone") => {
            Some(json!({"type": "broadcast", "range": &token[1..]}))
        }
        _ => None,
    }
}

/// Rich-text inline elements for agent text: the text as written, with the
/// allowed mentions as real ones.
pub fn inline(content: &str, allowed: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut plain = String::new();
    let mut rest = content;
    while let Some(start) = rest.find('<') {
        let after = &rest[start + 1..];
        let found = after
            .find('>')
            .and_then(|end| mention(&after[..end], allowed).map(|m| (end, m)));
        match found {
            Some((end, m)) => {
                plain.push_str(&rest[..start]);
                if !plain.is_empty() {
                    out.push(text(&std::mem::take(&mut plain)));
                }
                out.push(m);
                rest = &after[end + 1..];
            }
            None => {
                plain.push_str(&rest[..start + 1]);
                rest = after;
            }
        }
    }
    plain.push_str(rest);
    if !plain.is_empty() || out.is_empty() {
        out.push(text(&plain));
    }
    out
}

/// The blocks of one delivered part.
pub fn message_blocks(part: &str, allowed: &[String]) -> Value {
    json!([{
        "type": "rich_text",
        "elements": [{"type": "rich_text_section", "elements": inline(part, allowed)}],
    }])
}

/// The metadata of part `part` of a delivery: found again by a retry, so a
/// part Slack already has is not posted twice.
pub fn delivery_metadata(delivery_key: &str, part: usize) -> Value {
    json!({
        "event_type": DELIVERY_EVENT,
        "event_payload": {"key": delivery_tag(delivery_key), "part": part.to_string()},
    })
}

/// A delivery key as it is written on Slack: a digest, not the stream's name.
pub fn delivery_tag(delivery_key: &str) -> String {
    broker::approval::sha256_hex(delivery_key.as_bytes())[..32].to_string()
}

fn plain(t: &str) -> Value {
    json!({"type": "plain_text", "text": t, "emoji": false})
}

/// At most `n` characters of `t`, with a note when cut.
fn cut(t: &str, n: usize, id: &str) -> String {
    if t.chars().count() <= n {
        return t.to_string();
    }
    let mut s: String = t.chars().take(n.saturating_sub(80)).collect();
    s.push_str(&format!("… (cut; see all: cowboy approvals show {id})"));
    s
}

/// How to answer on a live card.
pub const HOW_TO_ANSWER: &str =
    "press Approve or Reject below, react ✅ or ❌, or reply in the thread `approve` / `reject <reason>`";

/// Who decided, in the bot's own words: a Slack approver as a mention (the
/// id was checked as a Slack id), anyone else as escaped text.
fn who(approver: &str) -> String {
    match approver.strip_prefix("slack:") {
        Some(id) if crate::config::is_slack_id(id, &['U', 'W']) => format!("<@{id}>"),
        _ => format!("`{}`", escape(approver).replace('`', "'")),
    }
}

fn deadline(record: &Record) -> String {
    match record.expires_at {
        0 => "no deadline".to_string(),
        t => format!("decide by <!date^{t}^{{date_short_pretty}} {{time}}|{t} (unix seconds)>"),
    }
}

/// The frame and the content (when given), as the card's blocks (no buttons).
fn card_body(record: &Record, content: Option<&str>, how: &str) -> Vec<Value> {
    let frame: Vec<String> = frame_head(record, how)
        .iter()
        .map(|line| cut(line, LINE_CHARS, &record.id))
        .collect();
    let mut blocks = vec![json!({
        "type": "section",
        "block_id": "cowboy_frame",
        "text": plain(&frame.join("\n")),
    })];
    if let Some(content) = content {
        blocks.push(content_block(record, content));
    }
    blocks.push(context_line(record));
    blocks
}

/// The content, verbatim, in preformatted blocks (cut with a note past
/// [`CARD_CHUNKS`] of them).
fn content_block(record: &Record, content: &str) -> Value {
    let safe = display_safe(content);
    let chunks = broker::text::split(&safe, CARD_CHUNK, |_| 1);
    let total = chunks.len();
    let mut elements: Vec<Value> = chunks
        .iter()
        .take(CARD_CHUNKS)
        .map(|c| json!({"type": "rich_text_preformatted", "elements": [text(c)]}))
        .collect();
    if total > CARD_CHUNKS {
        elements.push(
            json!({"type": "rich_text_section", "elements": [text(&format!(
                "(message cut here: {} of {total} parts shown; see all: cowboy approvals show {})",
                CARD_CHUNKS, record.id
            ))]}),
        );
    }
    json!({"type": "rich_text", "block_id": "cowboy_content", "elements": elements})
}

/// The bytes, digest, deadline and quorum line under the frame.
fn context_line(record: &Record) -> Value {
    let mut context = vec![format!(
        "{} bytes · sha256 `{}` · {}",
        record.content_bytes,
        escape(&one_line(&record.message_sha256)).replace('`', "\u{02CB}"),
        deadline(record)
    )];
    if let Some(p) = record.progress() {
        context.push(escape(&p));
    }
    json!({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": context.join(" · "), "verbatim": true}],
    })
}

/// The live card: the frame, the content, and the Approve / Reject buttons,
/// each carrying the digest of the version shown.
pub fn card_blocks(record: &Record, content: &str) -> Value {
    let mut blocks = card_body(record, Some(content), HOW_TO_ANSWER);
    let button = |label: &str, action: &str, style: &str| {
        json!({
            "type": "button",
            "action_id": action,
            "text": {"type": "plain_text", "text": label},
            "style": style,
            "value": record.message_sha256,
        })
    };
    blocks.push(json!({
        "type": "actions",
        "block_id": "cowboy_answer",
        "elements": [
            button("Approve", APPROVE, "primary"),
            button("Reject", REJECT, "danger"),
            later_button(record),
        ],
    }));
    Value::Array(blocks)
}

/// "Later": snoozes by the bridge's `approval.snooze` (never a decision).
fn later_button(record: &Record) -> Value {
    json!({
        "type": "button",
        "action_id": LATER,
        "text": {"type": "plain_text", "text": "Later"},
        "value": record.message_sha256,
    })
}

/// The reminder posted in a waiting card's thread (from the record).
pub fn reminder(record: &Record) -> String {
    let deadline = match record.expires_at {
        0 => String::new(),
        t => format!(" It expires at {} (UTC).", broker::clock::utc(t as f64)),
    };
    format!(
        "⏰ Still waiting for a decision: approval {} from {} via {}.{deadline} Answer on the card above.",
        one_line(&record.id),
        one_line(record.agent().unwrap_or("an agent")),
        one_line(record.source()),
    )
}

/// The notification text of a card (what a phone shows).
pub fn card_fallback(record: &Record) -> String {
    format!(
        "Approval requested: {} wants to send via {}",
        escape(&one_line(record.agent().unwrap_or("an agent"))),
        escape(&one_line(record.source()))
    )
}

/// The status line of a closed card, in the bot's own mrkdwn.
pub fn status_line(record: &Record, outcome: &str) -> String {
    match outcome {
        "approved" => format!("✅ *Approved* by {} — sent.", who(record.approver())),
        // The reason is shown below, as plain text: an approver's words
        // (from any surface, an email body included) are never mrkdwn.
        "rejected" => format!("❌ *Rejected* by {}", who(record.approver())),
        "expired" => "⌛ *Expired* — nobody decided in time; not sent.".to_string(),
        "superseded" => {
            "✏️ *Edited* by an approver — this version is void; decide on the new card.".to_string()
        }
        "uncertain" => {
            "❓ *Approved, delivery uncertain* — it may have been sent; the agent was told."
                .to_string()
        }
        _ => "⚠️ *Failed* — not sent.".to_string(),
    }
}

/// The card once the approval is over: the status and the frame, no
/// buttons (the content, which the settled record does not hold, goes).
pub fn closed_blocks(record: &Record, outcome: &str) -> Value {
    let mut blocks = vec![json!({
        "type": "section",
        "block_id": "cowboy_status",
        "text": {"type": "mrkdwn", "text": status_line(record, outcome), "verbatim": true},
    })];
    if outcome == "rejected" && !record.reason().is_empty() {
        let reason = format!("Reason: {}", display_safe(record.reason()));
        blocks.push(json!({
            "type": "section",
            "block_id": "cowboy_reason",
            "text": plain(&cut(&reason, 2900, &record.id)),
        }));
    }
    blocks.extend(card_body(record, None, "this approval is closed"));
    Value::Array(blocks)
}

/// The modal asking a rejection's reason; it carries the card and the
/// digest the pressed button showed.
pub fn reason_modal(card: &str, digest: &str) -> Value {
    json!({
        "type": "modal",
        "callback_id": REASON_MODAL,
        "private_metadata": json!({"card": card, "digest": digest}).to_string(),
        "title": {"type": "plain_text", "text": "Reject"},
        "submit": {"type": "plain_text", "text": "Reject"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [{
            "type": "input",
            "block_id": REASON_INPUT,
            "optional": true,
            "label": {"type": "plain_text", "text": "Why? (the agent is told)"},
            "element": {"type": "plain_text_input", "action_id": REASON_INPUT, "multiline": true},
        }],
    })
}

/// The card and digest a reason modal was opened for.
pub fn modal_target(private_metadata: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(private_metadata).ok()?;
    Some((
        v["card"].as_str()?.to_string(),
        v["digest"].as_str()?.to_string(),
    ))
}

/// A reaction name without its skin tone (`thumbsup::skin-tone-3`).
fn reaction_name(name: &str) -> &str {
    name.split("::").next().unwrap_or(name)
}

/// What a reaction means, given the configured reaction names (`x` or
/// `:x:`; Slack names reactions, it never sends the emoji itself).
pub fn reaction_verdict(name: &str, approve: &[String], reject: &[String]) -> Option<Verdict> {
    let name = reaction_name(name);
    let is = |set: &[String]| {
        set.iter()
            .any(|s| reaction_name(s.trim_matches(':')) == name)
    };
    if is(approve) {
        Some(Verdict::Approved)
    } else if is(reject) {
        Some(Verdict::Rejected)
    } else {
        None
    }
}

/// The external id of a Slack message: `channel:ts`.
pub fn external_id(channel: &str, ts: &str) -> String {
    format!("{channel}:{ts}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use slack_morphism::prelude::SlackBlock;

    fn parses(blocks: &Value) {
        let typed: Vec<SlackBlock> =
            serde_json::from_value(blocks.clone()).unwrap_or_else(|e| panic!("{e}: {blocks:#}"));
        assert_eq!(typed.len(), blocks.as_array().map_or(0, |b| b.len()));
    }

    #[test]
    fn agent_text_is_shown_as_written() {
        let allowed = vec!["users".to_string()];
        let els = inline(
            "hi <@U012AB> <!channel> <!subteam^S1234> *b* <http://x|y>",
            &allowed,
        );
        assert_eq!(els[0], json!({"type": "text", "text": "hi "}));
        assert_eq!(els[1], json!({"type": "user", "user_id": "U012AB"}));
        assert_eq!(
            els[2],
            json!({"type": "text", "text": " <!channel> <!subteam^S1234> *b* <http://x|y>"})
        );
        let none = inline("<@U012AB> <!here>", &[]);
        assert_eq!(
            none,
            vec![json!({"type": "text", "text": "<@U012AB> <!here>"})]
        );
        let all: Vec<String> = ["users", "groups", "everyone"].map(String::from).into();
        let els = inline("<!here><!subteam^S1234>", &all);
        assert_eq!(els[0]["type"], "broadcast");
        assert_eq!(els[1]["type"], "usergroup");
        parses(&message_blocks("a <@U1AB> b", &allowed));
        assert_eq!(escape("<!here> & co"), "&lt;!here&gt; &amp; co");
    }

    #[test]
    fn cards_are_blocks_slack_takes() {
        let record = Record {
            id: "0123456789abcdef".into(),
            message_sha256: "d".repeat(64),
            quorum: 2,
            expires_at: 1_900_000_000,
            subject: Some("x".repeat(998)),
            reply_to: Some("y".repeat(998)),
            ..Record::default()
        };
        let card = card_blocks(&record, "```\n*Approved* <!channel>\n");
        parses(&card);
        let blocks = card.as_array().unwrap();
        assert_eq!(
            blocks.last().unwrap()["elements"][0]["value"],
            "d".repeat(64)
        );
        let frame = blocks[0]["text"]["text"].as_str().unwrap();
        assert!(frame.chars().count() <= 3000 && frame.starts_with("Approval requested"));
        let invisible = Record {
            subject: Some("\u{AD}".repeat(499)),
            ..record.clone()
        };
        let card = card_blocks(&invisible, "c");
        let frame = card[0]["text"]["text"].as_str().unwrap();
        assert!(frame.chars().count() <= 3000, "{}", frame.chars().count());
        for label in [
            "Size:",
            "Digest:",
            "Deadline:",
            "Edited:",
            "Approvals:",
            "To decide:",
        ] {
            assert!(frame.contains(label), "{label} kept: {frame}");
        }
        let long = card_blocks(&record, &"z".repeat(CARD_CHUNK * (CARD_CHUNKS + 2)));
        parses(&long);
        assert!(long.as_array().unwrap().len() <= 50);
        parses(&closed_blocks(&record, "rejected"));
        assert_eq!(
            modal_target(
                reason_modal("C1:1.2", "abc")["private_metadata"]
                    .as_str()
                    .unwrap()
            ),
            Some(("C1:1.2".into(), "abc".into()))
        );
    }

    #[test]
    fn reactions() {
        let a = vec!["white_check_mark".to_string(), "+1".to_string()];
        let r = vec![":x:".to_string()];
        assert_eq!(
            reaction_verdict("white_check_mark", &a, &r),
            Some(Verdict::Approved)
        );
        assert_eq!(reaction_verdict("x", &a, &r), Some(Verdict::Rejected));
        assert_eq!(reaction_verdict("tada", &a, &r), None);
        assert_eq!(
            reaction_verdict("+1::skin-tone-3", &a, &r),
            Some(Verdict::Approved)
        );
    }
}
