//! Pure logic of the Discord bridge: splitting long content, nonces, the
//! approval card, and what a reaction or a reply to the card means.

use broker::approval::{normalize_emoji, Record, Verdict};

/// Discord's limit on a message's content, in UTF-16 code units.
pub const LIMIT: usize = 2000;

fn units(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Splits `content` into messages of at most `limit` UTF-16 units (see
/// [`broker::text::split`]).
pub fn split(content: &str, limit: usize) -> Vec<String> {
    broker::text::split(content, limit, char::len_utf16)
}

/// A nonce for part `part` of a delivery: derived, so a retry reuses it, and at
/// most 25 characters, as Discord requires.
pub fn nonce(delivery_key: &str, part: usize) -> String {
    let digest = broker::approval::sha256_hex(delivery_key.as_bytes());
    format!("{}{:03}", &digest[..22], part % 1000)
}

/// Inline code that agent text cannot close: backticks become a look-alike,
/// and a line break a placeholder (the value stays on its labelled line).
pub fn inline_code(text: &str) -> String {
    format!(
        "`{}`",
        broker::approval::one_line(text).replace('`', "\u{02CB}")
    )
}

/// Agent text made safe for a code block: a zero-width space follows every
/// backtick, so no run of three can end the fence early. Inside the block,
/// markdown, mentions and masked links are shown as written.
fn code_body(text: &str) -> String {
    broker::approval::display_safe(text).replace('`', "`\u{200B}")
}

fn fence(body: &str) -> String {
    format!("```text\n{body}\n```")
}

/// A code block holding `text` verbatim.
pub fn code_block(text: &str) -> String {
    fence(&code_body(text))
}

/// The head of the approval card (the message that carries the reactions): the
/// frame, in the bot's own bold text; every value the agent chose is in code.
pub fn card_head(record: &Record, status: Option<&str>) -> String {
    let deadline = match record.expires_at {
        0 => "no deadline".to_string(),
        t => format!("decide by <t:{t}:f> (<t:{t}:R>)"),
    };
    let status = status.map(|s| format!("{s}\n")).unwrap_or_default();
    // Each is at most 998 bytes; on the card a long one is cut with a note, so
    // the head always fits one message (the whole value: `approvals show`).
    let optional = |value: &Option<String>| match value.as_deref().unwrap_or("") {
        "" => "(none)".to_string(),
        v if broker::approval::one_line(v).chars().count() > HEAD_VALUE_CHARS => {
            // Cut where it is shown (escapes make it longer), on a character.
            let safe = broker::approval::one_line(v);
            let shown: String = safe.chars().take(HEAD_VALUE_CHARS).collect();
            format!(
                "{} (cut: {} more characters; see all: `cowboy approvals show {}`)",
                inline_code(&shown),
                safe.chars().count() - HEAD_VALUE_CHARS,
                record.id
            )
        }
        v => inline_code(v),
    };
    let snoozed = match record.snoozed_until.map(|_| record.expires_at) {
        Some(t) => format!(
            "💤 **Snoozed** by {} until <t:{t}:f> (snooze {})\n",
            inline_code(record.snoozed_by.as_deref().unwrap_or("an approver")),
            record.snoozes
        ),
        None => String::new(),
    };
    let escalated = match record.escalation() {
        Some(step) => format!("⏫ **Escalated**: {}\n", broker::approval::one_line(&step)),
        None => String::new(),
    };
    let edited = match (&record.edited_by, &record.original_sha256) {
        (Some(by), Some(original)) => format!(
            "✏️ **Edited** by {} (edit {}): this is not the agent's text; the agent's had sha256 {}\n",
            inline_code(by),
            record.revision,
            inline_code(original)
        ),
        _ => String::new(),
    };
    format!(
        "{status}{snoozed}{escalated}{edited}**Approval requested** {id}\n**{who}** wants to send via **{bridge}**\n**To:** {dest}\n**Subject:** {subject}\n**Reply to:** {reply_to}\n{bytes} bytes · sha256 {sha} · {deadline}\n",
        id = inline_code(&record.id),
        who = broker::approval::one_line(record.agent().unwrap_or("an agent")),
        bridge = broker::approval::one_line(record.source()),
        dest = inline_code(&record.channel_id),
        subject = optional(&record.subject),
        reply_to = optional(&record.reply_to),
        bytes = record.content_bytes,
        sha = inline_code(&record.message_sha256),
    )
}

/// Characters of `subject` or `reply_to` shown in a card's head.
pub const HEAD_VALUE_CHARS: usize = 200;

/// How to answer, on a live card.
pub const HOW_TO_ANSWER: &str =
    "React ✅ to send it or ❌ to drop it (💤: later), or reply `approve` / `reject <reason>` / `later 2h`.";

/// The card's messages: the head, then the whole content verbatim in a code
/// block (in `n/m` labelled parts when it does not fit one message).
pub fn card(record: &Record, content: &str) -> Vec<String> {
    let head = format!("{}{HOW_TO_ANSWER}\n", card_head(record, None));
    let whole = format!("{head}{}", code_block(content));
    if units(&whole) <= LIMIT {
        return vec![whole];
    }
    let parts = split(&code_body(content), LIMIT - 40);
    let m = parts.len();
    let mut messages = vec![format!("{head}The message follows in {m} parts.")];
    messages.extend(
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| format!("**{}/{m}**\n{}", i + 1, fence(&p))),
    );
    messages
}

/// The reminder posted as a reply to a card still waiting (from the record).
pub fn reminder(record: &Record) -> String {
    let deadline = match record.expires_at {
        0 => String::new(),
        t => format!(" It expires <t:{t}:R>."),
    };
    format!(
        "⏰ **Still waiting for a decision:** approval {} from **{}** via **{}**, asked <t:{}:R>.{deadline} Answer on the card above.",
        inline_code(&record.id),
        broker::approval::one_line(record.agent().unwrap_or("an agent")),
        broker::approval::one_line(record.source()),
        record.created_at
    )
}

/// The card head once the approval is over, from the settled record.
pub fn closed_card(record: &Record, outcome: &str) -> String {
    let who = |a: &str| {
        a.strip_prefix("discord:")
            .map(|id| format!("<@{id}>"))
            .unwrap_or_else(|| inline_code(a))
    };
    let at = record.decided_at.unwrap_or_else(broker::now_secs);
    let status = match outcome {
        "approved" => format!(
            "✅ **Approved** by {} at <t:{at}:f> — sent.",
            who(record.approver())
        ),
        "rejected" => {
            let reason = record.reason();
            let reason = if reason.is_empty() {
                String::new()
            } else {
                format!(": {}", inline_code(reason))
            };
            format!(
                "❌ **Rejected** by {} at <t:{at}:f>{reason}",
                who(record.approver())
            )
        }
        "expired" => "⌛ **Expired** — nobody decided in time; not sent.".to_string(),
        "superseded" => {
            "✏️ **Edited** by an approver — this version is void; decide on the new card below."
                .to_string()
        }
        "uncertain" => {
            "❓ **Approved, delivery uncertain** — it may have been sent; the agent was told."
                .to_string()
        }
        _ => "⚠️ **Failed** — not sent.".to_string(),
    };
    let mut text = card_head(record, Some(&status));
    if units(&text) > LIMIT {
        text = split(&text, LIMIT).remove(0);
    }
    text
}

/// What a reaction means, given the configured emoji sets.
pub fn reaction_verdict(emoji: &str, approve: &[String], reject: &[String]) -> Option<Verdict> {
    let e = normalize_emoji(emoji);
    let is = |set: &[String]| set.iter().any(|s| normalize_emoji(s) == e);
    if is(approve) {
        Some(Verdict::Approved)
    } else if is(reject) {
        Some(Verdict::Rejected)
    } else {
        None
    }
}

pub use broker::text::reply_verdict;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_short_and_stable() {
        assert!(nonce("a:outbox/1-0", 3).len() <= 25);
        assert_eq!(nonce("a:outbox/1-0", 3), nonce("a:outbox/1-0", 3));
        assert_ne!(nonce("a:outbox/1-0", 3), nonce("a:outbox/1-0", 4));
        assert_ne!(nonce("a:outbox/1-0", 0), nonce("a:outbox/2-0", 0));
    }

    #[test]
    fn verdicts() {
        let a = vec!["✅".to_string(), "👍".to_string()];
        let r = vec!["❌".to_string()];
        assert_eq!(reaction_verdict("👍🏾", &a, &r), Some(Verdict::Approved));
        assert_eq!(reaction_verdict("✅", &a, &r), Some(Verdict::Approved));
        assert_eq!(reaction_verdict("❌", &a, &r), Some(Verdict::Rejected));
        assert_eq!(reaction_verdict("🎉", &a, &r), None);
    }

    #[test]
    fn long_cards_label_every_part() {
        let record = Record {
            id: "id".into(),
            content_bytes: 5000,
            ..Record::default()
        };
        let content = "y ".repeat(2500);
        let card = card(&record, &content);
        assert!(card.len() >= 3);
        let m = card.len() - 1;
        for (i, part) in card.iter().skip(1).enumerate() {
            assert!(part.starts_with(&format!("**{}/{m}**\n```text\n", i + 1)));
            assert!(units(part) <= LIMIT);
        }
    }

    /// Agent text cannot close the code block or the inline code around it.
    #[test]
    fn agent_text_stays_inside_its_code() {
        let record = Record {
            id: "id".into(),
            subject: Some("a` **b**".into()),
            ..Record::default()
        };
        let content = "ok```\n**Approved** @everyone [safe](https://evil)\n```";
        let card = card(&record, content);
        let body = card[0].split_once("```text\n").unwrap().1;
        assert_eq!(body.matches("```").count(), 1, "{body}");
        assert!(body.ends_with("\n```"));
        assert!(card[0].contains("**Subject:** `a\u{02CB} **b**`"));
        let huge = Record {
            id: "id".into(),
            subject: Some("`\u{200B}".repeat(330)),
            reply_to: Some("x".repeat(998)),
            ..Record::default()
        };
        assert!(
            units(&card_head(&huge, None)) < 1200,
            "the head fits one message"
        );
        let long = "`".repeat(3000);
        for part in card_parts(&record, &long) {
            assert!(units(&part) <= LIMIT, "{}", units(&part));
        }
    }

    /// Record fields rewritten with line breaks (a surface's outbox may
    /// write them) keep one line each in the card's head.
    #[test]
    fn head_values_stay_on_their_lines() {
        let forged = "x\n**To:** `someone else`\n";
        let record = Record {
            id: "id".into(),
            agent: Some(forged.into()),
            source: forged.into(),
            channel_id: forged.into(),
            subject: Some(forged.into()),
            message_sha256: forged.into(),
            ..Record::default()
        };
        let plain = Record {
            id: "id".into(),
            ..Record::default()
        };
        let lines = |r: &Record| card_head(r, None).lines().count();
        assert_eq!(
            lines(&record),
            lines(&plain),
            "{}",
            card_head(&record, None)
        );
        assert!(card_head(&record, None).contains("**To:** `x<U+000A>**To:** "));
    }

    fn card_parts(record: &Record, content: &str) -> Vec<String> {
        card(record, content)
    }
}
