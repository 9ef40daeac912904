//! The plain-text frame every surface shows around a parked message, and the
//! notification that carries its values.
//!
//! Invariants:
//! - A notification holds the record's values its frame shows
//!   ([`frame_values`], byte-stable: a fixed order, written by hand), not the
//!   frame as text; the frame is drawn from them ([`notification_text`]).
//! - A card's content is its notification's own `approval_content`, or the
//!   record's preview only where the digest among those values binds it
//!   exactly ([`previewed`]): no one who can write the record can change
//!   what a card shows.
//! - A notification is believed only with exactly a notification's field
//!   names ([`is_notification_layout`]), checked before its digest.
//! - Every line of agent content is behind [`CONTENT_MARK`], so no line the
//!   agent wrote can read as a frame line, and text that would act on the
//!   display (control, bidirectional, invisible characters) is shown as a
//!   placeholder instead ([`display_safe`]).
//! - A cut frame says how many bytes are hidden and how to see them.

use super::record::Record;

/// Characters of content kept in `content_preview` (the protocol's 200).
pub const PREVIEW_CHARS: usize = 200;

/// The first [`PREVIEW_CHARS`] characters.
pub fn preview(content: &str) -> String {
    content.chars().take(PREVIEW_CHARS).collect()
}

/// Removes skin tones and presentation selectors, so 👍🏽 counts as 👍.
pub fn normalize_emoji(emoji: &str) -> String {
    emoji
        .chars()
        .filter(|c| !matches!(*c, '\u{FE0E}' | '\u{FE0F}' | '\u{1F3FB}'..='\u{1F3FF}'))
        .collect()
}

/// Whether a reaction asks for "later" (a snooze by the bridge's
/// `approval.snooze`; never a decision): 💤 or ⏰.
pub fn is_later_emoji(emoji: &str) -> bool {
    matches!(normalize_emoji(emoji).as_str(), "💤" | "⏰")
}

/// How to answer, for surfaces that react (console, Discord).
pub const REACT_HINT: &str = "react ✅ to approve or ❌ to reject";

/// Shows agent text without letting it act on the display: control characters
/// (other than tab and newline) and bidirectional overrides become visible placeholders, so
/// a carriage return cannot overwrite a line and U+202E cannot reverse one.
pub fn display_safe(text: &str) -> String {
    drawn(text, true)
}

