//! Retention: the streams a bridge writes and reads do not grow forever.
//!
//! Invariants:
//! - Nothing a group still needs is cut: `XTRIM MINID` is never above the oldest
//!   entry pending in any group of the stream, nor above the last entry a group
//!   was handed (an unread backlog stays, however old). A parked entry is pending,
//!   so it is never trimmed away under its approval.
//! - Outbox streams and inboxes keep `retention_seconds` of history beyond that;
//!   dead letters keep `dead_letter_retention_seconds`. 0 keeps everything.
//! - An inbox is cut only below what every agent group on it has read (the ping
//!   group does not count: it reads everything at once); an inbox no agent group
//!   reads is not cut, since an agent may be following it with `XREAD`.
//! - Stream ids are millisecond timestamps, so "older than" is a comparison of ids.
//! - Every worker of a bridge may trim: cutting the same stream twice is harmless.

use super::*;

impl<S: Sender> OutboxService<S> {
    /// Trims this bridge's outbox streams, inboxes and dead letters, and the
    /// in-flight marks nothing can use any more.
    pub(super) async fn retain(&mut self) -> Result<()> {
        self.trim_marks().await?;
        let now_ms = self.clock.now_millis();
        let keep = self.bridge.retention_seconds;
        if keep > 0 {
            let cut = (now_ms.saturating_sub(keep * 1000), 0);
            let outboxes: Vec<String> = self
                .sources
                .iter()
                .filter(|s| s.kind != Kind::Decisions)
                .map(|s| s.key.clone())
                .collect();
            for key in outboxes {
                self.trim_read(&key, cut, None).await?;
            }
            let ping = keys::ping_group(&self.name);
            let mut inboxes = vec![keys::inbox(&self.name)];
            inboxes.extend(
                self.config
                    .agent_names()
                    .map(|a| keys::agent_inbox(a, &self.name)),
            );
            for key in inboxes {
                self.trim_read(&key, cut, Some(&ping)).await?;
            }
        }
        let keep_dead = self.bridge.dead_letter_retention_seconds;
        if keep_dead > 0 {
            let cut = (now_ms.saturating_sub(keep_dead * 1000), 0);
            self.trim(&keys::dead(&self.name), cut).await?;
        }
        Ok(())
    }

    /// Cuts `stream` below `cut`, and below what its groups (but `skip`) still
    /// need. A stream no such group reads is kept whole.
    async fn trim_read(&mut self, stream: &str, cut: (u64, u64), skip: Option<&str>) -> Result<()> {
        let groups = self.store.groups(stream).await?;
        let readers: Vec<_> = groups
            .into_iter()
            .filter(|g| Some(g.name.as_str()) != skip)
            .collect();
        if readers.is_empty() {
            return Ok(());
        }
        let mut below = cut;
        for g in &readers {
            // An unparsable id: keep everything rather than guess.
            let handed = parking::stream_id(&g.last_delivered).unwrap_or((0, 0));
            below = below.min(handed);
            if g.pending > 0 {
                if let Some(oldest) = self.store.oldest_pending(stream, &g.name).await? {
                    below = below.min(parking::stream_id(&oldest).unwrap_or((0, 0)));
                }
            }
        }
        self.trim(stream, below).await
    }

    async fn trim(&mut self, stream: &str, below: (u64, u64)) -> Result<()> {
        if below == (0, 0) {
            return Ok(());
        }
        let minid = format!("{}-{}", below.0, below.1);
        let cut: u64 = redis::cmd("XTRIM")
            .arg(stream)
            .arg("MINID")
            .arg(&minid)
            .query_async(&mut self.store.conn)
            .await
            .map_err(|e| Error::from_redis(&format!("XTRIM {stream}"), e))?;
        if cut > 0 {
            tracing::debug!(stream, minid, cut, "history trimmed");
        }
        Ok(())
    }
}
