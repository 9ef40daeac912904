//! Delivery: one JSON line per message appended to the `output` file.
//!
//! The external id is derived from the delivery key, so it is unique per stream
//! entry and the same on a retry; on a retry the file is searched first, which
//! makes a repeated delivery after a crash impossible.
//!
//! The file is opened once and kept (append mode: each line is one write, so it
//! lands whole); after a failed write it is opened afresh for the next delivery.

use std::io::Write;
use std::path::PathBuf;

use broker::bridge::{Outgoing, SendError, Sender, Sent};
use serde::{Deserialize, Serialize};

/// One delivered message, as written to the output file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delivered {
    pub external_id: String,
    pub channel_id: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// Appends to a file.
pub struct ConsoleSender {
    output: PathBuf,
    /// The open output file, opened on the first delivery.
    file: tokio::sync::Mutex<Option<std::fs::File>>,
    latency: std::time::Duration,
    /// Waited after the write, before the delivery is reported.
    reply_latency: std::time::Duration,
    /// Deliveries still to lose (see `lose_replies` in the settings).
    lose: std::sync::atomic::AtomicU64,
}

impl ConsoleSender {
    pub fn new(output: PathBuf) -> Self {
        Self::with_latency(output, std::time::Duration::ZERO)
    }

    /// A sender whose every delivery first waits `latency` (outside the file lock,
    /// so deliveries side by side overlap their waits as real round trips would).
    pub fn with_latency(output: PathBuf, latency: std::time::Duration) -> Self {
        ConsoleSender {
            output,
            file: tokio::sync::Mutex::new(None),
            latency,
            reply_latency: std::time::Duration::ZERO,
            lose: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Every delivery is reported `latency` after its line is written.
    pub fn with_reply_latency(mut self, latency: std::time::Duration) -> Self {
        self.reply_latency = latency;
        self
    }

    /// The first `n` deliveries are not written and end uncertain.
    pub fn losing_replies(self, n: u64) -> Self {
        self.lose.store(n, std::sync::atomic::Ordering::SeqCst);
        self
    }
}

/// The external id of a delivery key.
pub fn external_id(delivery_key: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::uuid!("5e0c7d52-3f4b-4a6e-8d2c-0b9e1f7a6c43");
    format!(
        "console-{}",
        uuid::Uuid::new_v5(&NAMESPACE, delivery_key.as_bytes()).simple()
    )
}

impl Sender for ConsoleSender {
    /// One delivery is one line.
    const SPLITS: bool = false;

    async fn send(&self, out: Outgoing<'_>) -> Result<Sent, SendError> {
        let sent = self.deliver(out).await.map(Sent::from);
        if !self.reply_latency.is_zero() {
            tokio::time::sleep(self.reply_latency).await;
        }
        sent
    }

    /// The file is the platform: a line with the delivery's external id proves it.
    async fn delivered_already(&self, out: Outgoing<'_>) -> Option<String> {
        let id = external_id(out.delivery_key);
        matches!(already_written(&self.output, &id), Ok(true)).then_some(id)
    }
}

fn already_written(path: &std::path::Path, id: &str) -> Result<bool, SendError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text
            .lines()
            .any(|l| serde_json::from_str::<Delivered>(l).is_ok_and(|d| d.external_id == id))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(SendError::Transient(format!("{}: {e}", path.display()))),
    }
}

impl ConsoleSender {
    /// One delivery; returns its external id.
    async fn deliver(&self, out: Outgoing<'_>) -> Result<String, SendError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let lose = self
            .lose
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if lose {
            return Err(SendError::Uncertain(
                "no reply from the platform (console lose_replies)".into(),
            ));
        }
        let mut file = self.file.lock().await;
        let id = external_id(out.delivery_key);
        if out.retry && already_written(&self.output, &id)? {
            return Ok(id);
        }
        let m = out.message;
        let line = Delivered {
            external_id: id.clone(),
            channel_id: m.channel_id.clone(),
            content: m.content.clone(),
            subject: m.subject.clone(),
            reply_to: m.reply_to.clone(),
            approval_id: m.approval_id.clone(),
        };
        let mut text =
            serde_json::to_string(&line).map_err(|e| SendError::Permanent(e.to_string()))?;
        text.push('\n');
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.output)
                .map_err(|e| SendError::Transient(format!("{}: {e}", self.output.display())))
        };
        if file.is_none() {
            *file = Some(open()?);
        }
        // One write on an O_APPEND file: the line lands whole or not at all.
        let written = file.as_mut().map(|f| f.write_all(text.as_bytes()));
        if let Some(Err(e)) = written {
            // The next delivery opens the file afresh (it may have been rotated away).
            *file = None;
            return Err(SendError::Uncertain(format!(
                "{}: {e}",
                self.output.display()
            )));
        }
        Ok(id)
    }
}
