//! Outbox entries as agents write them, their validation, and the notices the
//! broker writes back to an agent's inbox.
//!
//! Validation is pure: an [`Entry`] either becomes a [`Message`] or a reason
//! that goes to the dead letter and into a notice. Nothing here touches Redis.

use crate::config::BridgeConfig;
use crate::store::Entry;

/// Fields an agent may write.
pub const AGENT_FIELDS: &[&str] = &[
    "channel_id",
    "content",
    "subject",
    "reply_to",
    "request_id",
    "notices",
];

/// `notices` values: `outcomes` (the default: told only what went wrong or
/// was changed) or `all` (also `parked` and `delivered`, so an agent can
/// follow each request; `cowboy mcp` asks for this).
pub const NOTICES_ALL: &str = "all";
pub const NOTICES_OUTCOMES: &str = "outcomes";

/// Fields only the broker writes, on approval notifications in a flat outbox.
pub const NOTIFICATION_FIELDS: &[&str] = &[
    crate::fields::outbox::APPROVAL_ID,
    "channel_id",
    "content",
    crate::fields::outbox::APPROVAL_CONTENT,
    crate::fields::outbox::APPROVAL_FRAME,
];

/// Largest accepted `subject`, in bytes (one RFC 5322 header line).
pub const MAX_SUBJECT_BYTES: usize = 998;
/// Largest accepted `reply_to`, in bytes (a Message-ID or a platform message id).
pub const MAX_REPLY_TO_BYTES: usize = 998;

/// A valid outbound message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    pub channel_id: String,
    pub content: String,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    pub request_id: Option<String>,
    /// Set on approval notifications only.
    pub approval_id: Option<String>,
    /// On approval notifications: the exact content awaiting approval, for
    /// platforms that lay out their own card instead of `content`.
    pub approval_content: Option<String>,
    /// What the bridge found out about the request, shown to approvers below
    /// the content (a commit's author, subject and changes). The bridge's own
    /// finding, never an agent field, and not part of [`Message::sha256`]: what
    /// is bound is the content.
    pub context: Option<String>,
    /// The agent asked for progress notices too (`notices = all`). Not part
    /// of the digest: it changes what the agent hears, never what is sent.
    pub progress: bool,
}

impl Message {
    /// Parses and validates an agent's entry, its destination taken as written.
    pub fn from_entry(entry: &Entry, bridge: &BridgeConfig) -> Result<Message, String> {
        Message::from_entry_with(entry, bridge, |raw| Ok(raw.to_string()))
    }