/// `text` with what may not be shown as is replaced by placeholders; tab
/// and newline kept when `breaks`. One string written in place: every card
/// draws each of its values and lines of content through here.
fn drawn(text: &str, breaks: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' | '\n' if breaks => out.push(c),
            c if c.is_control() || invisible(c) => {
                let _ = write!(out, "<U+{:04X}>", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Characters that change how text around them is shown while showing nothing
/// themselves: bidirectional controls, line and paragraph separators (which
/// break lines where `\n` does not), zero-width and other format characters,
/// fillers and tags. Variation selectors stay: they only pick an emoji's look.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}'
        | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E007F}')
}

/// A value of a frame line: [`display_safe`], and a line break or tab shown
/// as a placeholder too, so the value stays on its own labelled line. The
/// record's display fields are writable by every surface that shows a card
/// (Redis ACLs do not reach inside a hash); validated single lines at park
/// time, they need not be single lines when a card is drawn.
pub fn one_line(text: &str) -> String {
    drawn(text, false)
}

/// The marker in front of every line of agent content in plain-text frames.
pub const CONTENT_MARK: &str = "| ";

/// The frame's lines about a parked message (everything but its content), in
/// order: what a human needs to decide, each value on its own labelled line.
pub fn frame_head(record: &Record, how_to_answer: &str) -> Vec<String> {
    let deadline = match record.expires_at {
        0 => "never expires".to_string(),
        t => format!("{t} (unix seconds); undecided by then, it is dropped"),
    };
    let optional = |value: &Option<String>| match value {
        None => "(none)".to_string(),
        Some(v) => one_line(v),
    };
    let mut head = vec![
        format!("Approval requested [{}]", one_line(&record.id)),
        format!(
            "From:      {}",
            one_line(record.agent().unwrap_or("an agent on the shared outbox"))
        ),
        format!("Via:       {}", one_line(record.source())),
        format!("To:        {}", one_line(&record.channel_id)),
        format!("Subject:   {}", optional(&record.subject)),
        format!("Reply to:  {}", optional(&record.reply_to)),
        format!("Size:      {} bytes", record.content_bytes),
        format!(
            "Digest:    {} (sha256 of the whole message)",
            one_line(&record.message_sha256)
        ),
        format!("Deadline:  {deadline}"),
        match (&record.edited_by, &record.original_sha256) {
            (Some(by), Some(original)) => format!(
                "Edited:    by {}, edit {}; the agent's version had digest {}",
                one_line(by),
                record.revision,
                one_line(original)
            ),
            _ => "Edited:    no (as the agent wrote it)".to_string(),
        },
        match record.quorum() {
            1 => "Approvals: one approver decides".to_string(),
            q => format!("Approvals: {q} different approvers must approve; one rejection rejects"),
        },
        format!(
            "To decide: {how_to_answer}, or run `cowboy approvals approve|reject {}`",
            &record.id[..8.min(record.id.len())]
        ),
    ];
    // Only once snoozed, so a record never snoozed renders as it always did.
    let mut at = 9;
    if let Some(later) = record.snoozed(|t| format!("{t} (unix seconds)")) {
        head.insert(at, format!("Later:     {}", one_line(&later)));
        at += 1;
    }
    // Only once escalated, likewise (after the deadline's lines).
    if let Some(step) = record.escalation() {
        head.insert(at, format!("Escalated: {}", one_line(&step)));
    }
    head
}

/// Renders the plain-text approval request: the frame, then every line of the
/// content behind [`CONTENT_MARK`], then an end line. No line the agent wrote can
/// read as a frame line. `limit` is the most bytes the notify platform shows; if
/// the whole text does not fit, whole content lines are kept while they fit and
/// the end line says how many bytes are hidden and how to see them.
pub fn render_notification(
    record: &Record,
    content: &str,
    how_to_answer: &str,
    limit: Option<usize>,
) -> String {
    let mut out = frame_head(record, how_to_answer).join("\n");
    out.push_str("\nThe message, every line marked with \"| \":\n");
    let total = content.len();
    let lines: Vec<&str> = content.split('\n').collect();
    let marked = |l: &str| format!("{CONTENT_MARK}{}\n", display_safe(l));
    // Each line drawn once, whether it all fits or not.
    let drawn: Vec<String> = lines.iter().map(|l| marked(l)).collect();
    let end_all = format!("(end of message: {total} bytes, {} lines)", lines.len());
    let full = out.len() + drawn.iter().map(String::len).sum::<usize>() + end_all.len();
    match limit {
        Some(limit) if full > limit => {
            let note = |hidden: usize| {
                format!(
                    "(message cut here: {hidden} of {total} bytes hidden; see all: cowboy approvals show {})",
                    record.id
                )
            };
            let room = limit.saturating_sub(out.len() + note(total).len());
            let (mut used, mut shown) = (0usize, 0usize);
            for (line, m) in lines.iter().zip(&drawn) {
                if used + m.len() <= room {
                    used += m.len();
                    shown += line.len() + 1;
                    out.push_str(m);
                    continue;
                }
                // The first line that does not fit is shown as far as it fits.
                let space = room.saturating_sub(used + CONTENT_MARK.len() + 1);
                let (mut cut, mut width) = (0, 0);
                for (i, c) in line.char_indices() {
                    let w = display_safe(c.encode_utf8(&mut [0; 4])).len();
                    if width + w > space {
                        break;
                    }
                    width += w;
                    cut = i + c.len_utf8();
                }
                if cut > 0 {
                    out.push_str(&marked(&line[..cut]));
                    shown += cut;
                }
                break;
            }
            out.push_str(&note(total.saturating_sub(shown)));
        }
        _ => {
            for m in &drawn {
                out.push_str(m);
            }
            out.push_str(&end_all);
        }
    }
    out
}

/// Whose copy of a frame value a surface that lays out its own card shows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TakenFrom {
    /// The notification's: what the message is and whose, as the requesting
    /// service read it.
    Notification,
    /// The record's: its deadline, quorum, snoozes and escalation steps
    /// (the deadline, quorum, snooze count and steps under the requesting
    /// bridge's seal), who snoozed and the surfaces asked: they change while
    /// a card waits.
    Record,
}

