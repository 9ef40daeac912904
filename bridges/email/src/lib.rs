//! `email`: delivers agent messages over SMTP, ingests mail over IMAP IDLE, and
//! lets approvers decide by replying to the approval email.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (`from`, `smtp`, `imap`, anti-spoofing).
//! - [`send`]: the [`broker::Sender`] over SMTP and the approval email.
//! - [`ingest`]: the IMAP follower, answers and inbound mail.
//! - [`verdict`]: pure logic: verdicts, `Authentication-Results`, Message-IDs.

pub mod authres;
pub mod config;
pub mod dkim;
pub mod ingest;
pub mod send;
pub mod verdict;

use std::sync::Arc;

use broker::config::Service;
use broker::ingest::Ingest;
use broker::ping::PingService;
use broker::{Config, OutboxService, Result, Shutdown, Store};

use crate::config::EmailSettings;
use crate::send::EmailSender;

/// The bridge type this crate serves.
pub const TYPE: &str = "email";

/// The bridge's settings, validated.
pub fn settings(config: &Config, name: &str) -> Result<EmailSettings> {
    let s: EmailSettings = config.bridge(name)?.settings(name)?;
    s.validate(name)?;
    Ok(s)
}

/// Runs the outbox service of email bridge `name`.
pub async fn run_outbox(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let sender = EmailSender::new(settings(&config, &name)?, &name)?;
    let store = Store::connect(&config.redis_for(&name, Service::Outbox)).await?;
    OutboxService::new(config, &name, sender, store, shutdown)?
        .run()
        .await
}

/// Runs the ingest of email bridge `name`.
pub async fn run_ingest(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let reply = EmailSender::new(s.clone(), &name)?;
    let store = Store::connect(&config.redis_for(&name, Service::Ingest)).await?;
    let ingest = Ingest::new(config, &name, store)?;
    let verifier = match s.verify {
        Some(config::Verify::Dkim) => {
            let resolver = s.resolver.as_deref().and_then(|r| r.parse().ok());
            Some(dkim::Verifier::new(resolver).map_err(|e| {
                broker::Error::Config(broker::error::ConfigError::Invalid {
                    key: format!("bridges.{name}.resolver"),
                    message: e,
                })
            })?)
        }
        None => None,
    };
    ingest::EmailIngest {
        ingest,
        settings: s,
        bridge: name,
        reply,
        verifier,
    }
    .run(shutdown)
    .await
}

/// Runs the ping service of email bridge `name`, with SMTP and IMAP checks in its heartbeat.
pub async fn run_ping(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let smtp = Arc::new(EmailSender::new(s.clone(), &name)?);
    let store = Store::connect(&config.redis_for(&name, Service::Ping)).await?;
    let bridge = name.clone();
    let probe: broker::ping::Probe = Box::new(move || {
        let smtp = smtp.clone();
        let imap = s.imap.clone();
        let bridge = bridge.clone();
        Box::pin(async move {
            smtp.check().await?;
            ingest::check(&imap, &bridge).await
        })
    });
    PingService::new(config, &name, store, shutdown)?
        .with_probe(probe)
        .run()
        .await
}