    /// Parses and validates an agent's entry, its destination put in the
    /// sender's canonical form (see `Sender::canonical_destination`) before it
    /// is checked against `destinations`. When the agent wrote it differently,
    /// approvers are told both spellings in the message's context.
    pub fn from_entry_with(
        entry: &Entry,
        bridge: &BridgeConfig,
        canonical: impl Fn(&str) -> Result<String, String>,
    ) -> Result<Message, String> {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &entry.fields {
            if NOTIFICATION_FIELDS.contains(&name.as_str())
                && !AGENT_FIELDS.contains(&name.as_str())
            {
                return Err(format!("field `{name}` is reserved for the broker"));
            }
            if !AGENT_FIELDS.contains(&name.as_str()) {
                return Err(format!("unknown field `{}`", name.escape_debug()));
            }
            if !seen.insert(name.as_str()) {
                return Err(format!("field `{name}` appears twice"));
            }
        }
        let channel_id = text(entry, "channel_id")?
            .filter(|c| !c.trim().is_empty())
            .ok_or("missing field `channel_id`")?;
        let content = text(entry, "content")?.ok_or("missing field `content`")?;
        if content.len() > bridge.max_content_bytes {
            return Err(format!(
                "content is {} bytes, over the limit of {}",
                content.len(),
                bridge.max_content_bytes
            ));
        }
        let subject = text(entry, "subject")?.filter(|s| !s.is_empty());
        let reply_to = text(entry, "reply_to")?.filter(|s| !s.is_empty());
        let request_id = text(entry, "request_id")?;
        let progress = match text(entry, "notices")?.as_deref() {
            None | Some(NOTICES_OUTCOMES) => false,
            Some(NOTICES_ALL) => true,
            Some(other) => {
                return Err(format!(
                    "field `notices` is `{}`; it may be `{NOTICES_ALL}` or `{NOTICES_OUTCOMES}`",
                    other.escape_debug()
                ))
            }
        };
        for (name, value, max) in [
            ("channel_id", Some(&channel_id), MAX_REPLY_TO_BYTES),
            ("subject", subject.as_ref(), MAX_SUBJECT_BYTES),
            ("reply_to", reply_to.as_ref(), MAX_REPLY_TO_BYTES),
            // Shown to approvers among the record's fields: one short line too.
            ("request_id", request_id.as_ref(), MAX_SUBJECT_BYTES),
        ] {
            let Some(value) = value else { continue };
            if value.len() > max {
                return Err(format!(
                    "{name} is {} bytes, over the limit of {max}",
                    value.len()
                ));
            }
            // One line each: a line break would let the value pose as a second frame line.
            if value.chars().any(char::is_control) {
                return Err(format!(
                    "{name} contains control characters (line breaks, tabs, ...)"
                ));
            }
        }
        let written = channel_id;
        let channel_id = canonical(&written)
            .map_err(|why| format!("destination `{}`: {why}", written.escape_debug()))?;
        if !bridge.allows_destination(&channel_id) {
            return Err(format!(
                "destination `{channel_id}` is not on this bridge's `destinations` allow-list"
            ));
        }
        let context = (channel_id != written).then(|| {
            format!("The agent wrote the destination as `{written}`; it is delivered to `{channel_id}`.")
        });
        Ok(Message {
            channel_id,
            content,
            subject,
            reply_to,
            request_id,
            approval_id: None,
            approval_content: None,
            context,
            progress,
        })
    }

    /// What approvers are shown: the content, then the context when there is one.
    pub fn for_approvers(&self) -> std::borrow::Cow<'_, str> {
        match &self.context {
            Some(context) => format!("{}\n\n{context}", self.content).into(),
            None => self.content.as_str().into(),
        }
    }

    /// sha256 of a canonical encoding of everything a sender uses: destination,
    /// subject, reply_to and content. This is what an approval binds; a field a
    /// bridge starts sending must be added here.
    pub fn sha256(&self) -> String {
        crate::approval::message_sha256(
            &self.channel_id,
            self.subject.as_deref(),
            self.reply_to.as_deref(),
            &self.content,
        )
    }
}

fn text(entry: &Entry, name: &str) -> Result<Option<String>, String> {
    match entry.get(name) {
        None => Ok(None),
        Some(bytes) => std::str::from_utf8(bytes)
            .map(|s| Some(s.to_string()))
            .map_err(|_| format!("field `{name}` is not valid UTF-8")),
    }
}

/// What became of an agent's entry, as its notice says (the wire spelling is
/// [`NoticeStatus::as_str`], listed in `docs/protocol.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NoticeStatus {
    /// An approver said no.
    Rejected,
    /// Nobody decided in time.
    Expired,
    /// The entry is not a valid request (dead-lettered).
    Invalid,
    /// It could not be delivered, or the declared action failed.
    #[default]
    Failed,
    /// It may or may not have been delivered (never retried blindly).
    Uncertain,
    /// The agent has as many entries parked as its limit allows.
    LimitReached,
    /// Sent as an approver edited it.
    Edited,
    /// A declared action ran and succeeded.
    Done,
    /// A declared action ran past its time limit.
    TimedOut,
    /// Progress (`notices = all` only): parked, waiting for approval.
    Parked,
    /// Progress (`notices = all` only): delivered, with its external id.
    Delivered,
}