/// The record fields [`frame_head`] shows (with the id, which the
/// notification carries as `approval_id`), in the order a notification holds
/// them, each with whose copy a platform's own card shows.
const FRAME_FIELDS: &[(&str, TakenFrom)] = {
    use super::record::field::*;
    use TakenFrom::*;
    &[
        (AGENT, Notification),
        (SOURCE, Notification),
        (CHANNEL_ID, Notification),
        (SUBJECT, Notification),
        (REPLY_TO, Notification),
        (CONTENT_BYTES, Notification),
        (MESSAGE_SHA256, Notification),
        (EXPIRES_AT, Record),
        (NOTIFY, Record),
        (EDITED_BY, Notification),
        (ORIGINAL_SHA256, Notification),
        (REVISION, Notification),
        (QUORUM, Record),
        (SNOOZES, Record),
        (SNOOZED_BY, Record),
        (SNOOZED_UNTIL, Record),
        (ESCALATED, Record),
        (ALSO, Record),
    ]
};

/// The values of `record` its frame shows, as a JSON object of record
/// fields (absent ones left out, in [`FRAME_FIELDS`] order, so the same
/// record always gives the same text and a resumed park the same digest).
/// Written by hand rather than through a JSON map, whose key order depends on
/// a crate feature any dependency may turn on: the digest must not move.
pub fn frame_values(record: &Record) -> String {
    let pairs: std::collections::HashMap<String, String> = record.to_pairs().into_iter().collect();
    let values: Vec<String> = FRAME_FIELDS
        .iter()
        .filter_map(|(name, _)| {
            let value = pairs.get(*name)?;
            let value = serde_json::Value::String(value.clone());
            Some(format!("\"{name}\":{value}"))
        })
        .collect();
    format!("{{{}}}", values.join(","))
}

/// [`with_told`] from a notification's `approval_frame` as written (tests:
/// the services draw through [`drawn_notification`], which reads it once).
/// `None` when `values` do not parse.
#[cfg(test)]
pub(crate) fn with_frame_values(record: &Record, values: &str) -> Option<Record> {
    Some(with_told(record, told(&record.id, values)?))
}

/// A notification's `approval_frame` read as a record of its own (only the
/// values it carries), so each value is parsed as the record's would be and
/// an absent one reads as absent. `None` when they do not parse.
fn told(id: &str, values: &str) -> Option<Record> {
    let values: std::collections::HashMap<String, String> = serde_json::from_str(values).ok()?;
    Some(Record::from_map(id, values))
}

/// `record` with the values that say what the message is and whose replaced
/// by a notification's own (`theirs`, its `approval_frame` read: what the
/// requesting service wrote, bound by the notification's digest), for
/// surfaces that lay out their own card from a record (Discord, Slack, the
/// approval email): their header then names what the console's frame names,
/// whatever the record holds now. The rest stays the record's: the deadline,
/// quorum, snooze count and escalation steps (sealed by the requesting
/// bridge, and newer than a card that waited), who snoozed and the surfaces
/// asked (not sealed). Copied field by field: every card of a batch goes
/// through here, and a whole record written out to pairs and read back cost
/// more than drawing its frame.
fn with_told(record: &Record, theirs: Record) -> Record {
    // The fields of `FRAME_FIELDS` taken from the notification, one by one
    // (`frame::tests::frame_values_replace_the_notified_fields_only` holds
    // this list to it).
    Record {
        agent: theirs.agent,
        source: theirs.source,
        channel_id: theirs.channel_id,
        subject: theirs.subject,
        reply_to: theirs.reply_to,
        content_bytes: theirs.content_bytes,
        message_sha256: theirs.message_sha256,
        edited_by: theirs.edited_by,
        original_sha256: theirs.original_sha256,
        revision: theirs.revision,
        ..record.clone()
    }
}

