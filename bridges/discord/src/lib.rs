//! `discord`: delivers agent messages to Discord channels, carries inbound
//! messages to the inbox, and is an approval surface: a card per approval,
//! decided by a reaction or a reply.
//!
//! # Layout
//!
//! - [`config`]: the bridge's own keys (`token_file`, `channels`, emoji, endpoints).
//! - [`render`]: pure logic: splitting, nonces, the card, verdicts.
//! - [`send`]: the [`broker::Sender`] over Discord's REST API.
//! - [`ingest`]: the gateway event handler.

pub mod config;
pub mod ingest;
pub mod render;
pub mod send;

use std::sync::Arc;

use broker::config::{read_secret, Service};
use broker::ingest::Ingest;
use broker::ping::PingService;
use broker::{Config, Error, OutboxService, Result, Shutdown, Store};
use serenity::http::{Http, HttpBuilder};

use crate::config::DiscordSettings;
use crate::send::DiscordSender;

/// The bridge type this crate serves.
pub const TYPE: &str = "discord";

/// The bridge's settings, validated.
pub fn settings(config: &Config, name: &str) -> Result<DiscordSettings> {
    let s: DiscordSettings = config.bridge(name)?.settings(name)?;
    s.validate(name)?;
    Ok(s)
}

fn token(s: &DiscordSettings, name: &str) -> Result<String> {
    Ok(read_secret(
        &format!("bridges.{name}.token_file"),
        &s.token_file,
    )?)
}

/// The REST client: discord.com, or `api_base` with the client-side rate limiter
/// off (serenity 0.12.5's limiter would otherwise still call discord.com).
pub fn http(s: &DiscordSettings, token: &str) -> Http {
    let mut builder = HttpBuilder::new(token);
    if let Some(base) = &s.api_base {
        builder = builder.proxy(base.clone()).ratelimiter_disabled(true);
    }
    builder.build()
}

/// Runs the outbox service of Discord bridge `name`.
pub async fn run_outbox(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let sender = DiscordSender {
        http: Arc::new(http(&s, &token(&s, &name)?)),
        mentions: s.mentions.clone(),
    };
    let store = Store::connect(&config.redis_for(&name, Service::Outbox)).await?;
    OutboxService::new(config, &name, sender, store, shutdown)?
        .run()
        .await
}

/// Runs the ingest (gateway connection) of Discord bridge `name`.
pub async fn run_ingest(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let http = http(&s, &token(&s, &name)?);
    let store = Store::connect(&config.redis_for(&name, Service::Ingest)).await?;
    let beat_store = store.clone();
    let handler = ingest::Handler::new(Ingest::new(config, &name, store)?, s.clone());
    let client = serenity::client::ClientBuilder::new_with_http(http, ingest::intents(s.dms))
        .event_handler(handler)
        .await
        .map_err(|e| Error::Request(format!("Discord client: {e}")))?;
    if let Some(url) = &s.gateway_url {
        *client.ws_url.lock().await = url.clone();
    }
    ingest::run(client, beat_store, name, shutdown).await
}

/// Runs the ping service of Discord bridge `name`, with `users/@me` in its heartbeat.
pub async fn run_ping(config: Arc<Config>, name: String, shutdown: Shutdown) -> Result<()> {
    let s = settings(&config, &name)?;
    let sender = Arc::new(DiscordSender {
        http: Arc::new(http(&s, &token(&s, &name)?)),
        mentions: Vec::new(),
    });
    let store = Store::connect(&config.redis_for(&name, Service::Ping)).await?;
    let probe: broker::ping::Probe = Box::new(move || {
        let sender = sender.clone();
        Box::pin(async move { sender.check().await })
    });
    PingService::new(config, &name, store, shutdown)?
        .with_probe(probe)
        .run()
        .await
}
