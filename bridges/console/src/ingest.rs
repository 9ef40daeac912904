//! Ingest: follows the `input` file and turns each new line into an inbox entry
//! or an answer to a notification.
//!
//! Invariants: the byte offset of the last handled line is kept in Redis
//! (`{bridge}:ingest:cursor`) and advanced after each line, so a restart neither
//! re-reads handled lines nor skips unread ones; a partial last line waits until
//! its newline arrives; a file that shrank was replaced and is read from its start.
//! A line that cannot be understood is logged and skipped, never fatal.
//! The file is followed by notification (inotify on its directory), so a
//! reaction is read the moment it is written; a slow re-check every second
//! covers filesystems that send no events, and without a watcher the file is
//! polled every 100 ms. A change that lands while lines are being handled
//! leaves its signal waiting, so none is missed.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use broker::approval::Verdict;
use broker::ingest::Ingest;
use broker::{Result, Shutdown};
use serde::Deserialize;

/// How often the input file is checked for new lines when it cannot be watched.
const POLL: Duration = Duration::from_millis(100);
/// How often a watched input file is checked anyway.
const RECHECK: Duration = Duration::from_secs(1);

/// One line of the input file.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Line {
    /// Someone wrote in a channel.
    Message {
        channel_id: String,
        author: String,
        content: String,
        #[serde(default)]
        message_id: Option<String>,
        /// Deliver to this configured agent's inbox instead of the flat one.
        #[serde(default)]
        agent: Option<String>,
        #[serde(default)]
        reply_to: Option<String>,
    },
    /// Someone reacted to a delivered message (`message_id` is its external id).
    Reaction {
        message_id: String,
        emoji: String,
        user: String,
        #[serde(default)]
        reason: Option<String>,
    },
}

/// What an emoji means for an approval, skin tones and presentation selectors ignored.
pub fn verdict_of(emoji: &str) -> Option<Verdict> {
    match broker::approval::normalize_emoji(emoji).as_str() {
        "✅" | "✔" | "👍" => Some(Verdict::Approved),
        "❌" | "✖" | "👎" => Some(Verdict::Rejected),
        _ => None,
    }
}

/// Follows the input file until shutdown.
pub async fn follow(mut ingest: Ingest, input: PathBuf, shutdown: Shutdown) -> Result<()> {
    let mut offset: u64 = match ingest.cursor().await? {
        None => 0,
        // Never read from the start again because of a bad cursor: that
        // would carry every line twice.
        Some(c) => c.parse().map_err(|_| {
            broker::Error::internal(format!(
                "the saved input offset {c:?} is not a number; delete {} to read the file from the start",
                broker::keys::ingest_cursor(ingest.name())
            ))
        })?,
    };
    let watched = watch(&input);
    if watched.is_none() {
        tracing::warn!(input = %input.display(), "the input file cannot be watched; polling it every 100 ms");
    }
    let (_watcher, mut changed) = match watched {
        Some((w, rx)) => (Some(w), Some(rx)),
        None => (None, None),
    };
    tracing::info!(input = %input.display(), offset, "console ingest following");
    broker::systemd::ready();
    loop {
        ingest.tick().await?;
        let (lines, len) = read_new_lines(&input, offset)?;
        if len < offset && !lines.is_empty() {
            tracing::warn!("input file shrank; reading it from the start");
        }
        for (line, end) in lines {
            handle_line(&mut ingest, &line).await?;
            offset = end;
            ingest.save_cursor(&offset.to_string()).await?;
        }
        let changed = async {
            match changed.as_mut() {
                Some(rx) => {
                    let _ = tokio::time::timeout(RECHECK, rx.recv()).await;
                }
                None => tokio::time::sleep(POLL).await,
            }
        };
        tokio::select! {
            _ = shutdown.wait() => return Ok(()),
            _ = changed => {}
        }
    }
}