/// A notification entry drawn for its surface, its values read once.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// The plain-text card; `None` when it cannot be drawn (values that do
    /// not parse, or no content that the values bind).
    pub text: Option<String>,
    /// The content approvers are asked about, for platforms that lay out
    /// their own card: the notification's own, or the record's preview it
    /// stands for ([`previewed`]).
    pub content: Option<String>,
    /// `record` with the notification's values laid over it (its header
    /// names what the frame names; `record` itself when the entry carries
    /// no values that parse).
    pub record: Record,
}

/// Draws a notification entry (`get` reads its fields) over `record`, the
/// approval as read: the frame from the entry's own values, which its digest
/// binds. An entry written before notifications carried their values (its
/// frame as text in `content`) is shown as written.
pub fn drawn_notification<'a>(record: &Record, get: impl Fn(&str) -> Option<&'a str>) -> Drawn {
    use crate::fields::outbox::{APPROVAL_CONTENT, APPROVAL_FRAME, APPROVAL_ID};
    let given = get(APPROVAL_CONTENT).map(str::to_string);
    let Some(values) = get(APPROVAL_FRAME) else {
        return Drawn {
            text: get("content").map(str::to_string),
            content: given,
            record: record.clone(),
        };
    };
    let Some(theirs) = told(get(APPROVAL_ID).unwrap_or(&record.id), values) else {
        return Drawn {
            text: None,
            content: None,
            record: record.clone(),
        };
    };
    let content = given.or_else(|| previewed(record, &theirs));
    let text = match (get(APPROVAL_ID), &content) {
        (Some(_), Some(content)) => Some(render_notification(&theirs, content, REACT_HINT, None)),
        _ => None,
    };
    Drawn {
        text,
        content,
        record: with_told(record, theirs),
    }
}

/// The record's `content_preview` as the content of a card whose
/// notification was written without its own (the message fits in the
/// preview, see [`notification_fields`]): only when it is exactly the message
/// the notification's values bind, their `message_sha256` over their
/// destination, subject and reply-to. Any surface's outbox can write the
/// record's preview; none can make other text match that digest, so a
/// rewritten preview draws no card at all.
fn previewed(record: &Record, theirs: &Record) -> Option<String> {
    let preview = &record.content_preview;
    let digest = super::message_sha256(
        &theirs.channel_id,
        theirs.subject.as_deref(),
        theirs.reply_to.as_deref(),
        preview,
    );
    (!theirs.message_sha256.is_empty() && digest == theirs.message_sha256).then(|| preview.clone())
}

/// The field names of a notification, in order: with its content, without
/// it (the record's preview holds all of it), and as an earlier version
/// wrote them (its frame as text in `content`).
const LAYOUTS: [&[&str]; 3] = {
    use crate::fields::outbox::{APPROVAL_CONTENT, APPROVAL_FRAME, APPROVAL_ID};
    [
        &[APPROVAL_ID, "channel_id", APPROVAL_FRAME, APPROVAL_CONTENT],
        &[APPROVAL_ID, "channel_id", APPROVAL_FRAME],
        &[APPROVAL_ID, "channel_id", "content", APPROVAL_CONTENT],
    ]
};

/// Whether an entry has exactly a notification's fields, in order. Checked
/// before its digest is: the digest frames each value by its length but
/// not each name, so with names of the entry's own choosing (a name may hold
/// `=` and a line break) another list of fields could give the same bytes.
pub fn is_notification_layout<'a>(names: impl IntoIterator<Item = &'a str>) -> bool {
    let names: Vec<&str> = names.into_iter().collect();
    LAYOUTS.iter().any(|layout| names == *layout)
}

/// The plain-text card of a notification entry (`get` reads its fields) of
/// `record` (see [`drawn_notification`]). `None` when it cannot be drawn.
pub fn notification_text<'a>(
    record: &Record,
    get: impl Fn(&str) -> Option<&'a str>,
) -> Option<String> {
    drawn_notification(record, get).text
}

