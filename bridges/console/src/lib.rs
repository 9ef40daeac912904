//! `console`: a local bridge for demos and tests, with no accounts anywhere.
//!
//! Delivery appends JSON lines to the `output` file ([`send`]); the ingest follows
//! the `input` file for messages and reactions ([`ingest`]). Everything else
//! (groups, parking, approvals, notices, pings) is the broker's.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (`output`, `input`).
//! - [`send`]: the [`broker::Sender`] that writes the output file.
//! - [`ingest`]: the input-file follower.

pub mod config;
pub mod ingest;
pub mod send;

use broker::bridge::Bridge;
use broker::ingest::Ingest;
use broker::{Config, Result, Shutdown};

use crate::config::ConsoleSettings;
use crate::send::ConsoleSender;

/// A console bridge: its validated settings.
pub struct Console {
    settings: ConsoleSettings,
}

impl Bridge for Console {
    const TYPE: &'static str = "console";
    type Sender = ConsoleSender;

    fn load(config: &Config, name: &str) -> Result<Self> {
        Ok(Console {
            settings: config.bridge(name)?.settings(name)?,
        })
    }

    fn sender(&self, _name: &str) -> Result<ConsoleSender> {
        let latency = std::time::Duration::from_millis(self.settings.latency_ms);
        Ok(
            ConsoleSender::with_latency(self.settings.output.clone(), latency)
                .losing_replies(self.settings.lose_replies)
                .with_reply_latency(std::time::Duration::from_millis(
                    self.settings.reply_latency_ms,
                )),
        )
    }

    async fn ingest(self, ingest: Ingest, shutdown: Shutdown) -> Result<()> {
        ingest::follow(ingest, self.settings.input, shutdown).await
    }
}