impl NoticeStatus {
    pub const ALL: [NoticeStatus; 11] = [
        NoticeStatus::Rejected,
        NoticeStatus::Expired,
        NoticeStatus::Invalid,
        NoticeStatus::Failed,
        NoticeStatus::Uncertain,
        NoticeStatus::LimitReached,
        NoticeStatus::Edited,
        NoticeStatus::Done,
        NoticeStatus::TimedOut,
        NoticeStatus::Parked,
        NoticeStatus::Delivered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NoticeStatus::Rejected => "rejected",
            NoticeStatus::Expired => "expired",
            NoticeStatus::Invalid => "invalid",
            NoticeStatus::Failed => "failed",
            NoticeStatus::Uncertain => "uncertain",
            NoticeStatus::LimitReached => "limit_reached",
            NoticeStatus::Edited => "edited",
            NoticeStatus::Done => "done",
            NoticeStatus::TimedOut => "timed_out",
            NoticeStatus::Parked => "parked",
            NoticeStatus::Delivered => "delivered",
        }
    }
}

impl std::fmt::Display for NoticeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a notice tells the agent about one of its entries: built where the
/// outcome is known, and written (with the entry it is about) by the outbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Notice {
    pub status: NoticeStatus,
    pub reason: String,
    pub approval_id: Option<String>,
    pub request_id: Option<String>,
    pub approver: Option<String>,
    /// A declared action's exit code and the tail of its output.
    pub exit_code: Option<String>,
    pub output: Option<String>,
    /// On `edited`: the digest of the agent's version and of the one sent.
    pub original_sha256: Option<String>,
    pub sent_sha256: Option<String>,
    /// On `delivered`: the platform's id of what was sent.
    pub external_id: Option<String>,
    /// On `parked`: when it was parked and its deadline (unix seconds; 0 =
    /// none), and how many approvals it needs.
    pub parked_at: Option<String>,
    pub expires_at: Option<String>,
    pub quorum: Option<String>,
    /// On `parked` under a quorum: approvals counted so far.
    pub approvals: Option<String>,
}

impl Notice {
    pub fn new(status: NoticeStatus, reason: impl Into<String>) -> Notice {
        Notice {
            status,
            reason: reason.into(),
            ..Notice::default()
        }
    }

    /// A declared action's run, as it reported itself.
    pub fn ran(report: crate::bridge::Report) -> Notice {
        Notice {
            exit_code: report.exit_code.map(|c| c.to_string()),
            output: Some(report.output),
            ..Notice::new(report.status, report.reason)
        }
    }

    /// `parked`: waiting for approval, with its deadline and quorum, and the
    /// count so far (`approvals`) when one was just counted short of it.
    pub fn parked(record: &crate::approval::Record, count: Option<(usize, usize)>) -> Notice {
        let reason = match count {
            Some((have, need)) => format!("waiting for approval: {have} of {need} so far"),
            None => "waiting for approval".to_string(),
        };
        Notice {
            parked_at: Some(record.created_at.to_string()),
            expires_at: Some(record.expires_at.to_string()),
            quorum: Some(record.quorum().to_string()),
            approvals: count.map(|(have, _)| have.to_string()),
            ..Notice::new(NoticeStatus::Parked, reason)
                .approval(&record.id)
                .request(record.request_id.as_deref())
        }
    }

    pub fn approval(mut self, id: &str) -> Notice {
        self.approval_id = Some(id.to_string());
        self
    }

    /// The agent's `request_id`, when it gave one.
    pub fn request(mut self, id: Option<&str>) -> Notice {
        self.request_id = id.map(str::to_string);
        self
    }

    pub fn approver(mut self, who: &str) -> Notice {
        self.approver = Some(who.to_string());
        self
    }

