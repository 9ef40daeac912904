//! Outbox entries as agents write them, their validation, and the notices the
//! broker writes back to an agent's inbox.
//!
//! Validation is pure: an [`Entry`] either becomes a [`Message`] or a reason
//! that goes to the dead letter and into a notice. Nothing here touches Redis.

use crate::config::BridgeConfig;
use crate::store::Entry;

/// Fields an agent may write.
pub const AGENT_FIELDS: &[&str] = &["channel_id", "content", "subject", "reply_to", "request_id"];

/// Fields only the broker writes, on approval notifications in a flat outbox.
pub const NOTIFICATION_FIELDS: &[&str] = &[
    "approval_id",
    "approval_source",
    "approval_agent",
    "approval_channel",
    "approval_sha256",
    "approval_expires_at",
    "approval_bytes",
    "approval_content",
];

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
}

impl Message {
    /// Parses and validates an entry. `notification` allows the broker's fields.
    pub fn from_entry(
        entry: &Entry,
        bridge: &BridgeConfig,
        notification: bool,
    ) -> Result<Message, String> {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &entry.fields {
            let known = AGENT_FIELDS.contains(&name.as_str())
                || (notification && NOTIFICATION_FIELDS.contains(&name.as_str()));
            if name == "approval_id" && !notification {
                return Err("field `approval_id` is reserved for the broker".into());
            }
            if !known {
                return Err(format!("unknown field `{name}`"));
            }
            if !seen.insert(name.as_str()) {
                return Err(format!("field `{name}` appears twice"));
            }
        }
        let text = |name: &str| -> Result<Option<String>, String> {
            match entry.get(name) {
                None => Ok(None),
                Some(bytes) => std::str::from_utf8(bytes)
                    .map(|s| Some(s.to_string()))
                    .map_err(|_| format!("field `{name}` is not valid UTF-8")),
            }
        };
        let channel_id = text("channel_id")?
            .filter(|c| !c.trim().is_empty())
            .ok_or("missing field `channel_id`")?;
        let content = text("content")?.ok_or("missing field `content`")?;
        // Notifications are rendered by the broker and may legitimately be larger.
        if !notification && content.len() > bridge.max_content_bytes {
            return Err(format!(
                "content is {} bytes, over the limit of {}",
                content.len(),
                bridge.max_content_bytes
            ));
        }
        if !notification && !bridge.allows_destination(&channel_id) {
            return Err(format!(
                "destination `{channel_id}` is not on this bridge's `destinations` allow-list"
            ));
        }
        Ok(Message {
            channel_id,
            content,
            subject: text("subject")?.filter(|s| !s.is_empty()),
            reply_to: text("reply_to")?.filter(|s| !s.is_empty()),
            request_id: text("request_id")?,
            approval_id: text("approval_id")?,
            approval_content: text("approval_content")?,
        })
    }
}

/// What a notice tells the agent about one of its entries.
#[derive(Debug, Clone, Default)]
pub struct Notice<'a> {
    /// `rejected`, `expired`, `invalid`, `failed` or `uncertain`.
    pub status: &'a str,
    pub stream: &'a str,
    pub entry_id: &'a str,
    pub approval_id: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub reason: &'a str,
    pub approver: Option<&'a str>,
}

impl Notice<'_> {
    /// The inbox entry's fields (`kind = notice` tells them from inbound messages).
    pub fn fields(&self) -> Vec<(&str, &[u8])> {
        let mut f: Vec<(&str, &[u8])> = vec![
            ("kind", b"notice"),
            ("status", self.status.as_bytes()),
            ("stream", self.stream.as_bytes()),
            ("entry_id", self.entry_id.as_bytes()),
            ("reason", self.reason.as_bytes()),
        ];
        for (name, value) in [
            ("approval_id", self.approval_id),
            ("request_id", self.request_id),
            ("approver", self.approver),
        ] {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
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
        ];
        for (fields, want) in cases {
            let err = Message::from_entry(&entry(fields), &b, false).unwrap_err();
            assert!(err.contains(want), "{err} lacks {want}");
        }
        let ok = Message::from_entry(
            &entry(&[("channel_id", b"ok"), ("content", b"hi")]),
            &b,
            false,
        );
        assert_eq!(ok.unwrap().content, "hi");
    }
}
