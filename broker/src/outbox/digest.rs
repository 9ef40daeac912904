//! The digest: once a period (`approval.digest`, at the turn of each hour or
//! day, UTC), while anything waits on this bridge, a summary of what waits,
//! oldest first, goes out as a message through `approval.digest_to`.
//!
//! Invariants:
//! - One digest per period whatever the number of workers or restarts: the
//!   worker that sets `{bridge}:digest:{n}` (once, with a time to live) sends
//!   it; a worker sends only for a period that began while it ran, never for
//!   the one it started in.
//! - Nothing waiting, no digest.
//! - It is built from the records (the frame's fields, each value made safe
//!   and cut), never from the agent's entries: no content, only who, where,
//!   what about, since when and until when, with the page's link when
//!   `[web] public_url` is set.

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
        let total = Approvals::on(&mut self.store)
            .pending_count(&self.name)
            .await?;
        if total == 0 {
            return Ok(());
        }
        let key = keys::digest_sent(&self.name, n);
        let first: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&self.worker)
            .arg("NX")
            .arg("EX")
            .arg(every * 2)
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("SET {key}"), e))?;
        if first.is_none() {
            return Ok(()); // another worker sent it
        }
        let ids = Approvals::on(&mut self.store)
            .pending_oldest(&self.name, LISTED)
            .await?;
        let records: Vec<Record> = Approvals::on(&mut self.store)
            .load_many(&ids)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let link = self
            .config
            .web
            .as_ref()
            .and_then(|w| w.public_url.as_deref());
        let content = render(&self.name, &records, total, link);
        let Some(to) = self.config.digest_bridge(&self.name) else {
            return Ok(());
        };
        let subject = format!("{total} approval(s) waiting on {}", self.name);
        let channel = self.bridge.approval.digest_channel.clone();
        let fields: Vec<(&str, &[u8])> = vec![
            ("channel_id", channel.as_bytes()),
            ("subject", subject.as_bytes()),
            ("content", content.as_bytes()),
        ];
        match self.store.xadd(&keys::outbox(to), &fields).await {
            Ok(_) => {
                tracing::info!(bridge = %self.name, waiting = total, through = to, "digest sent")
            }
            Err(Error::Redis(e)) if refused_by_stream(&e) => {
                tracing::warn!(error = %e, "digest not written");
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// The digest's text: one line per approval, oldest first.
fn render(bridge: &str, records: &[Record], total: usize, link: Option<&str>) -> String {
    let cut = |v: &str| -> String {
        let safe = approval::display_safe(v);
        match safe.chars().count() > VALUE_CHARS {
            true => format!("{}…", safe.chars().take(VALUE_CHARS).collect::<String>()),
            false => safe,
        }
    };
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
            cut(&r.channel_id),
            r.subject
                .as_deref()
                .map(cut)
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