    /// The inbox entry's fields (`kind = notice` tells them from inbound
    /// messages), about entry `entry_id` of `stream`.
    pub fn fields<'a>(&'a self, stream: &'a str, entry_id: &'a str) -> Vec<(&'a str, &'a [u8])> {
        let mut f: Vec<(&str, &[u8])> = vec![
            ("kind", b"notice"),
            ("status", self.status.as_str().as_bytes()),
            ("stream", stream.as_bytes()),
            ("entry_id", entry_id.as_bytes()),
            ("reason", self.reason.as_bytes()),
        ];
        for (name, value) in [
            ("approval_id", &self.approval_id),
            ("request_id", &self.request_id),
            ("approver", &self.approver),
            ("exit_code", &self.exit_code),
            ("output", &self.output),
            ("original_sha256", &self.original_sha256),
            ("sent_sha256", &self.sent_sha256),
            ("external_id", &self.external_id),
            ("parked_at", &self.parked_at),
            ("expires_at", &self.expires_at),
            ("quorum", &self.quorum),
            ("approvals", &self.approvals),
        ] {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                f.push((name, v.as_bytes()));
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every notice status is one the protocol's documentation lists.
    #[test]
    fn notice_statuses_are_the_documented_ones() {
        let doc = include_str!("../../docs/protocol.md");
        let notices = doc
            .split("### Notices")
            .nth(1)
            .and_then(|rest| rest.split("###").next())
            .unwrap();
        for status in NoticeStatus::ALL {
            assert!(
                notices.contains(&format!("`{status}`")),
                "`{status}` is not in docs/protocol.md's Notices"
            );
        }
    }

    fn bridge() -> BridgeConfig {
        let c = Config::parse(
            "[bridges.c]\ntype = \"console\"\ndestinations = [\"ok\"]\nmax_content_bytes = 10\n",
        )
        .unwrap();
        c.bridges["c"].clone()
    }

    fn entry(fields: &[(&str, &[u8])]) -> Entry {
        Entry {
            id: "1-0".into(),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        }
    }

    type Case<'a> = (&'a [(&'a str, &'a [u8])], &'a str);

    #[test]
    fn every_kind_of_invalid_entry_has_a_reason() {
        let b = bridge();
        let cases: &[Case] = &[
            (&[("content", b"hi")], "missing field `channel_id`"),
            (&[("channel_id", b"ok")], "missing field `content`"),
            (
                &[("channel_id", b"ok"), ("content", b"\xff")],
                "not valid UTF-8",
            ),
            (
                &[("channel_id", b"ok"), ("content", b"01234567890")],
                "over the limit",
            ),
            (&[("channel_id", b"no"), ("content", b"hi")], "allow-list"),
            (
                &[
                    ("channel_id", b"ok"),
                    ("content", b"hi"),
                    ("approval_id", b"x"),
                ],
                "reserved",
            ),
            (
                &[("channel_id", b"ok"), ("content", b"hi"), ("colour", b"x")],
                "unknown field",
            ),
            (
                &[
                    ("channel_id", b"ok"),
                    ("content", b"hi"),
                    ("subject", b"a\nb"),
                ],
                "subject contains control characters",
            ),
            (
                &[
                    ("channel_id", b"ok"),
                    ("content", b"hi"),
                    ("reply_to", &[b'x'; 999]),
                ],
                "reply_to is 999 bytes",
            ),
            (
                &[
                    ("channel_id", b"ok"),
                    ("content", b"hi"),
                    ("approval_content", b"x"),
                ],
                "reserved",
            ),
        ];
        for (fields, want) in cases {
            let err = Message::from_entry(&entry(fields), &b).unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        }
        let ok = Message::from_entry(&entry(&[("channel_id", b"ok"), ("content", b"hi")]), &b);
        assert_eq!(ok.unwrap().content, "hi");
    }

    /// The digest binds every field the sender uses, not only the content.
    #[test]
    fn the_digest_covers_the_whole_message() {
        let m = Message {
            channel_id: "ok".into(),
            content: "hi".into(),
            ..Message::default()
        };
        let with = |f: &dyn Fn(&mut Message)| {
            let mut n = m.clone();
            f(&mut n);
            n.sha256()
        };
        let base = m.sha256();
        assert_ne!(base, with(&|n| n.subject = Some("URGENT".into())));
        assert_ne!(base, with(&|n| n.reply_to = Some("x@y".into())));
        assert_ne!(base, with(&|n| n.channel_id = "other".into()));
        assert_ne!(base, with(&|n| n.content = "hi!".into()));
        assert_eq!(base, with(&|n| n.request_id = Some("r".into())));
    }
}