/// Watches the input file's directory (the file may not exist yet, or be
/// replaced); each change to the file leaves one signal in the channel.
fn watch(input: &Path) -> Option<(notify::RecommendedWatcher, tokio::sync::mpsc::Receiver<()>)> {
    use notify::Watcher;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let name = input.file_name()?.to_owned();
    // Other files in the directory (the outbox's output, say) wake nothing,
    // and neither do opens, reads, closes and attribute changes: this loop's
    // own reads cause those, and waking on them kept an idle ingest busy
    // reading its file thousands of times a second.
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        use notify::event::{EventKind, ModifyKind};
        let ours = match event {
            Ok(e) => {
                let changes = match e.kind {
                    EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(_)) => false,
                    EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
                    EventKind::Any | EventKind::Other => true,
                };
                changes
                    && e.paths
                        .iter()
                        .any(|p| p.file_name() == Some(name.as_os_str()))
            }
            Err(_) => true,
        };
        if ours {
            let _ = tx.try_send(());
        }
    })
    .ok()?;
    let dir = match input.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .ok()?;
    Some((watcher, rx))
}

/// Complete lines after `offset` with the offset just past each; the second value
/// is the file's length (smaller than `offset` when the file was replaced).
fn read_new_lines(path: &std::path::Path, offset: u64) -> Result<(Vec<(String, u64)>, u64)> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(e.into()),
    };
    let len = file.metadata()?.len();
    let start = if len < offset { 0 } else { offset };
    if len == start {
        return Ok((Vec::new(), len));
    }
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    let mut lines = Vec::new();
    let mut pos = 0usize;
    while let Some(nl) = buf[pos..].iter().position(|b| *b == b'\n') {
        let raw = &buf[pos..pos + nl];
        pos += nl + 1;
        lines.push((
            String::from_utf8_lossy(raw).into_owned(),
            start + pos as u64,
        ));
    }
    Ok((lines, len))
}

async fn handle_line(ingest: &mut Ingest, text: &str) -> Result<()> {
    if text.trim().is_empty() {
        return Ok(());
    }
    let line: Line = match serde_json::from_str(text) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, line = text, "input line skipped");
            return Ok(());
        }
    };
    match line {
        Line::Message {
            channel_id,
            author,
            content,
            message_id,
            agent,
            reply_to,
        } => {
            let now = broker::now_secs().to_string();
            let mut fields: Vec<(&str, &[u8])> = vec![
                ("channel_id", channel_id.as_bytes()),
                ("author", author.as_bytes()),
                ("content", content.as_bytes()),
                ("timestamp", now.as_bytes()),
            ];
            if let Some(id) = &message_id {
                fields.push(("message_id", id.as_bytes()));
            }
            if let Some(r) = &reply_to {
                fields.push(("reply_to", r.as_bytes()));
            }
            ingest.inbound(agent.as_deref(), &fields).await?;
        }
        Line::Reaction {
            message_id,
            emoji,
            user,
            reason,
        } => match verdict_of(&emoji) {
            None if broker::approval::is_later_emoji(&emoji) => {
                let reason = reason.as_deref().unwrap_or("");
                ingest.snooze(&message_id, &user, None, reason).await?;
            }
            Some(verdict) => {
                ingest
                    .answer(&message_id, verdict, &user, reason.as_deref().unwrap_or(""))
                    .await?;
            }
            None => tracing::debug!(emoji, "reaction without meaning ignored"),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emoji_variants_normalise() {
        assert_eq!(verdict_of("✅"), Some(Verdict::Approved));
        assert_eq!(verdict_of("👍🏽"), Some(Verdict::Approved));
        assert_eq!(verdict_of("✔\u{FE0F}"), Some(Verdict::Approved));
        assert_eq!(verdict_of("❌"), Some(Verdict::Rejected));
        assert_eq!(verdict_of("🎉"), None);
    }

    #[test]
    fn partial_lines_wait_for_their_newline() {
        let dir = std::env::temp_dir().join(format!("cowboy-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("in.jsonl");
        std::fs::write(&path, "one\ntw").unwrap();
        let (lines, len) = read_new_lines(&path, 0).unwrap();
        assert_eq!(lines, vec![("one".to_string(), 4)]);
        assert_eq!(len, 6);
        let (lines, _) = read_new_lines(&path, 4).unwrap();
        assert!(lines.is_empty());
        std::fs::write(&path, "x\n").unwrap();
        let (lines, len) = read_new_lines(&path, 4).unwrap();
        assert_eq!((lines, len), (vec![("x".to_string(), 2)], 2));
    }
}
