//! The digest: once a period (`approval.digest`, at the turn of each hour or
//! day, UTC), while anything waits on this bridge, a summary of what waits,
//! oldest first, goes out through `approval.digest_to` to
//! `approval.digest_channel`.
//!
//! Invariants:
//! - At most one digest per period whatever the number of workers or
//!   restarts: the worker that sets `{bridge}:digest:{n}` (once, with a time
//!   to live) sends it; a worker sends only for a period that began while it
//!   ran, never for the one it started in. Nothing waiting, no digest.
//! - Only the broker's digest reaches the digest channel: the key holds the
//!   sha256 of the digest's fields, and the carrying bridge delivers an entry
//!   naming a digest (`digest_of`) only when it is a digest it carries, to
//!   that bridge's `digest_channel`, with exactly those fields. The channel
//!   is an approval channel, so no agent message goes there.
//! - It is built from the records, never from the agent's entries: no
//!   content, only who, where, what about, since when and until when (the
//!   agent's values cut, made safe, and unable to mention anyone), with the
//!   page's link when `[web] public_url` is set.
//! - A digest is a courtesy, never part of the gate: a failure to send one
//!   is logged and stops nothing.

use super::*;

/// Approvals listed by one digest; the rest are counted.
const LISTED: usize = 50;
/// Characters of a destination or subject a digest line shows.
const VALUE_CHARS: usize = 80;

impl<S: Sender> OutboxService<S> {
    /// The current digest period (its number and length), when the bridge
    /// has a digest.
    fn digest_period(&self) -> Option<(u64, u64)> {
        let every = self.bridge.approval.digest?.seconds();
        Some((self.clock.now_secs() / every, every))
    }

    /// When the next period begins (unix seconds), for the loop's timer.
    pub(super) fn next_digest_at(&self) -> Option<u64> {
        self.digest_period().map(|(n, every)| (n + 1) * every)
    }

    /// Sends the digest of a period that began since the last look.
    pub(super) async fn digest_due(&mut self) -> Result<()> {
        let Some((n, every)) = self.digest_period() else {
            return Ok(());
        };
        let seen = self.mem.digest_period.replace(n);
        if seen.is_none_or(|s| s >= n) {
            return Ok(()); // started in this period, or sent for it already
        }
        match self.send_digest(n, every).await {
            Err(e) if e.is_retriable() => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "digest not sent");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    async fn send_digest(&mut self, n: u64, every: u64) -> Result<()> {
        let Some(to) = self.config.digest_bridge(&self.name).map(str::to_string) else {
            return Ok(());
        };
        let total = Approvals::on(&mut self.store)
            .pending_count(&self.name)
            .await?;
        if total == 0 {
            return Ok(());
        }
        let ids = Approvals::on(&mut self.store)
            .pending_oldest(&self.name, LISTED)
            .await?;
        let now = self.clock.now_secs_f64();
        let mut records: Vec<Record> = Approvals::on(&mut self.store)
            .load_many(&ids)
            .await?
            .into_iter()
            .flatten()
            .filter(|r| !r.is_settled() && r.state(now) == State::Pending)
            .collect();
        // The index orders by the second parked, then by id: within one
        // second, stream order is the true one.
        records.sort_by_key(|r| (r.created_at, super::parking::stream_id(&r.entry_id)));
        if records.is_empty() {
            return Ok(());
        }
        let link = self
            .config
            .web
            .as_ref()
            .and_then(|w| w.public_url.as_deref());
        let content = render(&self.name, &records, total, link);
        let subject = format!("{total} approval(s) waiting on {}", self.name);
        let channel = self.bridge.approval.digest_channel.clone();
        let fields = digest_fields(&channel, &subject, &content);
        let key = keys::digest_sent(&self.name, n);
        let first: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(approval::fields_sha256(
                fields.iter().map(|(k, v)| (*k, Some(v.as_bytes()))),
            ))
            .arg("NX")
            .arg("EX")
            .arg(every * 2)
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("SET {key}"), e))?;
        if first.is_none() {
            return Ok(()); // another worker sent it
        }
        let of = format!("{}:{n}", self.name);
        let mut entry: Vec<(&str, &[u8])> = vec![(crate::fields::outbox::DIGEST_OF, of.as_bytes())];
        entry.extend(fields.iter().map(|(k, v)| (*k, v.as_bytes())));
        self.store.xadd(&keys::outbox(&to), &entry).await?;
        tracing::info!(bridge = %self.name, waiting = total, through = %to, "digest sent");
        Ok(())
    }

    /// A digest entry on this bridge's flat outbox: delivered only when it is
    /// a digest this bridge carries, to its channel, exactly as its requesting
    /// bridge noted it; anything else is dead-lettered.
    pub(super) async fn handle_digest(
        &mut self,
        src: SourceId,
        entry: &Entry,
        retry: bool,
    ) -> Result<()> {
        let text = |k: &str| entry.text(k).unwrap_or("").to_string();
        let (of, channel, subject, content) = (
            text(crate::fields::outbox::DIGEST_OF),
            text("channel_id"),
            text("subject"),
            text("content"),
        );
        let fields = digest_fields(&channel, &subject, &content);
        let named = of
            .rsplit_once(':')
            .and_then(|(bridge, n)| Some((bridge.to_string(), n.parse::<u64>().ok()?)));
        let refusal = match &named {
            _ if entry.fields.len() != fields.len() + 1 => {
                Some("a digest carries digest_of, channel_id, subject and content only".to_string())
            }
            None => Some(format!("`{of}` names no digest")),
            Some((bridge, _)) if self.config.digest_bridge(bridge) != Some(self.name.as_str()) => {
                Some(format!("this bridge carries no digest of `{bridge}`"))
            }
            Some((bridge, n)) => {
                let want = &self.config.bridge(bridge)?.approval.digest_channel;
                let noted: Option<String> = self
                    .store
                    .conn
                    .get(keys::digest_sent(bridge, *n))
                    .await
                    .map_err(|e| Error::from_redis("GET digest", e))?;
                let sha =
                    approval::fields_sha256(fields.iter().map(|(k, v)| (*k, Some(v.as_bytes()))));
                match (channel == *want, noted) {
                    (true, Some(noted)) if approval::same_secret(&noted, &sha) => None,
                    (false, _) => Some(format!("a digest of `{bridge}` goes to `{want}` only")),
                    _ => Some("not the digest its bridge noted (forged or expired)".to_string()),
                }
            }
        };
        if let Some(reason) = refusal {
            tracing::warn!(entry = %entry.id, reason, "digest refused");
            let n = Notice::new(NoticeStatus::Invalid, reason);
            return self.dead_letter(src, entry, n).await;
        }
        let message = Message {
            channel_id: channel,
            subject: Some(subject),
            content,
            ..Message::default()
        };
        self.deliver_and_ack(src, entry.clone(), message, retry, false)
            .await
    }
}