/// The notification entry for a parked record, in the order it is written: the
/// approval id, the card's destination, the record's values its frame shows
/// (the plain-text frame, for platforms that show text as is, is drawn from
/// them: [`notification_text`]) and the exact content `content` (for those
/// that lay out their own card), unless the record's preview is that
/// content and the message itself (then the preview stands for it, checked
/// by the message digest the values carry: [`previewed`]; a copy cost about
/// 270 of the 2,700 bytes a parked approval held in Redis). Deterministic, so a
/// resumed park writes the same entry. `channel`: where the card goes on
/// its surface (each card's own). The frame is not written as text: it
/// would hold the content a second time and a dozen lines of labels.
pub fn notification_fields(
    record: &Record,
    channel: &str,
    content: &str,
) -> Vec<(&'static str, Vec<u8>)> {
    let values = frame_values(record);
    // Left out only where the card will draw exactly `content` from this
    // record: decided by the very check the card makes, on the values as it
    // will read them back (an empty subject, say, reads back as none).
    let in_preview = content.chars().count() <= PREVIEW_CHARS
        && told(&record.id, &values)
            .and_then(|theirs| previewed(record, &theirs))
            .is_some_and(|previewed| previewed == content);
    let mut fields = vec![
        (
            crate::fields::outbox::APPROVAL_ID,
            record.id.clone().into_bytes(),
        ),
        ("channel_id", channel.as_bytes().to_vec()),
        (crate::fields::outbox::APPROVAL_FRAME, values.into_bytes()),
    ];
    if !in_preview {
        fields.push((
            crate::fields::outbox::APPROVAL_CONTENT,
            content.as_bytes().to_vec(),
        ));
    }
    fields
}

