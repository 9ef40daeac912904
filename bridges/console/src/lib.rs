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

use std::sync::Arc;

use broker::config::Service;
use broker::ingest::Ingest;
use broker::ping::PingService;
use broker::{Config, OutboxService, Result, Shutdown, Store};

use crate::config::ConsoleSettings;
use crate::send::ConsoleSender;

/// The bridge type this crate serves.
pub const TYPE: &str = "console";

fn settings(config: &Config, name: &str) -> Result<ConsoleSettings> {
    Ok(config.bridge(name)?.settings(name)?)
}

/// Runs the outbox service of console bridge `name`.
pub async fn run_outbox(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let store = Store::connect(&config.redis_for(&name, Service::Outbox)).await?;
    let latency = std::time::Duration::from_millis(s.latency_ms);
    let sender = ConsoleSender::with_latency(s.output, latency);
    OutboxService::new(config, &name, sender, store, shutdown)?
        .run()
        .await
}

/// Runs the ingest of console bridge `name`.
pub async fn run_ingest(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let store = Store::connect(&config.redis_for(&name, Service::Ingest)).await?;
    let ingest = Ingest::new(config, &name, store)?;
    ingest::follow(ingest, s.input, shutdown).await
}

/// Runs the ping service of console bridge `name`.
pub async fn run_ping(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    settings(&config, &name)?;
    let store = Store::connect(&config.redis_for(&name, Service::Ping)).await?;
    PingService::new(config, &name, store, shutdown)?
        .run()
        .await
}