/// A digest's fields besides `digest_of`, in the order they are written.
fn digest_fields<'a>(
    channel: &'a str,
    subject: &'a str,
    content: &'a str,
) -> [(&'static str, &'a str); 3] {
    [
        ("channel_id", channel),
        ("subject", subject),
        ("content", content),
    ]
}

/// An agent's value as a digest shows it: cut, made safe, and unable to
/// mention anyone or form markup on any platform (`@` and angle brackets
/// become look-alikes).
fn inert(v: &str) -> String {
    let safe: String = approval::display_safe(v)
        .chars()
        .map(|c| match c {
            '@' => '＠',
            '<' => '‹',
            '>' => '›',
            c => c,
        })
        .collect();
    match safe.chars().count() > VALUE_CHARS {
        true => format!("{}…", safe.chars().take(VALUE_CHARS).collect::<String>()),
        false => safe,
    }
}

/// The digest's text: one line per approval, oldest first.
fn render(bridge: &str, records: &[Record], total: usize, link: Option<&str>) -> String {
    let mut out = format!("{total} approval(s) wait on bridge {bridge}, oldest first:\n\n");
    for r in records {
        let until = match r.expires_at {
            0 => "never expires".to_string(),
            t => format!("expires {}", crate::clock::utc(t as f64)),
        };
        out.push_str(&format!(
            "- {} since {} ({until}): {} to {}, subject {}\n",
            r.id,
            crate::clock::utc(r.created_at as f64),
            r.agent().unwrap_or("an agent"),
            inert(&r.channel_id),
            r.subject
                .as_deref()
                .map(inert)
                .unwrap_or_else(|| "(none)".into()),
        ));
        if let Some(base) = link {
            out.push_str(&format!(
                "  {}/approval/{}\n",
                base.trim_end_matches('/'),
                r.id
            ));
        }
    }
    if total > records.len() {
        out.push_str(&format!("… and {} more.\n", total - records.len()));
    }
    out.push_str(
        "\nDecide on their cards, with `cowboy approvals review`, or on the approval page.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent's destination or subject cannot mention anyone in a digest.
    #[test]
    fn agent_values_are_inert() {
        assert_eq!(
            inert("@everyone <!channel> <@1>"),
            "＠everyone ‹!channel› ‹＠1›"
        );
        assert_eq!(inert(&"x".repeat(100)).chars().count(), VALUE_CHARS + 1);
    }
}