pub fn notification_digest(fields: &[(&'static str, Vec<u8>)]) -> String {
    super::fields_sha256(fields.iter().map(|(k, v)| (*k, Some(v.as_slice()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The notified fields come from the notification, whatever the record
    /// holds, and every other field stays the record's: the same record as
    /// writing the record out, replacing those fields and reading it back.
    #[test]
    fn frame_values_replace_the_notified_fields_only() {
        let by_pairs = |record: &Record, values: &str| {
            let values: std::collections::HashMap<String, String> =
                serde_json::from_str(values).unwrap();
            let mut map: std::collections::HashMap<String, String> =
                record.to_pairs().into_iter().collect();
            for (name, _) in FRAME_FIELDS
                .iter()
                .filter(|(_, s)| *s == TakenFrom::Notification)
            {
                match values.get(*name) {
                    Some(v) => map.insert(name.to_string(), v.clone()),
                    None => map.remove(*name),
                };
            }
            Record::from_map(&record.id, map)
        };
        let plain = Record {
            id: "0b1c".into(),
            source: "mail".into(),
            agent: Some("ann".into()),
            channel_id: "bob@example.org".into(),
            subject: Some("hello".into()),
            content_bytes: 5,
            message_sha256: "aa".into(),
            expires_at: 99,
            quorum: 2,
            snoozes: 1,
            snoozed_by: Some("cli:op".into()),
            escalated: 1,
            ..Record::default()
        };
        let edited = Record {
            edited_by: Some("cli:op".into()),
            original_sha256: Some("bb".into()),
            revision: 2,
            reply_to: Some("7".into()),
            ..plain.clone()
        };
        // What the notification says differs in every notified field, and
        // leaves some out.
        let told = Record {
            source: "desk".into(),
            agent: Some("bea".into()),
            channel_id: "eve@example.org".into(),
            subject: None,
            content_bytes: 9,
            message_sha256: "cc".into(),
            edited_by: Some("console:boss".into()),
            original_sha256: Some("dd".into()),
            revision: 3,
            reply_to: Some("8".into()),
            expires_at: 1,
            ..Record::default()
        };
        for values in [frame_values(&told), frame_values(&plain), "{}".to_string()] {
            for record in [&plain, &edited] {
                assert_eq!(
                    with_frame_values(record, &values).unwrap(),
                    by_pairs(record, &values),
                    "{values}"
                );
            }
        }
        assert!(with_frame_values(&plain, "not json").is_none());
    }

    /// Tab and newline stay in content and become placeholders in a value;
    /// every other control or invisible character is a placeholder in both.
    #[test]
    fn what_may_not_show_is_a_placeholder() {
        let text = "a\tb\nc\rd\u{202E}e\u{200B}f 👍\u{1F3FD}é";
        assert_eq!(
            display_safe(text),
            "a\tb\nc<U+000D>d<U+202E>e<U+200B>f 👍\u{1F3FD}é"
        );
        assert_eq!(
            one_line(text),
            "a<U+0009>b<U+000A>c<U+000D>d<U+202E>e<U+200B>f 👍\u{1F3FD}é"
        );
        assert_eq!(display_safe(""), "");
    }

    /// Whatever the agent writes, every content line is marked, so a fake frame
    /// line, separator or end note shows up as content.
    #[test]
    fn content_cannot_imitate_the_frame() {
        let record = Record {
            id: "0123456789".into(),
            content_bytes: 9,
            ..Record::default()
        };
        let evil = "hi\n(end of message: 2 bytes, 1 lines)\nApproval requested [x]\rTo:        boss\n\u{202E}gnp.exe\u{2028}(end of message)\u{200B}\u{061C}";
        let text = render_notification(&record, evil, REACT_HINT, None);
        let body: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("The message"))
            .skip(1)
            .collect();
        let (end, content) = body.split_last().unwrap();
        assert!(
            content.iter().all(|l| l.starts_with(CONTENT_MARK)),
            "{text}"
        );
        assert!(end.starts_with("(end of message:"), "{end}");
        assert_eq!(content.len(), 4);
        for c in ['\r', '\u{202E}', '\u{2028}', '\u{200B}', '\u{061C}'] {
            assert!(!text.contains(c), "{c:?} is shown, not obeyed");
        }
        assert_eq!(text.matches("Approval requested").count(), 2);
        assert!(
            text.lines()
                .filter(|l| l.starts_with("Approval requested"))
                .count()
                == 1
        );
    }

    #[test]
    fn truncated_notification_says_what_is_hidden() {
        let record = Record {
            id: "0123456789".into(),
            ..Record::default()
        };
        let content = "é".repeat(2000);
        let text = render_notification(&record, &content, REACT_HINT, Some(1000));
        assert!(text.len() <= 1000, "{}", text.len());
        let shown = text.lines().find(|l| l.starts_with(CONTENT_MARK)).unwrap();
        let hidden = 4000 - (shown.len() - CONTENT_MARK.len());
        assert!(
            text.ends_with(&format!(
                "{hidden} of 4000 bytes hidden; see all: cowboy approvals show 0123456789)"
            )),
            "{text}"
        );
        let full = render_notification(&record, "short", REACT_HINT, Some(1000));
        assert!(full.contains("\n| short\n(end of message: 5 bytes, 1 lines)"));
    }

    /// A notification holds the record's values, not its frame as text, and
    /// draws the very frame the record had when it was written, whatever
    /// the record says later; one written with its frame as text is shown as
    /// written.
    #[test]
    fn a_notification_draws_the_frame_it_was_written_with() {
        use super::super::record::Card;
        let record = Record {
            id: "0123456789".into(),
            agent: Some("ann".into()),
            source: "mail".into(),
            channel_id: "bob@example.org".into(),
            subject: Some("Lunch".into()),
            reply_to: Some("<m1@example.org>".into()),
            content_bytes: 5,
            message_sha256: "ab".repeat(32),
            expires_at: 1_900_000_000,
            notify: "desk".into(),
            edited_by: Some("cli:op".into()),
            original_sha256: Some("cd".repeat(32)),
            revision: 2,
            quorum: 2,
            snoozes: 1,
            snoozed_by: Some("console:boss".into()),
            snoozed_until: Some(1_900_000_000),
            escalated: 1,
            also: vec![Card {
                bridge: "hall".into(),
                ..Card::default()
            }],
            ..Record::default()
        };
        let fields = notification_fields(&record, "ops", "hello");
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::str::from_utf8(v).unwrap())
        };
        let drawn = notification_text(&Record::default(), get).unwrap();
        assert_eq!(
            drawn,
            render_notification(&record, "hello", REACT_HINT, None)
        );
        // Read once for both: the text, and the record a platform's own
        // card is drawn from, as the two functions give them apart.
        let stored = Record {
            channel_id: "changed@example.org".into(),
            ..record.clone()
        };
        let values = get("approval_frame").unwrap();
        assert_eq!(
            drawn_notification(&stored, get),
            Drawn {
                text: Some(drawn.clone()),
                content: Some("hello".into()),
                record: with_frame_values(&stored, values).unwrap()
            }
        );
        for line in [
            "Later:",
            "Escalated: escalated 1 step: asked on desk, hall",
            "Edited:    by cli:op, edit 2",
        ] {
            assert!(drawn.contains(line), "{line}: {drawn}");
        }
        assert!(!fields.iter().any(|(k, _)| *k == "content"));
        // In a fixed order, whatever a JSON crate feature says.
        assert!(get("approval_frame").unwrap().starts_with(
            r#"{"agent":"ann","source":"mail","channel_id":"bob@example.org","subject":"Lunch","#
        ));
        assert!(is_notification_layout(fields.iter().map(|(k, _)| *k)));
        for names in [
            &["approval_id", "channel_id", "content", "approval_content"][..],
            &[
                "approval_id",
                "channel_id=3:ops\napproval_frame",
                "approval_content",
            ][..],
            &[
                "approval_id",
                "channel_id",
                "approval_content",
                "approval_frame",
            ][..],
            &[
                "approval_id",
                "channel_id",
                "approval_frame",
                "approval_content",
                "content",
            ][..],
        ] {
            let legacy = names[2] == "content";
            assert_eq!(
                is_notification_layout(names.iter().copied()),
                legacy,
                "{names:?}"
            );
        }
        let total: usize = fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(
            total < drawn.len(),
            "{total} bytes hold a {}-byte card",
            drawn.len()
        );
        // A surface that lays out its own card reads them over the record
        // as it is now.
        // Its sealed values (here a later snooze) are the record's own.
        let rewritten = Record {
            agent: Some("the-ceo".into()),
            channel_id: "eve@example.org".into(),
            subject: None,
            nonce: "n1".into(),
            expires_at: 1_900_003_600,
            snoozes: 2,
            ..record.clone()
        };
        let shown = with_frame_values(&rewritten, get("approval_frame").unwrap()).unwrap();
        assert_eq!(
            Record {
                nonce: "n1".into(),
                expires_at: 1_900_003_600,
                snoozes: 2,
                ..record.clone()
            },
            shown
        );
        let old = |name: &str| match name {
            "approval_id" => Some("0123456789"),
            "content" => Some("Approval requested [0123456789] as written"),
            _ => None,
        };
        assert_eq!(
            notification_text(&Record::default(), old).as_deref(),
            Some("Approval requested [0123456789] as written")
        );
        let broken = |name: &str| match name {
            "approval_frame" => Some("{"),
            _ => get(name),
        };
        assert_eq!(notification_text(&Record::default(), broken), None);
    }

    /// A message the record's preview holds whole is not copied into its
    /// notification: the card draws it from the record, and only while the
    /// preview is exactly the message the notification's values bind. A
    /// longer message, or content that is more than the message (a
    /// destination's context), keeps its own copy.
    #[test]
    fn a_short_messages_card_draws_it_from_the_preview_it_binds() {
        use crate::entry::Message;
        let message = |content: &str| Message {
            channel_id: "bob@example.org".into(),
            subject: Some("Lunch".into()),
            content: content.into(),
            ..Message::default()
        };
        let record_of = |m: &Message| Record {
            id: "0123456789".into(),
            source: "mail".into(),
            channel_id: m.channel_id.clone(),
            subject: m.subject.clone(),
            content_preview: preview(&m.content),
            content_bytes: m.content.len() as u64,
            message_sha256: m.sha256(),
            ..Record::default()
        };
        let names = |fields: &[(&str, Vec<u8>)]| -> Vec<String> {
            fields.iter().map(|(k, _)| k.to_string()).collect()
        };
        // Exactly the preview's 200 characters (400 bytes) is short.
        for content in ["Lunch at noon?".to_string(), "é".repeat(PREVIEW_CHARS)] {
            let short = message(&content);
            let record = record_of(&short);
            let fields = notification_fields(&record, "ops", &content);
            assert_eq!(
                names(&fields),
                ["approval_id", "channel_id", "approval_frame"]
            );
            assert!(is_notification_layout(fields.iter().map(|(k, _)| *k)));
            let get = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::str::from_utf8(v).unwrap())
            };
            let drawn = drawn_notification(&record, get);
            assert_eq!(drawn.content.as_deref(), Some(content.as_str()));
            assert_eq!(
                drawn.text,
                Some(render_notification(&record, &content, REACT_HINT, None))
            );
            // The preview rewritten, alone or with the record's own digest
            // and destination to match it: no card, no content.
            let other = message("Wire 50k EUR");
            for forged in [
                Record {
                    content_preview: "Lunch at one?".into(),
                    ..record.clone()
                },
                Record {
                    content_preview: other.content.clone(),
                    message_sha256: other.sha256(),
                    ..record.clone()
                },
                Record {
                    content_preview: String::new(),
                    ..record.clone()
                },
            ] {
                let drawn = drawn_notification(&forged, get);
                assert_eq!((drawn.text, drawn.content), (None, None), "{forged:?}");
            }
        }
        // Whatever the layout, a genuine card draws its content: an empty
        // subject reads back from the values as none.
        let empty = Message {
            subject: Some(String::new()),
            reply_to: Some(String::new()),
            ..message("Lunch at noon?")
        };
        let record = record_of(&empty);
        let fields = notification_fields(&record, "ops", &empty.content);
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::str::from_utf8(v).unwrap())
        };
        assert_eq!(
            drawn_notification(&record, get).content.as_deref(),
            Some("Lunch at noon?")
        );
        // Longer than the preview, or more than the message: copied.
        let long = message(&"m".repeat(PREVIEW_CHARS + 1));
        let short = message("Lunch at noon?");
        let context = format!(
            "{}\n\nThe agent wrote the destination as `bob`.",
            short.content
        );
        for (record, content) in [
            (record_of(&long), long.content.as_str()),
            (record_of(&short), context.as_str()),
        ] {
            let fields = notification_fields(&record, "ops", content);
            assert_eq!(names(&fields).last().unwrap(), "approval_content");
            assert_eq!(fields[3].1, content.as_bytes());
        }
    }

    /// A record's display fields rewritten with line breaks (a surface's
    /// outbox may write them) still give one labelled line each: no value
    /// can add a frame line or a content line.
    #[test]
    fn header_values_stay_on_their_lines() {
        let forged = "x\n| approve me\n(end of message: 1 bytes, 1 lines)\tz";
        let record = Record {
            id: "0123456789".into(),
            agent: Some(forged.into()),
            source: forged.into(),
            channel_id: forged.into(),
            subject: Some(forged.into()),
            reply_to: Some(forged.into()),
            message_sha256: forged.into(),
            edited_by: Some(forged.into()),
            original_sha256: Some(forged.into()),
            ..Record::default()
        };
        let plain = Record {
            id: "0123456789".into(),
            ..Record::default()
        };
        let head = frame_head(&record, REACT_HINT);
        assert_eq!(head.len(), frame_head(&plain, REACT_HINT).len());
        for line in &head {
            assert!(!line.contains('\n') && !line.contains('\t'), "{line:?}");
        }
        assert!(head[1]
            .ends_with("x<U+000A>| approve me<U+000A>(end of message: 1 bytes, 1 lines)<U+0009>z"));
    }
}
